"""``report(plan, outcome)``: result.json (the contract in README.md) and the one-line
summary, written by global zero only."""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from .. import __version__
from ..core.errors import RunFailed
from ..core.files import atomic_write_json
from ..data.stats import Statistics
from .divergence import Diverged, diverged_line
from .plan import RunPlan
from .train import Outcome


class ResultNotWritten(RunFailed):
    """The run trained, but its result could not be written everywhere it was asked for."""


def report(plan: RunPlan, outcome: Outcome, *, echo: Callable[[str], None]) -> dict:
    """result.json and the summary line (global zero); :class:`ResultNotWritten` once the
    summary is out when a copy could not be written (the caller records the run first).
    A run that diverged raises :class:`~.divergence.Diverged` on every rank once its
    result is written: its line is the summary."""
    result = result_of(plan, outcome)
    if outcome.is_global_zero:
        for warning in threads_changed(plan, outcome):  # known once the checkpoint is loaded
            echo(f"warning: {warning}")
        failure = write_results(result, plan.run_dir, plan.config.result_json)
        if not outcome.diverged:
            echo(summary(result))
        if failure and not outcome.diverged:
            raise ResultNotWritten(failure)
    if outcome.diverged:
        line = diverged_line(result) + (f"; but {failure}" if outcome.is_global_zero and failure
                                        else "")
        raise Diverged(line, speaks=outcome.is_global_zero)
    return result


def result_of(plan: RunPlan, outcome: Outcome) -> dict:
    meter, config = outcome.meter, plan.config
    return {
        "run_id": plan.run_id,
        "run_dir": str(plan.run_dir),
        "dataset": str(plan.dataset.path),
        "n_samples": plan.dataset.n_samples,
        "split_sizes": dict(plan.split_sizes),
        **topology_fields(plan),
        "global_step": outcome.global_step,
        "epochs": outcome.epochs,
        "train_samples_per_s": meter.samples_per_s,
        "time_to_first_step_s": meter.first_step_s,
        "first_step_unix": meter.first_step_unix,
        "val_curve": (meter.val_curve if meter.restored_curve
                      else earlier_val_curve(plan) + meter.val_curve),
        # This process's intra-op threads: a matmul's rounding depends on them, so two runs
        # are bit for bit alike only with as many (Lightning gives each of N ranks cores / N).
        "torch_threads": torch_threads(),
        "peak_host_rss_mib": meter.peak_host_rss_mib,
        # What the memory check counted for one rank (kosmoss.run.memory), beside the peaks.
        "memory_estimate_mib": (plan.memory_need.total / 2**20 if plan.memory_need else None),
        "peak_gpu_mib": meter.peak_gpu_mib,
        "page_faults_per_step": meter.page_faults_per_step,
        "step_time_cv": meter.step_time_cv,  # std ÷ mean of each rank's timed steps
        "loop_step_s": meter.loop_step_s,  # Lightning's loop between chunks (run.chunks)
        **outcome.scores,
        "mean_baseline_loss": mean_baseline_loss(plan.dataset.statistics()),
        "params": outcome.params,
        "replica_checksums": outcome.replica_checksums,
        "replicas_identical": outcome.replicas_identical,
        "precision": config.precision,
        "activation_dtype": outcome.activation_dtype,
        "stopped_by": outcome.stopped_by,
        "diverged": outcome.diverged,  # what was NaN or inf, at which step; else null
        "resumed_from": str(plan.resume_from) if plan.resume_from else None,
        "resumed_from_step": plan.resumed_from_step,
        "trained_from_step": meter.trained_from_step,
        "collective_timeout_s": plan.collective_timeout.total_seconds(),
        "warnings": (list(plan.warnings) + list(outcome.extra.get("warnings", []))
                     + threads_changed(plan, outcome)),
        "compile": config.compile,
        "compiled_graphs": outcome.extra.get("compiled_graphs"),  # torch.compile's, this process
        "cuda_graphs": outcome.extra.get("cuda_graphs"),
        "seed": config.seed,
        "config": config.as_dict(),
        "versions": versions(),
    }


