"""``kosmoss project``: predicted DDP step time, samples/s and efficiency for N devices per
node × M nodes (the cost model: kosmoss/scaling/projection.py, docs/scaling.md).

    kosmoss project                                  # step measured here, links measured / presets
    kosmoss project --from ~/.kosmoss/runs/RUN_ID    # a 1-process run's step (result.json)
    kosmoss project --from bench/bench.json --row kosmoss-cpu
    kosmoss project --comm comm/comm.json            # links measured by kosmoss comm
    kosmoss project --intra nvlink4 --inter ib-ndr --nics 8 --devices 8 --nodes 1 2 4 16
    kosmoss project --json --out DIR                 # project.json, project.csv, project.png
    kosmoss project --comm hosts/comm.json --devices 1 --nodes 1 2 3   # hosts on this machine

Links: --comm FILE (kosmoss comm's JSON), or presets (nvlink3, nvlink4, pcie4, pcie5,
ib-hdr, ib-ndr, 25gbe, 100gbe); on CPU with neither, the intra-node link is measured here
by a short 2-rank kosmoss comm. Bad input (a preset that does not exist, a run folder
without the figures a projection needs, counts below 1) is one line and exit code 2.
"""
from __future__ import annotations

import argparse
import math
import io
import sys
from pathlib import Path
from typing import List, Optional

from rich.console import Console
from rich.table import Table

from ..core.commandline import command_main
from ..core.errors import UsageError
from ..core.files import (atomic_write_json, atomic_write_text, atomic_write_with, json_text,
                          output_folder, read_json_object, writing_into)

HELP = ("predicted DDP scaling (N devices per node x M nodes): step time, samples/s, "
        "efficiency, communication share, break-even, the dominant assumption")
DEFAULT_BATCH = 1024
DEFAULT_INTER = "ib-hdr"
ON_THE_SPOT_SIZES = ("256K", "1M", "4M", "8M")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..scaling.projection import PRESETS

    add = parser.add_argument
    add("--from", dest="source", type=Path, default=None, metavar="PATH",
        help="a 1-process kosmoss run (folder or result.json) or a bench.json; default: the "
             "step is measured here on synthetic tensors")
    add("--row", default=None, metavar="ID",
        help="with a bench.json: its 1-rank row (default kosmoss-gpu, else kosmoss-cpu)")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="where to measure the step here (default: a GPU if there is one)")
    add("--batch-size", type=int, default=None, metavar="B",
        help=f"global batch (default: the run's, or {DEFAULT_BATCH})")
    add("--weak", action="store_true",
        help="keep the per-device batch instead of the global batch (weak scaling)")
    add("--devices", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N",
        help="devices (ranks) per node to predict (default 1 2 4 8)")
    add("--nodes", type=int, nargs="+", default=[1, 2, 4], metavar="M",
        help="nodes to predict (default 1 2 4)")
    add("--comm", type=Path, default=None, metavar="FILE",
        help="comm.json of kosmoss comm: its measured links (a preset flag overrides)")
    add("--intra", default=None, metavar="LINK",
        help=f"intra-node link preset: {', '.join(PRESETS)} (default: --comm, else pcie4 on "
             "GPU, measured here on CPU)")
    add("--inter", default=None, metavar="LINK",
        help="inter-node link preset (default: --comm's, else ib-hdr)")
    add("--nics", type=int, default=1, metavar="K",
        help="inter-node links per node, shared by the node's ranks (default 1)")
    add("--bucket-mb", type=float, default=25.0, metavar="MB",
        help="DDP bucket_cap_mb (default 25, torch's)")
    add("--overlap", choices=("auto", "on", "off"), default="auto",
        help="all-reduce during backward; auto: on GPU yes, on CPU no (ranks fill the cores)")
    add("--cores", type=float, default=None, metavar="C",
        help="CPU cores per node, shared by its ranks (default: this machine's)")
    add("--one-machine", action="store_true",
        help="every node runs on this one machine and shares its cores (hosts in network "
             "namespaces; the default when --comm was measured across them)")
    add("--out", type=Path, default=None, metavar="DIR",
        help="also write project.json/.csv/.png here (a new or empty folder, or an earlier "
             "projection's)")
    add("--json", action="store_true", help="print project.json instead of the table")
    parser.set_defaults(command=project_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("project", help=HELP, description=HELP))


