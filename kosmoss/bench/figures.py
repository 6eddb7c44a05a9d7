"""The bench's arithmetic, on measurements already taken: medians over repeats, the ratio
to the limit, scaling efficiency, time to the target loss, and the checks.

- ratio: a row's samples/s ÷ its ``versus`` row's (the raw loop on the same device and
  precision; for the batched loader, the course's loader); 1 for those references. Taken
  repeat by repeat (repeat i of the row ÷ repeat i of its reference, run seconds apart)
  and the median of those kept with their spread: a shared VM's speed drifts by 25 % over
  a minute, and a ratio of two medians would carry that drift;
- scaling efficiency of an N-rank row: its samples/s ÷ (N × its 1-rank row's), paired the
  same way;
- predicted samples/s of a multi-rank DDP row: :mod:`kosmoss.scaling.projection`'s cost model fed
  with the 1-rank row of the same run and a ``kosmoss comm`` measurement of the row's
  topology taken by the bench; ``predicted_over_measured`` = predicted ÷ measured;
- target loss of a device (cpu, gpu): ``TARGET_MARGIN`` × the final validation loss of
  that device's 1-process kosmoss row (median over repeats); time to target: wall time
  from launching the row's command until a validation reports ``val_loss <= target``
  (validation runs after every epoch), median over repeats.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .rungs import TOP
from .setups import Setup

TARGET_MARGIN = 1.05
TARGET_REFERENCE = {"cpu": "kosmoss-cpu", "gpu": "kosmoss-gpu"}
LARGE_PRESET_SAMPLES = 1_048_576


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    """Median of the values that exist; None when none does."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def scaling_efficiency(samples_per_s: Optional[float], ranks: int,
                       single_samples_per_s: Optional[float]) -> Optional[float]:
    """N ranks that scaled perfectly would do N times the 1-rank throughput."""
    if single_samples_per_s is None:
        return None
    return ratio(samples_per_s, ranks * single_samples_per_s)


def paired_ratios(row: dict, reference: dict, scale: float = 1.0) -> List[float]:
    """Repeat i of ``row`` ÷ (``scale`` × repeat i of ``reference``), for every i both
    measured: the bench interleaves repeats, so the two ran seconds apart."""
    pairs = zip(row.get("repeats", []), reference.get("repeats", []))
    return [mine["samples_per_s"] / (scale * theirs["samples_per_s"]) for mine, theirs in pairs
            if not mine.get("error") and not theirs.get("error")
            and mine.get("samples_per_s") and theirs.get("samples_per_s")]


def median_and_spread(values: List[float]) -> Tuple[Optional[float], Optional[List[float]]]:
    if not values:
        return None, None
    return statistics.median(values), [min(values), max(values)]


def time_to_target(curve: Sequence[dict], target: Optional[float]) -> Optional[float]:
    """Seconds since launch of the first validation with ``val_loss <= target``."""
    if target is None:
        return None
    return next((p["t_s"] for p in sorted(curve, key=lambda p: p["t_s"])
                 if p["val_loss"] <= target), None)


def summarize(measurements: List[dict]) -> dict:
    """Medians over the repeats that succeeded; memory peaks are the highest seen."""
    ok = [m for m in measurements if not m.get("error")]

    def med(key: str) -> Optional[float]:
        return median(m.get(key) for m in ok)

    def peak(key: str) -> Optional[float]:
        values = [m[key] for m in ok if m.get(key) is not None]
        return max(values) if values else None

    return {"samples_per_s": med("samples_per_s"),
            "time_to_first_step_s": med("time_to_first_step_s"),
            "val_loss": med("val_loss"),
            "page_faults_per_step": med("page_faults_per_step"),
            "step_time_cv": med("step_time_cv"),
            "loop_step_s": med("loop_step_s"),
            "steps_per_execution": peak("steps_per_execution"),
            "of_limit": med("of_limit"), "limit_samples_per_s": med("limit_samples_per_s"),
            "bound_by": next((m["bound_by"] for m in ok if m.get("bound_by")), None),
            "setup_s": med("setup_s"),
            "cuda_graphs": next((m["cuda_graphs"] for m in ok if m.get("cuda_graphs")), None),
            "peak_host_mib": peak("peak_host_mib"), "peak_gpu_mib": peak("peak_gpu_mib")}


