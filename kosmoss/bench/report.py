"""What the bench leaves behind: a rich table, and bench.json, bench.csv, bench.png in its
output folder."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable, List, Optional

from rich.console import Group
from rich.table import Table

from ..core.files import atomic_write_with, json_text
from .figures import TARGET_MARGIN

OUTPUTS = ("bench.json", "bench.csv", "bench.png")
CSV_COLUMNS = ("id", "label", "status", "reason", "device", "ranks", "precision", "batch_size",
               "samples_per_s", "predicted_samples_per_s", "predicted_over_measured",
               "ratio", "ratio_min", "ratio_max", "versus", "scaling_efficiency",
               "scaling_efficiency_min", "scaling_efficiency_max", "time_to_first_step_s",
               "time_to_target_s", "target_reached", "val_loss", "page_faults_per_step",
               "peak_host_mib", "peak_gpu_mib", "of_limit", "limit_samples_per_s", "bound_by",
               "setup_s")


def _number(value: Optional[float], style: str = "{:,.0f}") -> str:
    return "" if value is None else style.format(value)


def _spread(row: dict, key: str) -> str:
    """A paired median with its range over the repeats: 0.96 (0.91-1.02)."""
    spread = row.get(f"{key}_spread")
    low_high = f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and spread[0] != spread[1] else ""
    return _number(row.get(key), "{:.2f}") + low_high


def _verdict(passed: Optional[bool]) -> str:
    return {True: "[green]reached[/]", False: "[red]not reached[/]", None: "[dim]n/a[/]"}[passed]


def table(bench: dict) -> Group:
    """The measured rows, then what was skipped or failed and why, then the checks."""
    plan = bench["plan"]
    rows = Table(title=f"kosmoss bench: {plan['dataset_name']} ({plan['n_samples']:,} samples), "
                       f"{plan['steps']} timed steps after 1 warm-up, median of {plan['repeats']}",
                 caption=_caption(bench), caption_justify="left")
    for name in ("set-up", "ranks", "batch", "samples/s", "predicted", "pred/meas", "ratio", "vs",
                 "eff.", "1st step s", "target s", "val_loss", "faults/step", "host MiB",
                 "GPU MiB"):
        rows.add_column(name, justify="left" if name in ("set-up", "vs") else "right")
    for row in bench["rows"]:
        if row["status"] != "measured":
            continue
        rows.add_row(
            row["id"], str(row["ranks"]), str(row["batch_size"]),
            _number(row["samples_per_s"]), _number(row.get("predicted_samples_per_s")),
            _number(row.get("predicted_over_measured"), "{:.2f}"),
            _spread(row, "ratio"),
            row["versus"] or "", _spread(row, "scaling_efficiency"),
            _number(row["time_to_first_step_s"], "{:.1f}"),
            _number(row.get("time_to_target_s"), "{:.1f}"),
            _number(row["val_loss"], "{:.4f}"), _number(row.get("page_faults_per_step")),
            _number(row["peak_host_mib"]),
            _number(row["peak_gpu_mib"]),
        )
    parts: list = [rows]
    ladder = [r for r in bench["rows"] if r["status"] == "measured" and r["kind"] == "ladder"]
    if ladder:
        parts.append(_ladder_table(ladder))
    others = [r for r in bench["rows"] if r["status"] != "measured"]
    if others:
        missing = Table(title="not measured", show_header=False, title_justify="left")
        for row in others:
            missing.add_row(row["id"], row["status"], row["reason"])
        parts.append(missing)
    unpredicted = [r for r in bench["rows"] if r.get("prediction_note")]
    if unpredicted:
        notes = Table(title="not predicted", show_header=False, title_justify="left")
        for row in unpredicted:
            notes.add_row(row["id"], row["prediction_note"])
        parts.append(notes)
    judged = Table(title="checks", title_justify="left")
    for name in ("check", "value", "target", "result"):
        judged.add_column(name, justify="left" if name in ("check", "result") else "right")
    for check in bench["checks"]:
        value = check["value"]
        shown = "" if value is None else f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"
        said = check["note"] or check.get("context")
        judged.add_row(check["name"], shown, check["target"],
                       _verdict(check["passed"]) + (f" ({said})" if said else ""))
    parts.append(judged)
    return Group(*parts)


def _ladder_table(rows: List[dict]) -> Table:
    """The ladder's rows against the GPU's limit (kosmoss.bench.ladder), compile and capture
    time apart from the steps'."""
    found = Table(title="ladder: each rung against the limit", title_justify="left")
    for name in ("set-up", "samples/s", "÷ rung below", "of the limit", "bound by",
                 "compile/capture s"):
        found.add_column(name, justify="left" if name in ("set-up", "bound by") else "right")
    for row in rows:
        found.add_row(row["id"], _number(row["samples_per_s"]), _spread(row, "ratio"),
                      _number(row.get("of_limit"), "{:.1%}"), row.get("bound_by") or "",
                      _number(row.get("setup_s"), "{:.1f}"))
    return found


