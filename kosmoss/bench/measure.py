"""One measurement: run a set-up once as a subprocess and read its figures.

Times are taken against the moment the bench launched the process, so "time to first
step" and "time to the target loss" include everything a user waits for: the
interpreter, imports, the launcher starting ranks, opening the dataset.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from ..launch.lifetime import end_groups
from .setups import PACKAGE_PARENT, Plan, Setup, command, environment, last_line

# Variables of a launcher that may have started the bench itself: its rows start their own.
LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "KOSMOSS_RUN_ID",
                      "KOSMOSS_SIMULATED_NODES")
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "OMPI_COMM_WORLD_", "HOROVOD_RANK",
                     "HOROVOD_LOCAL_", "HOROVOD_SIZE", "HOROVOD_CROSS_")
STOP_GRACE_S = 15.0


def row_environment(setup: Setup, out_dir: Path) -> Dict[str, str]:
    """The bench's environment, cleaned of launcher variables, with the row's runs under
    ``out_dir/runs`` (KOSMOSS_HOME; the dataset is passed by path)."""
    env = {key: value for key, value in os.environ.items()
           if key not in LAUNCHER_VARIABLES and not key.startswith(LAUNCHER_PREFIXES)}
    python_path = [str(PACKAGE_PARENT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(KOSMOSS_HOME=str(out_dir), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(python_path), **environment(setup))
    return env


def measure_once(setup: Setup, plan: Plan, out_dir: Path, repeat: int) -> dict:
    """Figures of one run of ``setup`` (``error`` says why there are none)."""
    name = f"{setup.id}-{repeat + 1}"
    result_file, log = out_dir / "rows" / f"{name}.json", out_dir / "logs" / f"{name}.log"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)  # an earlier bench's, in a reused --out folder
    argv = command(setup, plan, result_file)
    launched = time.time()
    code = run_logged(argv, row_environment(setup, out_dir), plan.timeout_s, log)
    wall_s = time.time() - launched
    base = {"repeat": repeat + 1, "wall_s": wall_s, "command": argv, "log": str(log)}
    if code is None:
        return {**base, "error": f"timed out after {plan.timeout_s:.0f} s (log: {log})"}
    if code != 0 or not result_file.is_file():
        return {**base, "error": f"exit code {code}: {last_line(log.read_text())} (log: {log})"}
    result = json.loads(result_file.read_text())
    _drop_checkpoints(result, out_dir)
    world = result.get("world_size")
    if setup.kind == "kosmoss" and world != setup.ranks:
        return {**base, "error": f"ran with world size {world}, not {setup.ranks} (log: {log})"}
    return {**base, **figures_from(result, launched)}


def figures_from(result: dict, launched_unix: float) -> dict:
    """The bench's figures from a result.json (or a baselines JSON); times since launch."""
    first = result.get("first_step_unix")
    curve = [{"step": point["step"], "t_s": point["unix_time"] - launched_unix,
              "val_loss": point["val_loss"]} for point in result.get("val_curve") or []]
    return {
        "samples_per_s": result.get("train_samples_per_s", result.get("samples_per_s")),
        "time_to_first_step_s": None if first is None else first - launched_unix,
        "val_curve": curve,
        "val_loss": result.get("val_loss"),
        "peak_host_mib": _max(result.get("peak_host_rss_mib")),
        "peak_gpu_mib": _max(result.get("peak_gpu_mib")),
        # Minor page faults per timed step (the most of any rank): kosmoss.run.throughput.
        "page_faults_per_step": _max_of_any(result.get("page_faults_per_step")),
        # How much a step jitters (std ÷ mean), the most of any rank: kosmoss.run.throughput.
        "step_time_cv": _max_of_any(result.get("step_time_cv")),
        # A 1-process run with several steps a loop step: the loop's cost once per chunk.
        "loop_step_s": result.get("loop_step_s"),
        "steps_per_execution": result.get("steps_per_execution", 1),
        "precision": result.get("precision"),
        "world_size": result.get("world_size", 1),
        "warnings": result.get("warnings", []),
        # A ladder row: its share of the GPU's limit, and the compile or capture before it.
        "of_limit": result.get("of_limit"),
        "limit_samples_per_s": result.get("limit_samples_per_s"),
        "bound_by": result.get("bound_by"),
        "setup_s": result.get("setup_s"),
        # kosmoss rows with --cuda-graphs: chunks replayed, run eagerly, a failed capture.
        "cuda_graphs": result.get("cuda_graphs"),
        "compile": result.get("compile"),
    }


def _max(values: Optional[List[float]]) -> Optional[float]:
    values = [v for v in values or [] if v]
    return max(values) if values else None


def _max_of_any(value) -> Optional[float]:
    """The largest of a per-rank list, or the one value of a single process (0 is a value)."""
    values = value if isinstance(value, list) else [value]
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _drop_checkpoints(result: dict, out_dir: Path) -> None:
    # A bench run's checkpoints are nobody's model (~12 MB a run): keep the logs only.
    run_dir = result.get("run_dir")
    if run_dir and Path(run_dir).resolve().is_relative_to(out_dir.resolve()):
        shutil.rmtree(Path(run_dir) / "checkpoints", ignore_errors=True)


def run_logged(argv: List[str], env: Dict[str, str], timeout_s: float, log: Path) -> Optional[int]:
    """Run ``argv`` in a session of its own, output to ``log``; None if it timed out.
    On a timeout or Ctrl-C the whole process group is ended: no rank is left behind."""
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            end_group(process)
            return None
        except BaseException:
            end_group(process)
            raise


def end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the row's process group (kosmoss's launchers pass it on to their node
    processes), then SIGKILL to whatever of the group is left after a grace period."""
    end_groups([process], STOP_GRACE_S)