def targets(rows: Dict[str, dict]) -> Dict[str, dict]:
    """The target loss of each device whose 1-process kosmoss row was measured."""
    found = {}
    for device, reference in TARGET_REFERENCE.items():
        loss = rows.get(reference, {}).get("val_loss")
        if loss is not None:
            found[device] = {"reference": reference, "reference_val_loss": loss,
                             "val_loss": TARGET_MARGIN * loss}
    return found


def complete(setups: Sequence[Setup], rows: Dict[str, dict]) -> Dict[str, dict]:
    """Add ratio, efficiency and time to target to each measured row (in place); returns
    the targets used."""
    goals = targets(rows)
    for setup in setups:
        row = rows.get(setup.id)
        if row is None or row["status"] != "measured":
            continue
        versus = rows.get(setup.versus or "", {})
        single = rows.get(setup.single or "", {})
        # A row with nothing to be divided by is the reference itself (a limit, the course).
        row["ratio"], row["ratio_spread"] = median_and_spread(
            paired_ratios(row, versus)) if setup.versus else (1.0, None)
        row["scaling_efficiency"], row["scaling_efficiency_spread"] = median_and_spread(
            paired_ratios(row, single, scale=setup.ranks)) if setup.single else (None, None)
        if setup.trains:
            row.update(_target_figures(row["repeats"], goals.get(setup.device, {}).get("val_loss")))
    return goals


def _target_figures(repeats: List[dict], goal: Optional[float]) -> dict:
    times = [time_to_target(m.get("val_curve", []), goal) for m in repeats if not m.get("error")]
    reached = [t for t in times if t is not None]
    # A repeat that never reached it counts as infinitely slow in the median.
    middle = median([math.inf if t is None else t for t in times])
    return {"time_to_target_s": None if middle in (None, math.inf) else middle,
            "target_reached": None if goal is None else f"{len(reached)}/{len(times)}"}


def _row_figure(rows: Dict[str, dict], row_id: str, key: str) -> Optional[float]:
    row = rows.get(row_id)
    return row.get(key) if row and row.get("status") == "measured" else None


EXTRA_FAULTS_MAX = 256  # pages (1 MiB) a step: one batch buffer re-faulted is 1,000s at batch 256


def _extra_page_faults(rows: Dict[str, dict]) -> Optional[float]:
    """Minor page faults per step of kosmoss beyond the raw loop's (kosmoss.run.throughput)."""
    kosmoss = _row_figure(rows, "kosmoss-cpu", "page_faults_per_step")
    raw = _row_figure(rows, "raw-cpu", "page_faults_per_step")
    return None if kosmoss is None or raw is None else kosmoss - raw


def _ddp_loss_ratio(rows: Dict[str, dict]) -> Optional[float]:
    return ratio(_row_figure(rows, "ddp-cpu-2", "val_loss"),
                 _row_figure(rows, "kosmoss-cpu", "val_loss"))


def lightning_share(rows: Dict[str, dict], device: str = "cpu") -> Optional[str]:
    """Where the 1-process kosmoss row's gap to the limit goes, from this run's Lightning
    row: how much of the limit Lightning's own loop keeps, and kosmoss ÷ that loop (both
    paired repeat by repeat); with the Fabric row, how much a loop of one's own keeps."""
    kosmoss, alone = rows.get(f"kosmoss-{device}", {}), rows.get(f"lightning-{device}", {})
    if alone.get("status") != "measured" or kosmoss.get("status") != "measured":
        return None
    over, _ = median_and_spread(paired_ratios(kosmoss, alone))
    if alone.get("ratio") is None or over is None:
        return None
    fabric = rows.get(f"fabric-{device}", {})
    own_loop = (f"; the raw loop on Fabric, fabric-{device}: {fabric['ratio']:.2f}"
                if fabric.get("status") == "measured" and fabric.get("ratio") is not None else "")
    return (f"Lightning's loop alone, lightning-{device}: {alone['ratio']:.2f} of the limit; "
            f"kosmoss ÷ it: {over:.2f}{own_loop}")