def project_command(args: argparse.Namespace) -> None:
    from ..scaling import projection
    from ..scaling.projection import read_reference

    _check(args)
    # Everything the user gave is checked before anything is measured.
    reference = read_reference(args.source, args.row) if args.source is not None else None
    device = reference["device"] if reference else _device(args)
    intra, inter = _links(args, device)
    out_dir = _output_folder(args.out)
    left_out = _worlds_beyond(args, args.batch_size or (reference or {}).get("batch")
                              or DEFAULT_BATCH)  # before the step is measured
    profile, batch = _profile(args, reference, device)
    shape = projection.mlp_shape(bucket_bytes=int(args.bucket_mb * 2**20))
    cpu = profile.device == "cpu"
    intra = intra or _measured_intra(cpu)
    base = projection.Cluster(1, 1, intra, inter, nics=args.nics, share=profile.share,
                              overlap=_overlap(args.overlap, cpu), single_share=profile.share)
    rows = projection.grid(profile, shape, base, args.devices, args.nodes, batch,
                           cores_per_node=_cores(args) if cpu else None, weak=args.weak,
                           one_machine=args.one_machine or _comm_on_one_machine(args))
    result = {**_result(args, profile, shape, base, rows, batch), "left_out": left_out}
    if args.json:
        print(json_text(result), end="")
    else:
        _print(result)
    if out_dir is not None:
        with writing_into(out_dir):
            _write(result, out_dir)


def _check(args: argparse.Namespace) -> None:
    for flag, values in (("--devices", args.devices), ("--nodes", args.nodes),
                         ("--nics", [args.nics])):
        bad = [v for v in values if v < 1]
        if bad:
            raise UsageError(f"{flag} {bad[0]}: must be >= 1")
    for flag, value in (("--batch-size", args.batch_size), ("--bucket-mb", args.bucket_mb),
                        ("--cores", args.cores)):
        if value is not None and not (value > 0 and math.isfinite(value)):  # nan, inf too
            raise UsageError(f"{flag} {value:g}: must be a positive number")
    if args.row and (args.source is None):
        raise UsageError("--row: only with --from a bench.json")


def _links(args: argparse.Namespace, device: str):
    """(intra or None: measure it here, inter) from presets, --comm, or the defaults."""
    from ..scaling.projection import links_from_comm, preset

    measured = (None, None)
    if args.comm is not None:
        measured = links_from_comm(_read_comm(args.comm), f"--comm {args.comm}")
    intra = preset(args.intra, "--intra") if args.intra else measured[0]
    inter = preset(args.inter, "--inter") if args.inter else \
        measured[1] or preset(DEFAULT_INTER, "--inter")
    if intra is None and device == "cuda":
        intra = preset("pcie4", "--intra")
    return intra, inter


def _comm_on_one_machine(args: argparse.Namespace) -> bool:
    from ..scaling.projection import comm_on_one_machine

    return args.comm is not None and comm_on_one_machine(_read_comm(args.comm))


def _read_comm(path: Path) -> dict:
    try:
        return read_json_object(path.expanduser())
    except (OSError, ValueError) as err:
        raise UsageError(f"--comm {path}: not readable ({err}); give kosmoss comm's "
                         "comm.json") from None


def _device(args: argparse.Namespace) -> str:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU here; use --device cpu, or --from a GPU run")
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def _cores(args: argparse.Namespace) -> float:
    from ..devices.cpus import available_cores

    return float(args.cores or available_cores())


