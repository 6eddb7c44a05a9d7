"""``kosmoss env``: what this machine has for training."""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from ..core.commandline import command_main

HELP = "versions, CPU cores, GPUs, distributed backends and the launcher detected"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(command=env_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("env", help=HELP, description=HELP))


def env_command(args: argparse.Namespace) -> None:
    from ..devices.environment import describe

    facts = describe()
    if args.json:
        print(json.dumps(facts, indent=2))
        return
    table = Table(show_header=False, title="kosmoss env")
    cpu = facts["cpu"]
    rows = [
        ("kosmoss / python", f"{facts['kosmoss']} / {facts['python']}"),
        ("torch / lightning", f"{facts['torch']} / {facts['lightning']}"),
        ("CUDA / NCCL", f"{facts['cuda'] or 'none'} / {facts['nccl'] or 'none'}"),
        ("CPU cores", f"{cpu['cores_available']} available ({cpu['cores_logical']} logical, "
                      f"{cpu['cores_physical']} physical), {cpu['memory_gib']} GiB"),
        ("GPUs", "\n".join(f"{g['index']}: {g['name']}, {g['memory_used_mib']} / "
                           f"{g['memory_total_mib']} MiB used, driver {g['driver']}"
                           for g in facts["gpus"]) or "none"),
        ("backends", ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in facts["backends"].items())),
        ("launcher", facts["launcher"] or "none (kosmoss or Lightning starts the processes)"),
        ("KOSMOSS_HOME", facts["kosmoss_home"]),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def main(argv=None) -> int:
    return command_main("kosmoss env", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