class Check(NamedTuple):
    name: str
    target: str
    figure: Callable[[Dict[str, dict]], Optional[float]]
    passes: Callable[[float], bool]
    needs: Tuple[str, ...]  # the rows the figure comes from
    large_only: bool = False  # judged on the large preset only
    context: Optional[Callable[[Dict[str, dict]], Optional[str]]] = None  # said beside it


def _raw_ratio_at(low: int, high: float) -> Callable[[Dict[str, dict]], Optional[float]]:
    """kosmoss-cpu ÷ raw-cpu when the bench's batch is in [low, high): Lightning's and the
    loader's fixed cost per step (~1 ms) weighs more the smaller the step."""
    def figure(rows: Dict[str, dict]) -> Optional[float]:
        batch = rows.get("kosmoss-cpu", {}).get("batch_size", 0)
        return _row_figure(rows, "kosmoss-cpu", "ratio") if low <= batch < high else None
    figure.judged_at = f"batch {low}" + (f" to {int(high) - 1}" if high < math.inf else " or more")
    return figure


CHECKS: List[Check] = [
    Check("kosmoss on 1 CPU process ÷ raw CPU loop, batch >= 1024", ">= 0.95",
          _raw_ratio_at(1024, math.inf), lambda v: v >= 0.95, ("kosmoss-cpu", "raw-cpu"),
          context=lightning_share),
    Check("kosmoss on 1 CPU process ÷ raw CPU loop, batch 256-1023", ">= 0.90",
          _raw_ratio_at(256, 1024), lambda v: v >= 0.90, ("kosmoss-cpu", "raw-cpu"),
          context=lightning_share),
    Check("kosmoss-cpu page faults per step − raw-cpu's (allocator stability)",
          f"<= {EXTRA_FAULTS_MAX}", _extra_page_faults, lambda v: v <= EXTRA_FAULTS_MAX,
          ("kosmoss-cpu", "raw-cpu")),
    Check("batched loader ÷ the course's per-sample loader", ">= 50",
          lambda rows: _row_figure(rows, "loader-kosmoss", "ratio"), lambda v: v >= 50,
          ("loader-kosmoss", "loader-course")),
    Check("2-rank CPU DDP val_loss ÷ 1-rank val_loss, equal global batch", "1 ± 0.05",
          _ddp_loss_ratio, lambda v: abs(v - 1) <= 0.05, ("ddp-cpu-2", "kosmoss-cpu")),
    Check("kosmoss on 1 GPU ÷ raw GPU loop (GPU-resident data)", ">= 0.80",
          lambda rows: _row_figure(rows, "kosmoss-gpu", "ratio"), lambda v: v >= 0.80,
          ("kosmoss-gpu", "raw-gpu"), context=lambda rows: lightning_share(rows, "gpu")),
    Check("predicted ÷ measured samples/s, ddp-cpu-2", "1 ± 0.25",
          lambda rows: _row_figure(rows, "ddp-cpu-2", "predicted_over_measured"),
          lambda v: abs(v - 1) <= 0.25, ("ddp-cpu-2", "kosmoss-cpu")),
    Check("predicted ÷ measured samples/s, nodes-cpu-2x1", "1 ± 0.25",
          lambda rows: _row_figure(rows, "nodes-cpu-2x1", "predicted_over_measured"),
          lambda v: abs(v - 1) <= 0.25, ("nodes-cpu-2x1", "kosmoss-cpu")),
    Check("predicted ÷ measured samples/s, nodes-gpu-2x1 (2 ranks share 1 GPU)", "1 ± 0.25",
          lambda rows: _row_figure(rows, "nodes-gpu-2x1", "predicted_over_measured"),
          lambda v: abs(v - 1) <= 0.25, ("nodes-gpu-2x1", "kosmoss-gpu")),
    Check("the headline set-up (2 simulated nodes sharing 1 GPU): samples/s", ">= 2,000,000",
          lambda rows: _row_figure(rows, "nodes-gpu-2x1", "samples_per_s"),
          lambda v: v >= 2_000_000, ("nodes-gpu-2x1",)),
    Check("kosmoss at the ladder's top ÷ the raw rung with the same features, same batch",
          ">= 0.90", lambda rows: _row_figure(rows, "kosmoss-gpu-top", "ratio"),
          lambda v: v >= 0.90, ("kosmoss-gpu-top", f"ladder-{TOP.name}")),
    Check("kosmoss bf16 on 1 GPU, its fastest set-up: samples/s", ">= 20,000,000",
          lambda rows: _best(rows, ("kosmoss-gpu-top", "kosmoss-gpu-top-max")),
          lambda v: v >= 20_000_000, ("kosmoss-gpu-top",)),
    Check("kosmoss bf16 on 1 GPU, large preset: samples/s", ">= 2,000,000",
          lambda rows: _row_figure(rows, "kosmoss-gpu-bf16", "samples_per_s"),
          lambda v: v >= 2_000_000, ("kosmoss-gpu-bf16",), large_only=True),
]


