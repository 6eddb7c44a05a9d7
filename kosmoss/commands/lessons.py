"""``kosmoss lessons``: copy the course into a working folder and say how to open it."""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from collections import Counter
from pathlib import Path

from ..cli_support import command_main

HELP = "copy the lessons (notebooks, the scripts they run, the documents they cite) into a working folder"
DEFAULT_DEST = Path("kosmoss-lessons")
INSTALL_HINT = 'pip install "kosmoss[lessons]"'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST,
                        help="working folder (default ./%(default)s); files you changed "
                             "there are never replaced")
    parser.set_defaults(command=lessons_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("lessons", help=HELP, description=HELP))


def lessons_command(args: argparse.Namespace) -> None:
    from ..lessons import bundle, copy_lessons, source_root, to_ipynb

    has_jupytext = installed("jupytext")
    files = bundle(source_root(), to_ipynb if has_jupytext else None)
    report = copy_lessons(args.dest, files)
    counts = Counter(item.status for item in report)
    print(f"lessons in {args.dest.resolve()}: " + ", ".join(
        f"{counts[s]} {s}" for s in ("written", "updated", "unchanged", "kept") if counts[s]))
    for item in report:
        if item.status == "kept":
            print(f"  kept {item.name}: you changed it; move it away and run again to get "
                  "the shipped version")
    if not has_jupytext:
        print(f"  no .ipynb written, the .py sources instead: jupytext is missing ({INSTALL_HINT}, "
              "then run again)")
    _print_how_to_open(args.dest)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _print_how_to_open(dest: Path) -> None:
    print("open them:")
    if not installed("jupyterlab"):
        print(f"  {INSTALL_HINT}")
    print(f"  cd {shlex.quote(str(dest))} && jupyter lab")


def main(argv=None) -> int:
    return command_main("kosmoss lessons", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
