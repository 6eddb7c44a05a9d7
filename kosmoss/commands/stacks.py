"""``kosmoss stacks``: where every process of a live run is, with identical stacks grouped
and the odd one out named (py-spy).

    kosmoss stacks                          # the newest live run under $KOSMOSS_HOME
    kosmoss stacks 20260101-120000-ab12cd   # a run id (a unique prefix will do) or run dir
    kosmoss stacks --native                 # C/C++ frames too: gloo, NCCL, DDP's reducer
    kosmoss stacks --json --out stacks.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.commandline import command_main
from ..core.errors import RunFailed, UsageError
from ..core.files import atomic_write_text, check_writable

HELP = "the Python stack of every process of a live run, grouped, the odd rank named (py-spy)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", metavar="RUN",
                        help="run id, a unique prefix of one, or a run directory (default: the "
                             "newest live run)")
    parser.add_argument("--native", action="store_true",
                        help="C/C++ frames too (gloo, NCCL, DDP's reducer)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write to FILE (a new file) instead of the terminal")
    parser.set_defaults(command=stacks_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("stacks", help=HELP, description=HELP))


def stacks_command(args: argparse.Namespace) -> None:
    from ..diagnose import runs
    from ..diagnose.stacks import collect, find_py_spy, render_json, render_text

    check_out(args.out)
    find_py_spy()  # before anything is attached to
    result = collect(runs.resolve(args.run), native=args.native, strict=True)
    text = json.dumps(render_json(result), indent=2) + "\n" if args.json else render_text(result)
    if args.out is None:
        sys.stdout.write(text)
        return
    try:
        atomic_write_text(args.out, text)
    except OSError as err:
        sys.stdout.write(text)  # a hung run's stacks may not come again: never lose them
        raise RunFailed(f"--out {args.out}: could not write it ({err.strerror or err}); the "
                        "stacks are printed above instead") from None
    print(f"stacks of run {result.run.run_id} ({len(result.processes)} processes) in {args.out}")


def check_out(out: Path) -> None:
    if out is None:
        return
    if out.exists():
        raise UsageError(f"--out {out}: exists; give a new file name (nothing is overwritten)")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: folder {out.parent} does not exist")
    check_writable(out, "--out", "give a file in another folder")


def main(argv=None) -> int:
    return command_main("kosmoss stacks", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