def _overlap(choice: str, cpu: bool) -> bool:
    return {"on": True, "off": False}.get(choice, not cpu)


def _profile(args: argparse.Namespace, reference: Optional[dict], device: str):
    """The reference step and the global batch to predict for."""
    from ..scaling.projection import measured_profile, profile_from_reference

    if reference is not None:
        share = _cores(args) if device == "cpu" else 1.0  # the run had this host's cores
        return profile_from_reference(reference, share), args.batch_size or reference["batch"]
    batch = args.batch_size or DEFAULT_BATCH
    return measured_profile(batch, device), batch


def _measured_intra(cpu: bool):
    """The intra-node link of this CPU host: a short 2-rank gloo kosmoss comm."""
    from ..comm.measure import make_plan, measure
    from ..scaling.allreduce import parse_size
    from ..scaling.projection import links_from_comm

    Console(stderr=True).print("kosmoss project: measuring this host's all-reduce (kosmoss comm "
                               "--ranks 2, a few seconds); --comm FILE or --intra LINK skips it")
    sizes = [parse_size(s, "--sizes") for s in ON_THE_SPOT_SIZES]
    return links_from_comm(measure(make_plan(2, backend="gloo", device="cpu", sizes=sizes,
                                             repeats=7)))[0]


def _worlds_beyond(args: argparse.Namespace, batch: int) -> List[str]:
    """The N x M asked for that have more devices than the global batch has samples (left
    out of the grid, and said); bad input when no world above one device is left."""
    if args.weak:
        return []
    worlds = sorted({(n, m) for n in args.devices for m in args.nodes}, key=lambda w: w[0] * w[1])
    beyond = [f"{n}x{m}" for n, m in worlds if n * m > batch]
    if beyond and not any(1 < n * m <= batch for n, m in worlds):
        raise UsageError(f"--devices {' '.join(map(str, args.devices))} --nodes "
                         f"{' '.join(map(str, args.nodes))}: every world above one device has "
                         f"more devices than the global batch has samples ({batch}); ask for at "
                         "most that many devices (N x M), or give --weak or a larger --batch-size")
    return beyond


def _result(args, profile, shape, base, rows: List[dict], batch: int) -> dict:
    from dataclasses import asdict

    from ..scaling.projection import verdict

    return {"kosmoss_project": 1, "profile": asdict(profile),
            "model": {"gradient_bytes": shape.gradient_bytes,
                      "buckets": [{"bytes": b, "ready_at_backward_fraction": r}
                                  for b, r in shape.buckets],
                      "backward_share": shape.backward_share},
            "links": {"intra": asdict(base.intra), "inter": asdict(base.inter),
                      "nics": base.nics},
            "overlap": base.overlap, "global_batch": None if args.weak else batch,
            "one_machine": args.one_machine or _comm_on_one_machine(args),
            "weak_scaling": args.weak, "rows": rows, "verdict": verdict(rows)}


def _print(result: dict) -> None:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    console.print(table(result))
    for line in summary_lines(result):
        console.print(line)


def table(result: dict) -> Table:
    profile, links = result["profile"], result["links"]
    grid = Table(title=f"kosmoss project: DDP, {profile['source']}; intra {links['intra']['name']}"
                       f", inter {links['inter']['name']} x{links['nics']}",
                 caption="eff.: samples/s ÷ (world × one device's at the same global batch). "
                         "comm: exposed all-reduce ÷ step. dominant: the input whose doubling "
                         "(overlap: switching) changes samples/s most.", caption_justify="left")
    for name in ("N x M", "world", "batch/dev", "step ms", "comm ms", "samples/s", "speedup",
                 "eff.", "comm", "dominant"):
        grid.add_column(name, justify="left" if name in ("N x M", "dominant") else "right")
    for row in result["rows"]:
        change = row["sensitivity"].get(row["dominant"]) if row["dominant"] else None
        grid.add_row(f"{row['devices_per_node']} x {row['nodes']}", str(row["world"]),
                     f"{row['per_device_batch']:.0f}", f"{row['step_s'] * 1e3:.2f}",
                     f"{row['exposed_comm_s'] * 1e3:.2f}", f"{row['samples_per_s']:,.0f}",
                     f"{row['speedup']:.2f}", f"{row['efficiency']:.2f}",
                     f"{row['comm_share']:.0%}",
                     f"{row['dominant']} ({change:+.0%})" if change is not None else "")
    return grid


