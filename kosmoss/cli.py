"""``kosmoss``: registers one subcommand per module of :mod:`kosmoss.commands`."""
from __future__ import annotations

import contextlib
import sys

from . import __version__
from .commands import (bench, check, comm, data, env, ghosts, hosts, lessons, project, stacks,
                       train, watch)
from .core.commandline import OneLineParser, run_command, stop_signals_unwind

COMMANDS = (data, train, bench, ghosts, env, lessons, check, comm, project, stacks, watch, hosts)
DESCRIPTION = "ECMWF's radiation-column MLP, from a laptop CPU to many GPUs."


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="kosmoss", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"kosmoss {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND",
                                       parser_class=OneLineParser)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # A training run stops on signals its own way (kosmoss.run.pipeline: checkpoint, record).
    unwinding = contextlib.nullcontext() if args.subcommand == "train" else stop_signals_unwind()
    with unwinding:
        return run_command(f"kosmoss {args.subcommand}", lambda: args.command(args),
                           getattr(args, "flag_names", None))


if __name__ == "__main__":
    sys.exit(main())
