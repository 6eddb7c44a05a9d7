"""Every private name of Lightning (and of torch) that kosmoss reads, writes or relies on,
in one place: the list (:data:`NAMES`) and the only code that touches them.

A Lightning release that renames one of these would otherwise surface as a wrong resume or
a silent slowdown, not as an error. ``tests/run/test_lightning_private.py`` checks every
entry against the installed Lightning and torch (the attribute exists, with the shape used;
the checkpoint key holds the counters read) and fails naming it; it also fails when one of
these names appears in another kosmoss module, except where that module overrides the name
(``kind == "override"``, its ``users``). pyproject.toml pins pytorch-lightning to the minor
versions this was checked on; docs/maintaining.md says how to move to the next one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple


@dataclass(frozen=True)
class PrivateName:
    owner: str  # "module:Class" it lives on, "checkpoint" for a checkpoint's key path
    name: str  # the attribute, or the key path joined by "/"
    kind: str  # attribute | method | override | checkpoint key | function | behaviour
    users: Tuple[str, ...]  # the kosmoss modules that depend on it
    why: str


_PL = "pytorch_lightning"
NAMES: Tuple[PrivateName, ...] = (
    PrivateName(f"{_PL}.core.module:LightningModule", "_current_fx_name", "attribute",
                ("kosmoss.run.lean",), "the hook name Lightning sets 44 times a step"),
    PrivateName(f"{_PL}.core.module:LightningModule", "_trainer", "attribute",
                ("kosmoss.run.lean",), "the trainer, or None (the .trainer property raises)"),
    PrivateName(f"{_PL}.callbacks.model_checkpoint:ModelCheckpoint", "_every_n_train_steps",
                "attribute", ("kosmoss.run.lean",), "whether its batch hook can save"),
    PrivateName(f"{_PL}.callbacks.model_checkpoint:ModelCheckpoint", "_train_time_interval",
                "attribute", ("kosmoss.run.lean",), "whether its batch hook can save"),
    PrivateName(f"{_PL}.callbacks.model_checkpoint:ModelCheckpoint", "_last_global_step_saved",
                "attribute", ("kosmoss.run.callbacks",), "whether last.ckpt holds the final step"),
    PrivateName(f"{_PL}.callbacks.model_checkpoint:ModelCheckpoint", "_save_last_checkpoint",
                "method", ("kosmoss.run.callbacks",), "save last.ckpt at the end of training"),
    PrivateName(f"{_PL}.callbacks.model_checkpoint:ModelCheckpoint", "_monitor_candidates",
                "method", ("kosmoss.run.callbacks",), "the metrics last.ckpt is saved with"),
    PrivateName(f"{_PL}.loops.training_epoch_loop:_TrainingEpochLoop", "_batches_that_stepped",
                "attribute", ("kosmoss.run.chunks",), "the loggers' step axis, set to the "
                "optimizer's when a loop step holds several"),
    PrivateName(f"{_PL}.loops.training_epoch_loop:_TrainingEpochLoop",
                "_broadcast_sigterm_tensor", "method", ("kosmoss.run.preemption",),
                "a collective before every step; kosmoss agrees on stops about once a second"),
    PrivateName(f"{_PL}.loops.training_epoch_loop:_TrainingEpochLoop", "batch_progress",
                "attribute", ("kosmoss.run.preemption", "kosmoss.data.datamodule"),
                "the epoch's batches done, and whether this one is its last (loop internals)"),
    PrivateName(f"{_PL}.loops.optimization.manual:_ManualOptimization", "optim_step_progress",
                "attribute", ("kosmoss.run.chunks",), "the steps a CUDA graph replay made, "
                "counted as LightningOptimizer.step counts them"),
    PrivateName(f"{_PL}.loops.evaluation_loop:_EvaluationLoop", "inference_mode", "attribute",
                ("kosmoss.engines.horovod",), "evaluate under no_grad (Horovod's thread)"),
    PrivateName(f"{_PL}.strategies.launchers.subprocess_script:_SubprocessScriptLauncher",
                "procs", "attribute", ("kosmoss.run.faults",), "the local ranks it started"),
    PrivateName(f"{_PL}.trainer.call:_call_callback_hooks", "callable(hook)", "behaviour",
                ("kosmoss.run.lean",), "a per-batch hook set to None is skipped"),
    PrivateName("lightning_fabric.loggers.csv_logs:_ExperimentWriter", "_check_log_dir_exists",
                "override", ("kosmoss.run.faults",), "where it would delete a resumed run's "
                "metrics.csv; also reads metrics_keys, metrics_file_path, _fs"),
    PrivateName(f"{_PL}.loggers.csv_logs:CSVLogger", "_experiment", "override",
                ("kosmoss.run.faults",), "the writer the experiment property builds once"),
    PrivateName("checkpoint", "loops/fit_loop/state_dict/combined_loader", "checkpoint key",
                ("kosmoss.run.loops",), "each train loader's state_dict() (batches done)"),
    PrivateName("checkpoint", "loops/fit_loop/epoch_loop.batch_progress", "checkpoint key",
                ("kosmoss.run.loops",), "the epoch's batches, counted by the saving run"),
    PrivateName("checkpoint", "loops/fit_loop/epoch_progress", "checkpoint key",
                ("kosmoss.run.loops",), "epochs started and completed"),
    PrivateName("checkpoint",
                "loops/fit_loop/epoch_loop.automatic_optimization.optim_progress",
                "checkpoint key", ("kosmoss.run.loops",), "steps made by automatic optimisation"),
    PrivateName("checkpoint", "loops/fit_loop/epoch_loop.manual_optimization.optim_step_progress",
                "checkpoint key", ("kosmoss.run.loops",), "steps made by manual optimisation"),
    PrivateName("checkpoint", "loops/fit_loop/epoch_loop.state_dict/_batches_that_stepped",
                "checkpoint key", ("kosmoss.run.loops",), "the loggers' step axis at the save"),
    PrivateName(f"{_PL}.loops.fit_loop:_FitLoop", "update_restart_stage", "behaviour",
                ("kosmoss.run.loops",), "a checkpoint in the form of one saved at a training "
                "batch's end resumes exactly; the other forms do not (kosmoss.run.loops)"),
    PrivateName(f"{_PL}.loops.training_epoch_loop:_TrainingEpochLoop", "_skip_next_val",
                "attribute", ("kosmoss.run.divergence",), "no validation at the end of the "
                "epoch whose last step made the weights NaN (Lightning's own skip after a resume)"),
    PrivateName(f"{_PL}.loops.training_epoch_loop:_TrainingEpochLoop", "max_steps", "behaviour",
                ("kosmoss.run.preemption", "kosmoss.run.divergence"), "read after every step: "
                "set to the step made, the fit ends there as at --max-steps; should_stop would "
                "validate and log a row"),
    PrivateName("torch.distributed", "_compute_bucket_assignment_by_size", "function",
                ("kosmoss.scaling.projection", "kosmoss.exercises.lesson09"),
                "DDP's own bucket split: the projection's all-reduces, lesson 9's checker"),
    PrivateName("torch.nn.parallel:DistributedDataParallel", "_get_ddp_logging_data", "method",
                ("kosmoss.bench.own_ddp", "kosmoss.bench.ddp_anatomy"), "the buckets DDP "
                "rebuilt after its first step, in bytes: the benchmarks report and replay them"),
    PrivateName("torch._utils", "_flatten_dense_tensors", "function",
                ("kosmoss.bench.ddp_anatomy",), "one flat all-reduce, as DDP's buckets do"),
    PrivateName("torch._utils", "_unflatten_dense_tensors", "function",
                ("kosmoss.bench.ddp_anatomy",), "the flat all-reduce's result, per gradient"),
    PrivateName("torch._dynamo.utils", "counters", "attribute", ("kosmoss.run.train",),
                "how many graphs torch.compile made: --compile is seen to work"),
    PrivateName("torch.optim.optimizer:Optimizer", "_opt_called", "attribute",
                ("kosmoss.engines.horovod",), "torch's scheduler-order warning"),
    PrivateName("torch.optim.lr_scheduler", "_wrapped_by_lr_sched", "attribute",
                ("kosmoss.engines.horovod",), "torch's scheduler-order warning"),
)

# ---- the LightningModule

HOOK_NAME_ATTRIBUTE = "_current_fx_name"


def attached_trainer(module):
    """The Trainer a LightningModule is attached to, or None."""
    return module._trainer


# ---- ModelCheckpoint


def saves_during_epochs(callback) -> bool:
    """Whether a ModelCheckpoint saves from its batch hook (every N steps or an interval)."""
    return callback._every_n_train_steps >= 1 or callback._train_time_interval is not None


def last_saved_step(callback) -> int:
    return callback._last_global_step_saved


def save_last(callback, trainer) -> None:
    """Write ``last.ckpt`` now, with the metrics ModelCheckpoint would give it."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


