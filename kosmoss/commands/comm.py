"""``kosmoss comm``: all-reduce time, algbw and busbw per payload size, and an α–β fit.

    kosmoss comm --ranks 2                         # gloo on CPU (NCCL on GPUs), 4 KiB..256 MiB
    kosmoss comm --ranks 2 --max-size 32M          # a 2-core laptop: well under a minute
    kosmoss comm --ranks 2 --sizes 1M 8M 32M --repeats 5 --json
    kosmoss comm --ranks 4 --nodes 2               # 2 simulated nodes: world, intra, inter
    kosmoss comm --ranks 2 --backend gloo --device cuda   # ranks sharing one GPU
    kosmoss comm --ranks 2 --sizes 1.86M --repeats 50 --compute-s 0.005   # as in training
    kosmoss comm --ranks 2 --nodes 2 --hosts netns --link-rate 1gbit   # 2 hosts, 1 Gbit/s links

Writes comm.json (``kosmoss project --comm`` reads it), comm.csv and comm.png into --out
(default: a new folder under $KOSMOSS_HOME/runs/).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Optional

from rich.console import Console

from ..core import files
from ..core.commandline import command_main
from ..core.errors import UsageError

HELP = ("all-reduce microbenchmark over ranks it starts: time, algbw, busbw per size, "
        "latency-bandwidth fit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--ranks", type=int, default=2, metavar="N",
        help="processes in all, started here (default %(default)s)")
    add("--nodes", type=int, default=1, metavar="M",
        help="simulated nodes the ranks are spread over, NODE_RANK each (default %(default)s)")
    add("--hosts", choices=("loopback", "netns"), default="loopback",
        help="netns: each node a host in its own network namespace, as root (docs/hosts.md)")
    add("--link-rate", default=None, metavar="RATE",
        help="with --hosts netns: every host's link, e.g. 100mbit, 1gbit, none (default none)")
    add("--backend", choices=("auto", "gloo", "nccl"), default="auto",
        help="auto: NCCL with a GPU per rank, else gloo (default %(default)s)")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="where the tensors live; auto: a GPU if there is one (default %(default)s)")
    add("--sizes", nargs="+", metavar="SIZE", default=None,
        help="payloads (4K, 1.5M, 256M, bytes); default 4 KiB..256 MiB by 4x, plus the MLP's "
             "gradients and DDP's 25 MiB bucket")
    add("--max-size", metavar="SIZE", default=None, help="leave out larger sizes, e.g. 32M")
    add("--repeats", type=int, default=10, metavar="N",
        help="timed repeats per size, median reported (default %(default)s)")
    add("--warmup", type=int, default=2, metavar="N", help="untimed all-reduces first (default 2)")
    add("--compute-s", type=float, default=0.0, metavar="SECONDS",
        help="time each all-reduce as training meets it: after a training step of the MLP "
             "(forward, backward, Adam) lasting about SECONDS on one rank alone, run on every "
             "rank, one per repeat, no barrier (default 0: back to back, as nccl-tests)")
    add("--out", type=Path, default=None, metavar="DIR",
        help="write comm.json/.csv/.png here: a new or empty folder, or an earlier comm's")
    add("--json", action="store_true", help="print comm.json instead of the table")
    parser.set_defaults(command=comm_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("comm", help=HELP, description=HELP))


def comm_command(args: argparse.Namespace) -> None:
    from ..comm import report
    from ..comm.measure import make_plan, measure, on_hosts
    from ..scaling import allreduce as figures

    sizes = None if args.sizes is None else [figures.parse_size(s, "--sizes") for s in args.sizes]
    max_size = None if args.max_size is None else figures.parse_size(args.max_size, "--max-size")
    out_dir = output_folder(args.out)  # checked before torch is imported, as every flag is
    plan = make_plan(args.ranks, args.nodes, args.backend, args.device, sizes, max_size,
                     args.repeats, args.warmup, args.compute_s)
    rate = check_host_flags(args, plan)  # bad input: before anything is said or made
    progress = Console(stderr=True, highlight=False)
    least = least_duration_s(plan, rate)
    takes = "" if least is None else f" (at least {least / 60:.1f} min over the shaped links)"
    progress.print(f"kosmoss comm: {plan.ranks} ranks ({plan.nodes} node(s)), {plan.backend} on "
                   f"{plan.device}, {len(plan.sizes)} sizes up to "
                   f"{figures.human_size(max(plan.sizes))}{takes}; output in {out_dir}",
                   markup=False)
    with _hosts(args, plan, rate) as made:
        if made is not None:
            plan = on_hosts(plan, made)
            progress.print(f"over {made.describe()}", markup=False)
        result = measure(plan)
    if args.json:
        print(files.json_text(result), end="")
    else:
        Console(highlight=False, width=None if sys.stdout.isatty() else 140).print(
            report.table(result))
    with files.writing_into(out_dir):
        written = report.write_all(result, out_dir)
    progress.print("wrote " + ", ".join(map(str, written)), markup=False)


def check_host_flags(args: argparse.Namespace, plan) -> Optional[float]:
    """--hosts and --link-rate, checked: the rate in bits/s (None: unshaped)."""
    from ..launch import hosts

    if args.hosts != "netns":
        if args.link_rate is not None:
            raise UsageError(f"--link-rate {args.link_rate}: only with --hosts netns")
        return None
    rate = hosts.parse_rate(args.link_rate, "--link-rate")
    if plan.nodes < 2:
        raise UsageError("--hosts netns: give --nodes 2 or more (each node is a host)")
    hosts.check_support("--hosts netns")
    hosts.check_count(plan.nodes, "--nodes")
    _check_link_time(plan, rate)
    return rate


def _crossing_s(size: int, ranks: int, rate: float) -> float:
    """The least an all-reduce of ``size`` bytes takes over a link of ``rate`` bits/s: a
    ring sends 2(n-1)/n of the buffer out of each host, whatever its ranks per host."""
    from ..scaling import allreduce as figures

    return figures.bus_factor(ranks) * size * 8 / rate


def _check_link_time(plan, rate: Optional[float]) -> None:
    """A size whose all-reduce outlasts the ranks' timeout over the shaped link fails after
    every smaller one was measured (at 1mbit 16 MiB takes 4 min): refused first."""
    from ..comm.ranks import GROUP_TIMEOUT_S
    from ..launch.hosts import rate_name
    from ..scaling import allreduce as figures

    if rate is None:
        return
    bound = GROUP_TIMEOUT_S / 2  # room for the protocol and a loaded machine
    largest = max(plan.sizes)
    if _crossing_s(largest, plan.ranks, rate) < bound:
        return
    fits = [size for size in figures.default_sizes()
            if _crossing_s(size, plan.ranks, rate) < bound]
    flag_value = figures.human_size(max(fits)).replace(" ", "") if fits else None  # 4MiB
    advice = f"give --max-size {flag_value} or less" if fits else "give smaller --sizes"
    raise UsageError(f"--link-rate {rate_name(rate)}: an all-reduce of "
                     f"{figures.human_size(largest)} takes at least "
                     f"{_crossing_s(largest, plan.ranks, rate):,.0f} s over it, past half the "
                     f"ranks' {GROUP_TIMEOUT_S} s timeout; {advice}, or a faster rate")


def least_duration_s(plan, rate: Optional[float]) -> Optional[float]:
    """Every all-reduce of the plan over the shaped link, warm-up included (None: unshaped)."""
    if rate is None:
        return None
    return sum(_crossing_s(size, plan.ranks, rate) for size in plan.sizes) * \
        (plan.repeats + plan.warmup)


@contextlib.contextmanager
def _hosts(args: argparse.Namespace, plan, rate: Optional[float]):
    """--hosts netns: one host per node for the measurement, removed after it."""
    from ..launch import hosts

    if args.hosts != "netns":
        yield None
        return
    with hosts.host_set(plan.nodes, rate, purpose="kosmoss comm") as made:
        yield made


def output_folder(out: Optional[Path]) -> Path:
    """Nothing of the user's is overwritten: a folder that holds something must be an
    earlier comm's."""
    from ..core import paths

    if out is None:
        default = paths.runs_root() / f"comm-{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
        files.check_writable(default, "KOSMOSS_HOME", "set KOSMOSS_HOME or give --out DIR")
        return default
    return files.output_folder(out, "comm.json", "kosmoss comm's")


def main(argv=None) -> int:
    return command_main("kosmoss comm", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