def summary_lines(result: dict) -> List[str]:
    found = result["verdict"]
    best = max(row["speedup"] for row in result["rows"])
    if len(result["rows"]) == 1:
        beyond = "one world only: give more --devices or --nodes to compare"
    elif best < 1:  # the peak of a grid that only loses is no reason to grow it
        beyond = (f"no world of this grid beats one device (best speedup {best:.2f}): adding "
                  "devices loses samples/s here")
    elif found["peak_is_largest"]:
        beyond = ("samples/s still rise at the largest world of this grid: extend --devices or "
                  "--nodes")
    else:
        beyond = "beyond it adding devices loses samples/s"
    lines = [f"peak: {found['peak']} at {found['peak_samples_per_s']:,.0f} samples/s; {beyond}."]
    if found["break_even"]:
        lines.append(f"break-even: from {found['break_even']} the efficiency falls below 50 % "
                     f"({found['break_even_efficiency']:.2f}): each added device buys less than "
                     "half a device.")
    else:
        lines.append("break-even: not reached in this grid (efficiency >= 50 % everywhere).")
    if result.get("left_out"):
        lines.append(f"left out: {', '.join(result['left_out'])} (more devices than the "
                     f"{result['global_batch']:,} samples of the global batch).")
    largest = result["rows"][-1]
    if largest["dominant"]:
        lines.append(f"at {largest['devices_per_node']} x {largest['nodes']} the prediction "
                     f"hangs most on {largest['dominant']}: "
                     + ", ".join(f"{k} {v:+.0%}" for k, v in largest["sensitivity"].items())
                     + " (each made twice as good).")
    return lines


def _output_folder(out: Optional[Path]) -> Optional[Path]:
    return None if out is None else output_folder(out, "project.json", "projection's")


CSV_COLUMNS = ("devices_per_node", "nodes", "world", "global_batch", "per_device_batch",
               "compute_s", "comm_s", "exposed_comm_s", "step_s", "samples_per_s", "speedup",
               "efficiency", "comm_share", "dominant")


def _write(result: dict, out_dir: Path) -> None:
    import csv

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "project.json", result)
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(result["rows"])
    atomic_write_text(out_dir / "project.csv", table.getvalue())
    _write_png(result, out_dir / "project.png")


def _write_png(result: dict, path: Path) -> None:
    """Predicted samples/s and efficiency against world size, one line per node count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(figure)
    speed, efficiency = figure.subplots(1, 2)
    for k, nodes in enumerate(sorted({r["nodes"] for r in result["rows"]})):
        rows = [r for r in result["rows"] if r["nodes"] == nodes]
        worlds = [r["world"] for r in rows]
        speed.plot(worlds, [r["samples_per_s"] for r in rows], "o-", color=f"C{k}",
                   label=f"{nodes} node(s)")
        efficiency.plot(worlds, [r["efficiency"] for r in rows], "o-", color=f"C{k}")
    speed.set(xscale="log", yscale="log", xlabel="devices in all", ylabel="samples/s",
              title="predicted throughput")
    efficiency.set(xscale="log", xlabel="devices in all", ylabel="efficiency",
                   title="predicted efficiency", ylim=(0, 1.05))
    efficiency.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    speed.legend(fontsize=8)
    atomic_write_with(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))


def main(argv=None) -> int:
    return command_main("kosmoss project", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