# ---- the training loop


def _epoch_loop(trainer):
    return trainer.fit_loop.epoch_loop


def set_logged_steps(trainer, steps: int) -> None:
    """The loggers' step axis (Lightning adds 1 after each of its loop steps)."""
    _epoch_loop(trainer)._batches_that_stepped = steps


def drop_sigterm_broadcast(trainer) -> None:
    """Lightning broadcasts rank 0's SIGTERM flag before every training step of a world
    larger than one; a no-op in its place (kosmoss's handlers never set the flag)."""
    epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        epoch_loop._broadcast_sigterm_tensor = lambda: None


def end_fit_here(trainer) -> None:
    """End the fit after the step just made, as ``--max-steps`` would: the epoch's end
    (validation, checkpoints) only if this was its last batch. ``trainer.should_stop``
    would validate now and log this step's metrics off the loggers' cadence."""
    _epoch_loop(trainer).max_steps = trainer.global_step


def skip_next_validation(trainer) -> None:
    """The epoch that ends now ends without its validation (and the checkpoints saved then)."""
    _epoch_loop(trainer)._skip_next_val = True


def on_last_batch(trainer) -> bool:
    """Whether the batch just trained is its epoch's last."""
    return _epoch_loop(trainer).batch_progress.is_last_batch


def batches_done(trainer) -> int:
    """The current epoch's batches Lightning has finished (its fetcher reads one ahead)."""
    return _epoch_loop(trainer).batch_progress.current.processed


