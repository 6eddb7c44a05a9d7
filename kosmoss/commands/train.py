"""``kosmoss train``: the same run as trainup_cpu.py, through the package's CLI."""
from __future__ import annotations

import argparse
import sys

from ..cli_support import OneLineParser, run_command
from ..run.flags import add_run_flags, config_from_args

HELP = "train the MLP on CPU (1 process, or DDP over gloo)"


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help=HELP, description=HELP)
    add_run_flags(parser)
    parser.set_defaults(command=train_command)


def train_command(args: argparse.Namespace) -> None:
    from ..run import run  # Lightning is slow to import; only this command needs it

    run(config_from_args(args))


def main(argv=None) -> int:
    parser = OneLineParser(prog="kosmoss train", description=HELP)
    add_run_flags(parser)
    args = parser.parse_args(argv)
    return run_command(parser.prog, lambda: train_command(args))


if __name__ == "__main__":
    sys.exit(main())