def _caption(bench: dict) -> str:
    goals = "; ".join(f"{device}: {t['val_loss']:.4g} ({TARGET_MARGIN} × {t['reference']})"
                      for device, t in bench["targets"].items())
    goals = goals or "none (no 1-process kosmoss row)"
    stopped = (f"Stopped by {bench['stopped_by']}: only the repeats measured before it, no "
               "prediction. ") if bench.get("stopped_by") else ""
    return (stopped + "predicted: kosmoss.scaling.projection's cost model from the 1-rank row and this bench's "
            "kosmoss comm run (docs/scaling.md); pred/meas: predicted ÷ samples/s. "
            "ratio: samples/s ÷ the vs row's, eff.: samples/s ÷ (ranks × the 1-rank row's), each "
            "the median of the repeats paired one by one (their range in brackets). "
            "1st step / target s: seconds from launch to the end of the first training step / "
            f"to a validation with val_loss <= the target ({goals}). "
            "faults/step: minor page faults per timed step, the most of any rank. "
            "MiB: peak per rank.")


def _write(path: Path, write: Callable[[Path], None]) -> None:
    atomic_write_with(path, write)  # a reader never sees half a file


def write_json(bench: dict, path: Path) -> None:
    _write(path, lambda tmp: tmp.write_text(json_text(bench)))


def csv_text(bench: dict) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in bench["rows"]:
        writer.writerow({key: row.get(key) for key in CSV_COLUMNS} | _spread_columns(row))
    return buffer.getvalue()


def _spread_columns(row: dict) -> dict:
    found = {}
    for key in ("ratio", "scaling_efficiency"):
        low, high = row.get(f"{key}_spread") or (None, None)
        found.update({f"{key}_min": low, f"{key}_max": high})
    return found


def write_csv(bench: dict, path: Path) -> None:
    _write(path, lambda tmp: tmp.write_text(csv_text(bench)))


def write_png(bench: dict, path: Path) -> None:
    """Throughput of every measured row (log scale), and ratio to the limit and scaling
    efficiency of the training rows."""
    # The object API with the Agg canvas: no pyplot, no global backend switched for the caller.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    measured = [r for r in bench["rows"] if r["status"] == "measured" and r["samples_per_s"]]
    training = [r for r in measured if r["kind"] != "loader"]
    figure = Figure(figsize=(12, 1.6 + 0.45 * max(len(measured), 3)), layout="constrained")
    FigureCanvasAgg(figure)
    speed, share = figure.subplots(1, 2)
    _bars(speed, [r["id"] for r in measured], [r["samples_per_s"] for r in measured], "C0")
    _predicted_marks(speed, measured)
    if measured:  # a log axis with no bar on it cannot be drawn (every row skipped)
        speed.set_xscale("log")
        # From well below the slowest figure: a log axis fitted to the data starts at the
        # smallest bar, which then looks empty beside rows barely faster.
        shown = [r["samples_per_s"] for r in measured] + \
            [r["predicted_samples_per_s"] for r in measured if r.get("predicted_samples_per_s")]
        speed.set_xlim(left=min(shown) / 4)
    speed.set_xlabel("samples/s (median, log scale)")
    speed.set_title("throughput")
    _grouped(share, training)
    plan = bench["plan"]
    skipped = [r["id"] for r in bench["rows"] if r["status"] != "measured"]
    figure.suptitle(f"kosmoss bench, {bench['date'][:10]}: {plan['dataset_name']}, "
                    f"{bench['machine']['cpu']['cores_available']} CPU cores, "
                    f"{len(bench['machine']['gpus'])} GPU(s)"
                    + (f"; not measured: {', '.join(skipped)}" if skipped else ""), fontsize=10)
    _write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))


def _bars(axes, labels: List[str], values: List[float], color: str) -> None:
    positions = range(len(labels))
    axes.barh(list(positions), values, color=color)
    axes.set_yticks(list(positions), labels)
    axes.invert_yaxis()


def _predicted_marks(axes, rows: List[dict]) -> None:
    """A diamond at each predicted samples/s, labelled with predicted ÷ measured."""
    marks = [(k, r) for k, r in enumerate(rows) if r.get("predicted_samples_per_s")]
    if not marks:
        return
    axes.plot([r["predicted_samples_per_s"] for _, r in marks], [k for k, _ in marks], "D",
              color="C3", label="predicted (docs/scaling.md)")
    for k, row in marks:
        axes.annotate(f"pred/meas {row['predicted_over_measured']:.2f}",
                      (row["predicted_samples_per_s"], k), textcoords="offset points",
                      xytext=(6, -3), fontsize=8, color="C3")
    axes.legend(loc="lower right", fontsize=8)


def _grouped(axes, rows: List[dict]) -> None:
    labels = [r["id"] for r in rows]
    positions = list(range(len(labels)))
    ratios = [r.get("ratio") or 0.0 for r in rows]
    efficiency = [r.get("scaling_efficiency") or 0.0 for r in rows]
    axes.barh([p - 0.2 for p in positions], ratios, height=0.4, color="C1", label="÷ the limit")
    axes.barh([p + 0.2 for p in positions], efficiency, height=0.4, color="C2",
              label="scaling efficiency")
    axes.axvline(1.0, color="grey", linewidth=0.8)
    axes.set_yticks(positions, labels)
    axes.invert_yaxis()
    axes.set_xlabel("ratio")
    axes.set_title("ratio to the limit, scaling efficiency")
    axes.legend(loc="lower right", fontsize=8)


def write_all(bench: dict, out_dir: Path) -> List[Path]:
    paths = [out_dir / name for name in OUTPUTS]
    write_json(bench, paths[0])
    write_csv(bench, paths[1])
    write_png(bench, paths[2])
    return paths