def count_manual_step(trainer) -> None:
    """One optimizer step made outside LightningOptimizer.step (a CUDA graph replay), counted
    as its hooks count it: global_step is this progress's completed steps."""
    progress = _epoch_loop(trainer).manual_optimization.optim_step_progress
    progress.increment_ready()
    progress.increment_completed()


def evaluation_loops(trainer) -> Iterator:
    return iter((_epoch_loop(trainer).val_loop, trainer.validate_loop, trainer.test_loop,
                 trainer.predict_loop))


def spawned_ranks(trainer) -> List:
    """The local ranks (``subprocess.Popen``) Lightning's launcher started from here."""
    return getattr(trainer.strategy.launcher, "procs", None) or []


# ---- the checkpoint's loop state


BATCH_PROGRESS = "epoch_loop.batch_progress"
EPOCH_PROGRESS = "epoch_progress"
AUTOMATIC_STEPS = "epoch_loop.automatic_optimization.optim_progress"
MANUAL_STEPS = "epoch_loop.manual_optimization.optim_step_progress"
LOGGED_STEPS = "epoch_loop.state_dict"


def fit_loop_state(checkpoint: dict) -> Optional[dict]:
    """The fit loop's saved progress, or None (a checkpoint saved outside fit)."""
    return checkpoint.get("loops", {}).get("fit_loop") or None


def loader_states(fit_loop: dict) -> List[dict]:
    """The train loaders' own ``state_dict()`` as the checkpoint holds them."""
    return fit_loop.get("state_dict", {}).get("combined_loader") or [{}]


def set_saved_logged_steps(fit_loop: dict, steps: int) -> None:
    """The loggers' step axis as the checkpoint restores it."""
    fit_loop.setdefault(LOGGED_STEPS, {})["_batches_that_stepped"] = steps


def saved_logged_steps(fit_loop: dict) -> int:
    return fit_loop.get(LOGGED_STEPS, {}).get("_batches_that_stepped", 0)


def step_progresses(fit_loop: dict) -> Tuple[dict, dict, dict]:
    """The step counters of both optimisations: (automatic step, automatic zero_grad,
    manual step), each a Lightning progress dict with "total" and "current"."""
    automatic = fit_loop[AUTOMATIC_STEPS]["optimizer"]
    return automatic["step"], automatic["zero_grad"], fit_loop[MANUAL_STEPS]


# ---- torch


def bucket_assignment(tensors, caps) -> list:
    """DDP's own split of gradients into buckets (reverse order, size caps)."""
    return bucket_assignment_function()(tensors, caps)


def bucket_assignment_function():
    """The built-in itself: lesson 9's checker tells a learner who calls it so."""
    import torch.distributed as dist

    return dist._compute_bucket_assignment_by_size


def ddp_logging_data(ddp) -> dict:
    """What a DistributedDataParallel logs about itself (its buckets among them)."""
    return ddp._get_ddp_logging_data()


def ddp_bucket_bytes(ddp) -> List[int]:
    """The sizes in bytes of the buckets a DistributedDataParallel all-reduces each step, as
    it rebuilt them after its first step (in the order gradients became ready)."""
    return [int(size) for size in ddp_logging_data(ddp)["rebuilt_bucket_sizes"].split(",")]


def flatten(tensors):
    from torch._utils import _flatten_dense_tensors

    return _flatten_dense_tensors(tensors)


def unflatten(flat, tensors):
    from torch._utils import _unflatten_dense_tensors

    return _unflatten_dense_tensors(flat, tensors)


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process (Dynamo's own count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def track_scheduler_order(optimizer, step: Callable) -> Callable:
    """``step`` wrapped as torch's LR schedulers wrap ``optimizer.step`` (their warning
    when the scheduler steps first keeps its meaning); ``step`` itself if already wrapped."""
    if hasattr(step, "_wrapped_by_lr_sched"):
        return step

    def tracked_step(*args, **kwargs):
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked_step._wrapped_by_lr_sched = True
    return tracked_step
