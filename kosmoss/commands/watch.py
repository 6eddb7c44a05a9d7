"""``kosmoss watch``: a live per-rank view of a run, stragglers highlighted. Reads the
ranks' heartbeat files, psutil and nvitop; writes nothing into the run.

    kosmoss watch                         # the newest live run, every second; Ctrl-C ends
    kosmoss watch RUN --interval 2        # a run id (a unique prefix will do) or run dir
    kosmoss watch --once                  # one snapshot and exit
    kosmoss watch --once --json           # the same for a script
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from ..core.commandline import command_main
from ..core.errors import UsageError
from ..core.files import json_text

HELP = "per-rank live view of a run: step, samples/s, loss, CPU, memory, GPU; stragglers flagged"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..diagnose.watch import DEFAULT_STALE_S, DEFAULT_THRESHOLD

    parser.add_argument("run", nargs="?", metavar="RUN",
                        help="run id, a unique prefix of one, or a run directory (default: the "
                             "newest live run)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true",
                        help="one snapshot as JSON (implies --once)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default %(default)g)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="F",
                        help="a rank slower than the others' median by this fraction is a "
                             "straggler (default %(default)g)")
    parser.add_argument("--stale", type=float, default=DEFAULT_STALE_S, metavar="SECONDS",
                        help="a heartbeat older than this is stale (default %(default)g)")
    parser.set_defaults(command=watch_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("watch", help=HELP, description=HELP))


def watch_command(args: argparse.Namespace) -> None:
    from ..diagnose import runs
    from ..diagnose.watch import CPU_SAMPLE_S, Sampler, snapshot

    _check_positive("--interval", args.interval)
    _check_positive("--stale", args.stale)
    if not (0 < args.threshold < 1):
        raise UsageError(f"--threshold {args.threshold:g}: give a fraction between 0 and 1 "
                         "(0.3: 30 %% slower than the others)".replace("%%", "%"))
    run = runs.resolve(args.run)
    sampler = Sampler()
    sampler.prime(run)
    if args.once or args.json:
        time.sleep(CPU_SAMPLE_S)  # CPU % is measured between two readings
        snap = snapshot(run.run_dir, sampler, args.threshold, args.stale)
        _print(snap, args.json)
        return
    _live(run.run_dir, sampler, args)


def _print(snap, as_json: bool) -> None:
    if as_json:
        print(json_text(snap.as_dict()), end="")
        return
    from ..diagnose.watch import console, table

    console().print(table(snap))


def _live(run_dir, sampler, args: argparse.Namespace) -> None:
    from rich.live import Live

    from ..diagnose.watch import console, snapshot, table

    screen = console()
    snap = snapshot(run_dir, sampler, args.threshold, args.stale)
    try:
        with Live(table(snap), console=screen, refresh_per_second=4) as live:
            while snap.state == "running":
                time.sleep(args.interval)
                snap = snapshot(run_dir, sampler, args.threshold, args.stale)
                live.update(table(snap))
    except KeyboardInterrupt:
        return
    screen.print(f"run {snap.run_id} is {snap.state}")


def _check_positive(flag: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{flag} {value:g}: give a positive number of seconds")


def main(argv=None) -> int:
    return command_main("kosmoss watch", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
