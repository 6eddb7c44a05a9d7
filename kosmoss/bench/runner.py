"""The whole bench: every selected set-up, repeats interleaved, then the figures.

Interleaving (repeat 1 of every row, then repeat 2, ...) makes a drift in the machine's
load hit every row alike instead of one row's whole series.
"""
from __future__ import annotations

import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from . import figures
from .measure import measure_once
from .setups import Machine, Plan, Setup, skip_reason

TARGET_DEFINITION = (
    f"val_loss <= {figures.TARGET_MARGIN} x the final val_loss of the device's 1-process "
    "kosmoss row (kosmoss-cpu, kosmoss-gpu; median over repeats); time from launching a "
    "row's command to the end of the first validation below it (validation after every epoch)"
)


def run_matrix(setups: Sequence[Setup], plan: Plan, machine: Machine, out_dir: Path,
               echo: Callable[[str], None]) -> Dict[str, dict]:
    """Measure every set-up that can run here ``plan.repeats`` times; rows by id."""
    skipped = {s.id: skip_reason(s, machine, plan) for s in setups}
    runnable = [s for s in setups if not skipped[s.id]]
    measurements: Dict[str, List[dict]] = {s.id: [] for s in runnable}
    for setup in setups:
        if skipped[setup.id]:
            echo(f"skip {setup.id}: {skipped[setup.id]}")
    for repeat in range(plan.repeats):
        for setup in runnable:
            done = measurements[setup.id]
            if any(m.get("error") for m in done):
                continue  # it failed once: its figures would not mean much
            measurement = measure_once(setup, plan, out_dir, repeat)
            done.append(measurement)
            echo(f"repeat {repeat + 1}/{plan.repeats} {setup.id}: {_progress(measurement)}")
    return {s.id: figures.build_row(s, plan.batch_for(s), measurements.get(s.id, []),
                                    skipped=skipped[s.id]) for s in setups}


def _progress(measurement: dict) -> str:
    if measurement.get("error"):
        return f"failed, {measurement['error']}"
    speed = measurement.get("samples_per_s")
    return (f"{speed:,.0f} samples/s" if speed else "no steady-state steps") + \
        f" ({measurement['wall_s']:.0f} s)"


def command_line() -> str:
    """How the bench was started, as a user would type it again."""
    program = Path(sys.argv[0]).name
    program = "python -m kosmoss" if program == "__main__.py" else shlex.quote(program)
    return " ".join([program, shlex.join(sys.argv[1:])])


def assemble(setups: Sequence[Setup], rows: Dict[str, dict], plan: Plan, out_dir: Path,
             machine_facts: dict, quick: bool) -> dict:
    """bench.json: what ran where, every row (skipped ones with their reason), the checks."""
    goals = figures.complete(setups, rows)
    return {
        "kosmoss_bench": 1,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command_line(),
        "quick": quick,
        "out_dir": str(out_dir),
        "plan": {
            "dataset": str(plan.dataset), "dataset_name": plan.dataset.name,
            "n_samples": plan.n_samples, "n_train": plan.n_train,
            "batch_size": plan.batch_size, "gpu_batch_size": plan.gpu_batch_size,
            "steps": plan.steps, "warmup_steps": 1, "repeats": plan.repeats, "seed": plan.seed,
        },
        "machine": machine_facts,
        "target_definition": TARGET_DEFINITION,
        "targets": goals,
        "rows": [rows[s.id] for s in setups],
        "checks": figures.checks(rows, plan.n_samples),
    }