def checks(rows: Dict[str, dict], n_samples: int) -> List[dict]:
    """The figures the project aims for, each judged when its rows were measured."""
    found = []
    for check in CHECKS:
        value = check.figure(rows)
        note = None
        if value is None and hasattr(check.figure, "judged_at") and _row_figure(
                rows, check.needs[0], "ratio") is not None:
            note = f"judged at {check.figure.judged_at} only"
        elif value is None:
            missing = [r for r in check.needs if rows.get(r, {}).get("status") != "measured"]
            note = "not measured: " + ", ".join(
                f"{r} {rows[r]['status'] if r in rows else 'not selected'}" for r in missing) \
                if missing else _why_no_figure(rows, check.needs[0])
        elif check.large_only and n_samples != LARGE_PRESET_SAMPLES:
            note = f"judged on the large preset only (this dataset: {n_samples:,} samples)"
        passed = None if note else bool(check.passes(value))
        found.append({"name": check.name, "value": value, "target": check.target,
                      "passed": passed, "note": note,
                      "context": None if note or not check.context else check.context(rows)})
    return found


def _best(rows: Dict[str, dict], row_ids: Sequence[str]) -> Optional[float]:
    found = [_row_figure(rows, row_id, "samples_per_s") for row_id in row_ids]
    found = [value for value in found if value is not None]
    return max(found) if found else None


def _why_no_figure(rows: Dict[str, dict], row_id: str) -> str:
    return rows[row_id].get("prediction_note") or f"{row_id} has no figure for it"


def build_row(setup: Setup, batch_size: int, measurements: List[dict],
              skipped: Optional[str] = None) -> dict:
    """One row of bench.json: what it is, its status, its repeats and their medians."""
    row = {"id": setup.id, "label": setup.label, "kind": setup.kind, "device": setup.device,
           "ranks": setup.ranks, "precision": "bf16-mixed" if setup.bf16 else "32-true",
           "batch_size": batch_size, "versus": setup.versus, "single": setup.single}
    errors = [m["error"] for m in measurements if m.get("error")]
    if skipped:
        return {**row, "status": "skipped", "reason": skipped, "repeats": []}
    if errors:
        return {**row, "status": "failed", "reason": errors[0], "repeats": measurements}
    return {**row, "status": "measured", "reason": None, "repeats": measurements,
            **summarize(measurements)}



def attach_prediction(row: dict, predicted: Optional[dict], note: Optional[str] = None) -> None:
    """Put a row's predicted figures beside its measured ones (in place); ``note`` says
    why there is no prediction."""
    samples = predicted["samples_per_s"] if predicted else None
    row["predicted_samples_per_s"] = samples
    row["predicted_over_measured"] = ratio(samples, row.get("samples_per_s"))
    row["prediction"] = predicted
    row["prediction_note"] = note
