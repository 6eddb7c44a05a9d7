"""``kosmoss hosts``: a cluster on this machine for your own commands: hosts in network
namespaces, joined by a bridge, each link shaped to a set rate (docs/hosts.md).

    kosmoss hosts up --count 2 --link-rate 1gbit   # prints each host's torchrun command
    kosmoss hosts up --count 2 --slurm             # and Slurm on them: prints the sbatch line
    kosmoss hosts exec 0 -- python -c "import socket; print(socket.gethostname())"
    kosmoss hosts status                           # the sets, their hosts, leftovers
    kosmoss hosts down                             # remove the set (--all: every one)

As root on Linux. ``up`` leaves the set for later commands (``hosts down`` removes it); a
run with ``--hosts netns`` makes and removes its own.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import List

from rich.console import Console

from ..core.commandline import command_main
from ..core.errors import UsageError

HELP = ("hosts in network namespaces with a set link rate, for your own commands: up, exec, "
        "status, down")
RDZV_PORT = 29400  # torchrun's documented c10d rendezvous port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="make a set of hosts and print how to use them")
    up.add_argument("--count", type=int, default=2, metavar="K", help="hosts (default 2)")
    up.add_argument("--link-rate", default="none", metavar="RATE",
                    help="each host's link: 100mbit, 1gbit, 10gbit, none (default none)")
    up.add_argument("--slurm", action="store_true",
                    help="start Slurm on the hosts (slurmctld on h0, a slurmd each) and print "
                         "the sbatch line")
    up.add_argument("--json", action="store_true", help="print the set as JSON")
    run = actions.add_parser("exec", help="run a command in one host (its interface set)")
    run.add_argument("host", type=int, help="the host's index (0 is MASTER_ADDR)")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")
    run.add_argument("--set", dest="set_id", default=None, help="the set (default: the only one)")
    status = actions.add_parser("status", help="the host sets and leftovers")
    status.add_argument("--json", action="store_true")
    down = actions.add_parser("down", help="remove a set made by `hosts up`")
    down.add_argument("set_id", nargs="?", default=None, help="the set (default: the only one)")
    down.add_argument("--all", action="store_true", help="every set made by `hosts up`")
    parser.set_defaults(command=hosts_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("hosts", help=HELP, description=HELP))


def hosts_command(args: argparse.Namespace) -> None:
    {"up": _up, "exec": _exec, "status": _status, "down": _down}[args.action](args)


def _up(args: argparse.Namespace) -> None:
    from ..launch import hosts

    hosts.check_support("kosmoss hosts up")
    hosts.check_count(args.count, "--count")
    rate = hosts.parse_rate(args.link_rate, "--link-rate")
    if args.slurm:
        _check_slurm()
    made = hosts.make_hosts(args.count, rate, purpose="kosmoss hosts up", owner=None)
    sbatch = _start_slurm(made) if args.slurm else None
    if args.json:
        print(json.dumps({**made.as_dict(), "torchrun": torchrun_commands(made),
                          **({"sbatch": sbatch} if sbatch else {})}, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"host set {made.set_id}: {made.describe()}", markup=False)
    console.print("torchrun on every host (the same --rdzv-id; start them in any order):",
                  markup=False)
    for line in torchrun_commands(made):
        console.print(f"  {line}", markup=False)
    if sbatch:
        console.print(f"Slurm (slurmctld on h0, one slurmd per host, hostnames h0..h"
                      f"{len(made.hosts) - 1}):\n  {sbatch}", markup=False)
    console.print(f"remove it: kosmoss hosts down {made.set_id}", markup=False)


def torchrun_commands(made, script: str = "trainup_cpu.py") -> List[str]:
    """What a cluster user types on each node, run in each host with its interface set.
    --local-addr: the address the node's agent advertises (its hostname is the machine's)."""
    nodes = len(made.hosts)
    endpoint = f"{made.master_addr}:{RDZV_PORT}"
    lines = []
    for host in made.hosts:
        argv = host.command(
            ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", "1", "--node-rank",
             str(host.index), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", made.set_id, "--local-addr", host.address, script],
            {**host.socket_env, **made.threads_env})
        lines.append(shlex.join(argv))
    return lines


def _check_slurm() -> None:
    from ..launch.host_slurm import slurm_missing

    missing = slurm_missing()
    if missing:
        raise UsageError(f"--slurm: {missing}")


def _start_slurm(made) -> str:
    """Slurm on the set, or the set removed again: nothing half made is left."""
    from ..launch import host_slurm, hosts

    try:
        cluster = host_slurm.start_slurm(made)
    except BaseException:
        hosts.remove_hosts(made)
        raise
    return shlex.join(cluster.sbatch_command(["slurm/submit.sbatch"]))


def _chosen(set_id, flag: str):
    from ..launch import hosts

    sets = [s for s in hosts.recorded_sets() if s.owner is None]
    if set_id is not None:
        sets = [s for s in hosts.recorded_sets() if s.set_id == set_id]
        if not sets:
            raise UsageError(f"{flag} {set_id}: no such host set; `kosmoss hosts status` "
                             "lists them")
        return sets[0]
    if len(sets) != 1:
        listed = ", ".join(s.set_id for s in sets) or "none is up (kosmoss hosts up)"
        raise UsageError(f"{flag}: name the host set ({listed})")
    return sets[0]


def _exec(args: argparse.Namespace) -> None:
    from ..launch.host_slurm import slurm_folder

    made = _chosen(args.set_id, "--set")
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("kosmoss hosts exec: give the command after --")
    if not 0 <= args.host < len(made.hosts):
        raise UsageError(f"host {args.host}: set {made.set_id} has hosts 0.."
                         f"{len(made.hosts) - 1}")
    host = made.hosts[args.host]
    conf = slurm_folder(made.set_id) / "slurm.conf"
    slurm = {"SLURM_CONF": str(conf)} if conf.is_file() else {}  # squeue, sbatch, ... work
    command = host.command(argv, {**host.socket_env, "MASTER_ADDR": made.master_addr, **slurm})
    sys.stdout.flush()
    os.execvp(command[0], command)


def _status(args: argparse.Namespace) -> None:
    from ..launch import hosts

    sets, left = hosts.recorded_sets(), hosts.leftovers()
    if args.json:
        print(json.dumps({"sets": [s.as_dict() for s in sets],
                          "leftovers": [{"set_id": f.set_id, "namespaces": list(f.namespaces),
                                         "reason": f.reason} for f in left]}, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    gone = {f.set_id for f in left}
    for made in sets:
        mark = " (leftover: kosmoss ghosts --kill removes it)" if made.set_id in gone else ""
        console.print(f"{made.set_id} [{made.purpose}]{mark}: {made.describe()}", markup=False)
    for found in left:
        if found.record is None:
            console.print(f"{found.set_id}: {', '.join(found.namespaces)}: {found.reason}",
                          markup=False)
    if not sets and not left:
        console.print("no host set", markup=False)


def _down(args: argparse.Namespace) -> None:
    from ..launch import hosts

    if args.all:
        chosen = [s for s in hosts.recorded_sets() if s.owner is None]
    else:
        chosen = [_chosen(args.set_id, "kosmoss hosts down")]
    for made in chosen:
        if made.owner is not None and made.owner.is_alive():
            raise UsageError(f"kosmoss hosts down {made.set_id}: it belongs to a live run (pid "
                             f"{made.owner.pid}); stop that run, it removes its hosts")
    for made in chosen:
        removed = hosts.remove_hosts(made)
        print(f"removed host set {made.set_id} ({len(removed)} namespaces)")
    if not chosen:
        print("no host set made by `kosmoss hosts up`")


def main(argv=None) -> int:
    return command_main("kosmoss hosts", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
