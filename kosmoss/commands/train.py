"""``kosmoss train``: the same run as trainup_cpu.py, through the package's CLI."""
from __future__ import annotations

import argparse
import sys

from ..core.commandline import command_main
from ..devices.policy import MachineGpu
from ..launch.lifetime import die_with_spawner
from ..launch.records import mark_external_rank
from ..run.flags import add_run_flags, checked_config, flag_names

HELP = "train the MLP on CPU (1 process, DDP over gloo, simulated nodes, or Horovod)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_flags(parser)
    parser.set_defaults(command=train_command, flag_names=flag_names())


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("train", help=HELP, description=HELP))


def train_command(args: argparse.Namespace) -> None:
    mark_external_rank()  # torchrun's, srun's ranks: known as kosmoss's from any home
    die_with_spawner()  # a local rank Lightning started ends with the rank that started it
    config = checked_config(args, machine=MachineGpu.from_environment("none"), use_gpu=False)
    from ..run.pipeline import run_from_command_line  # Lightning: seconds to import

    run_from_command_line("kosmoss train", config)


def main(argv=None) -> int:
    return command_main("kosmoss train", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
