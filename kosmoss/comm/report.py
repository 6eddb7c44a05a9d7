"""What ``kosmoss comm`` leaves behind: a rich table, and comm.json, comm.csv, comm.png."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable, List

from rich.table import Table

from ..core.files import atomic_write_with, json_text
from ..scaling.allreduce import human_size

OUTPUTS = ("comm.json", "comm.csv", "comm.png")
CSV_COLUMNS = ("group", "ranks", "bytes", "size", "repeats", "time_s", "min_time_s",
               "max_time_s", "mean_time_s", "wait_s", "algbw_Bps", "busbw_Bps")


def rate_unit(result: dict) -> tuple:
    """GB/s, or MB/s where every bandwidth is below 0.1 GB/s (a shaped link of 1 Mbit/s
    moves 0.000125 GB/s: three decimals of GB/s would print zeros)."""
    rates = [row["busbw_Bps"] or 0 for group in result["groups"].values()
             for row in group["rows"]] + [row["algbw_Bps"] or 0 for group in
                                          result["groups"].values() for row in group["rows"]]
    return ("GB/s", 1e9) if max(rates, default=0) >= 1e8 else ("MB/s", 1e6)


def _rate(value, unit: tuple) -> str:
    return "" if value is None else f"{value / unit[1]:.3f}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def table(result: dict) -> Table:
    plan = result["plan"]
    spaced = plan.get("compute_s", 0) > 0
    how = (f", each after {_time(plan['compute_s'])} of compute (mean: what a step pays; "
           "wait: the mean rank's for the last)" if spaced else "")
    grid = Table(title=f"kosmoss comm: all-reduce, {plan['ranks']} ranks ({plan['nodes']} "
                       f"{_nodes_word(plan)} x {plan['ranks_per_node']}), {plan['backend']} on "
                       f"{plan['device']}, median of {plan['repeats']}{how}",
                 caption=_caption(result), caption_justify="left")
    unit = rate_unit(result)
    columns = ("group", "size", "time", *(("mean", "wait") if spaced else ()),
               f"algbw {unit[0]}", f"busbw {unit[0]}", "min..max")
    for name in columns:
        grid.add_column(name, justify="left" if name == "group" else "right")
    marks = {result["model_gradient_bytes"]: " (gradients)",
             result["ddp_bucket_bytes"]: " (bucket)"}
    for name, group in result["groups"].items():
        for row in group["rows"]:
            extra = (_time(row["mean_time_s"]), _time(row["wait_s"])) if spaced else ()
            grid.add_row(f"{name} ({group['ranks']})", row["size"] + marks.get(row["bytes"], ""),
                         _time(row["time_s"]), *extra, _rate(row["algbw_Bps"], unit),
                         _rate(row["busbw_Bps"], unit),
                         f"{_time(row['min_time_s'])}..{_time(row['max_time_s'])}")
    return grid


def _nodes_word(plan: dict) -> str:
    """Simulated nodes over loopback, or hosts in network namespaces at their link rate."""
    if not plan.get("host_namespaces"):
        return "node(s)"
    return f"hosts in network namespaces, links {plan.get('link_rate') or 'unshaped'},"


def _caption(result: dict) -> str:
    fits, unit = [], rate_unit(result)
    for name, group in result["groups"].items():
        fit = group["fit"]
        if fit:
            # Below 0 no fixed cost fits: the smallest sizes came faster than the line.
            cost = (f"{_time(fit['alpha_s'])} + " if fit["alpha_s"] >= 0 else "")
            below = ", α fitted below 0: no fixed cost fits these sizes" \
                if fit["alpha_s"] < 0 else ""
            fits.append(f"{name}: t = {cost}bytes / "
                        f"{_rate(fit['asymptotic_algbw_Bps'], unit)} {unit[0]} (link: "
                        f"{_time(fit['link_latency_s'])} a hop, "
                        f"{_rate(fit['link_bandwidth_Bps'], unit)} {unit[0]}{below})")
    return ("busbw = algbw x 2(n-1)/n (nccl-tests). α–β fit, " + "; ".join(fits) +
            f". Gradients of kosmoss's MLP: {human_size(result['model_gradient_bytes'])}.")


def _write(path: Path, write: Callable[[Path], None]) -> None:
    atomic_write_with(path, write)  # a reader never sees half a file


def csv_text(result: dict) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for name, group in result["groups"].items():
        for row in group["rows"]:
            writer.writerow({"group": name, "ranks": group["ranks"], **row})
    return buffer.getvalue()


def write_png(result: dict, path: Path) -> None:
    """Time and busbw against size (log-log), measured points and the α–β fit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    times, bandwidth = figure.subplots(1, 2)
    unit = rate_unit(result)
    for k, (name, group) in enumerate(result["groups"].items()):
        sizes = [r["bytes"] for r in group["rows"]]
        color = f"C{k}"
        times.plot(sizes, [r["time_s"] for r in group["rows"]], "o", color=color,
                   label=f"{name} ({group['ranks']} ranks)")
        bandwidth.plot(sizes, [r["busbw_Bps"] / unit[1] for r in group["rows"]], "o-",
                       color=color,
                       label=f"{name} busbw")
        if group["fit"]:
            fit = group["fit"]
            times.plot(sizes, [fit["alpha_s"] + fit["beta_s_per_byte"] * s for s in sizes], "-",
                       color=color, alpha=0.6, label=f"{name} α–β fit")
    for axes in (times, bandwidth):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("payload (bytes)")
        axes.axvline(result["model_gradient_bytes"], color="grey", linestyle=":", linewidth=1)
        axes.legend(fontsize=8)
    times.set_yscale("log")
    times.set_ylabel("time per all-reduce (s)")
    bandwidth.set_ylabel(f"busbw ({unit[0]})")
    plan = result["plan"]
    figure.suptitle(f"kosmoss comm, {result['date'][:10]}: {plan['ranks']} ranks, "
                    f"{plan['backend']} on {plan['device']} (dotted: the MLP's gradients)",
                    fontsize=10)
    _write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))


def write_all(result: dict, out_dir: Path) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in OUTPUTS]
    _write(paths[0], lambda tmp: tmp.write_text(json_text(result)))
    _write(paths[1], lambda tmp: tmp.write_text(csv_text(result)))
    write_png(result, paths[2])
    return paths