def earlier_val_curve(plan: RunPlan) -> list:
    """A resumed run's curve starts with the points of the attempts before it, up to the
    step it resumed from: its checkpoint holds them (ThroughputMeter's state); one saved
    before checkpoints held them has the stopped attempt's result.json."""
    if plan.resumed_from_step is None:
        return []
    try:
        earlier = json.loads((plan.run_dir / "result.json").read_text()).get("val_curve") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [point for point in earlier if point.get("step", 0) <= plan.resumed_from_step]


def topology_fields(plan: RunPlan) -> dict:
    scaling, policy, share, world = plan.scaling, plan.policy, plan.share, plan.scaling.world_size
    return {
        "launcher": plan.topology.launcher.value,
        "world_size": world,
        "num_nodes": scaling.num_nodes,
        "devices_per_node": scaling.devices_per_node,
        "accelerator": policy.accelerator,
        "device": str(policy.device),
        "strategy": plan.engine.strategy_name(world),
        "backend": plan.engine.backend(share, world),
        "gpu_memory_fraction": share.memory_fraction if policy.gpu else None,
        "data_mode": plan.data_mode,  # what --mode auto chose: where the batches come from
        "steps_per_execution": plan.steps_per_execution,  # optimizer steps per loop step
        "global_batch_size": scaling.global_batch_size,
        "per_device_batch_size": scaling.per_device_batch_size,
        "base_batch_size": scaling.base_batch_size,
        "base_lr": scaling.base_lr,
        "lr": scaling.lr,
        "lr_rule": scaling.lr_rule,
        "lr_factor": scaling.lr_factor,
        "warmup_steps": scaling.warmup_steps,
    }


def summary(result: dict) -> str:
    if result["stopped_by"]:
        return (f"stopped by {result['stopped_by']} at step {result['global_step']}, checkpoint "
                f"saved; continue with --resume {result['run_id']}")
    speed = result["train_samples_per_s"]
    return (f"val_loss {result['val_loss']:.4g} (predicting the mean: "
            f"{result['mean_baseline_loss']:.3g}), test_loss {result['test_loss']:.4g}, "
            f"{result['params']:,} parameters, "
            f"{f'{speed:,.0f} samples/s' if speed else 'too few steps to time'}; "
            f"results in {result['run_dir']}/result.json")


def mean_baseline_loss(stats: Statistics) -> float:
    """Loss of always predicting the mean, on normalised targets: the bar to beat."""
    return float(np.mean((stats.y_std / stats.y_scale()) ** 2))


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def threads_changed(plan: RunPlan, outcome: Outcome) -> List[str]:
    """A resume on the CPU with other torch threads than the run that saved its checkpoint:
    exact in steps, data order and rows, not in the weights' last bits (docs/reliability.md)."""
    before, now = outcome.meter.threads_before, torch_threads()
    if before is None or before == now or plan.policy.gpu or \
            outcome.meter.world_before not in (None, plan.scaling.world_size):
        return []  # another world size splits the batch otherwise: said before training
    return [f"resumed on {now} torch threads where the checkpoint was saved on {before}: the "
            f"steps, data order and rows continue exactly, the weights' last bits differ from "
            f"a run never stopped (OMP_NUM_THREADS={before} keeps them alike)"]


def versions() -> dict:
    import pytorch_lightning as pl
    import torch

    return {"kosmoss": __version__, "torch": torch.__version__, "lightning": pl.__version__,
            "python": platform.python_version()}


def write_results(result: dict, run_dir: Path, extra: Optional[Path]) -> Optional[str]:
    """result.json in the run folder, and where --result-json says; what could not be
    written, in words (None: both written). One failing does not stop the other."""
    targets = [run_dir / "result.json"] + ([Path(extra)] if extra else [])
    failed, written = [], []
    for target in targets:
        try:
            atomic_write_json(target, result)
            written.append(target)
        except OSError as err:
            failed.append(f"{target} could not be written ({err.strerror or err})")
    if not failed:
        return None
    where = (f"the result is in {written[0]}" if written else
             f"its metrics are in {run_dir / 'csv' / 'metrics.csv'} and its weights in "
             f"{run_dir / 'checkpoints' / 'last.ckpt'}")
    return f"run {result['run_id']} trained, but {'; '.join(failed)}: {where}"
