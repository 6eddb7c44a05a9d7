"""``train(plan) -> Outcome``: build the Trainer a :class:`RunPlan` describes, fit, then
evaluate the final weights exactly.

Lightning's launcher re-runs the same command for every extra local rank, so this runs in
every process: each rank records itself (kosmoss.launch.records), trains its share, and only
global zero writes (Lightning's rank-zero rule).

What a failure leaves is in kosmoss.run.faults (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import TensorBoardLogger

from ..core.errors import RunFailed
from ..data.splits import SPLITS
from ..diagnose.hang import (StartupCheck, dump_stacks, flight_recorder_env,
                             is_collective_timeout, timeout_line, who_hangs)
from ..diagnose.heartbeat import Heartbeat
from ..launch.topology import Launcher, cluster_environment
from . import lightning_private as private
from .callbacks import (BatchesProgressBar, CheckpointToTheEnd, ExactAllReduce, GpuShare,
                        LogsWithCheckpoints, PrecisionProbe, ReplicaCheck, ThroughputMeter)
from .chunks import StepsInChunks
from .datamodule import RunDataModule
from .divergence import StopWhenDiverged
from .faults import AtomicCheckpointIO, ContinuedCSVLogger, DeadRankNamed
from .graphs import GraphsOnTheDevice
from .lean import LeanLitMLP, NoProfiler
from .loops import ExactResume
from .plan import RunPlan
from .preemption import StopOnSignal
from .quiet import quiet_lightning

SCORES = ("val_loss", "val_rmse_wm2", "test_loss", "test_rmse_wm2")


@dataclass(frozen=True)
class Outcome:
    """What a trained plan gives back to be reported."""

    is_global_zero: bool
    global_step: int
    epochs: int
    scores: Dict[str, Optional[float]]
    meter: ThroughputMeter
    replica_checksums: List[str]
    activation_dtype: Optional[str]
    params: int
    stopped_by: Optional[str]
    diverged: Optional[dict]  # what was NaN or inf, at which step (kosmoss.run.divergence)
    # Under Slurm, after SIGUSR1: requeue the job (returns its id). Called once the records
    # and result.json say "stopped": Slurm's SIGTERM to the job's tasks follows at once.
    requeue: Callable[[], Optional[str]] = lambda: None
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def replicas_identical(self) -> bool:
        return len(set(self.replica_checksums)) == 1


def train(plan: RunPlan) -> Outcome:
    """Fit and evaluate; the caller records this process's part of the run around it."""
    config = plan.config
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(config.seed, workers=True, verbose=False)
    steps = plan.steps_per_execution
    # The lesson's data module and model, with the run path's trims (kosmoss.run.lean) and
    # K optimizer steps per step of Lightning's loop (kosmoss.run.chunks).
    datamodule = RunDataModule(plan.dataset, batch_size=plan.scaling.per_device_batch_size,
                               mode=plan.data_mode, splits=SPLITS, seed=config.seed,
                               num_workers=plan.num_workers, steps_per_execution=steps,
                               chunked=steps > 1 or config.cuda_graphs)
    # A CUDA graph replays a chunk's steps: chunks even of one step (kosmoss.run.graphs).
    model_class = StepsInChunks if steps > 1 or config.cuda_graphs else LeanLitMLP
    model = model_class(plan.dataset.n_x, config.hidden, plan.dataset.n_y, lr=plan.scaling.lr,
                        stats=plan.dataset.statistics(), warmup_steps=plan.scaling.warmup_steps,
                        warmup_start_lr=plan.scaling.base_lr)
    model.capturable = config.cuda_graphs
    if config.compile:
        # The network's forward, so the state dict keeps its names. Not nn.Module.compile():
        # it compiles Module._call_impl, a frame Dynamo skips, and so runs eagerly (torch
        # 2.11 and 2.13, tests/run/test_graphs.py).
        model.net.forward = torch.compile(model.net.forward)
    meter, replicas, probe = ThroughputMeter(), ReplicaCheck(), PrecisionProbe()
    divergence = StopWhenDiverged()
    stopper = StopOnSignal(plan.run_dir / "checkpoints",
                           halted=lambda: divergence.found is not None,
                           diverged_before_save=divergence.diverged_once_settled)
    # DeadRankNamed first: its one line must be decided before other hooks run on a failure;
    # divergence before the stop: NaN weights are never saved as a preemption's checkpoint.
    # All LeanCallbacks: Lightning calls only the per-batch hooks each one defines.
    callbacks = [DeadRankNamed(plan.run_dir), meter, replicas, probe, divergence, stopper,
                 Heartbeat(plan.run_dir), GpuShare(plan.share), ExactResume(steps),
                 LogsWithCheckpoints(), ExactAllReduce()]
    if config.cuda_graphs:
        callbacks.append(GraphsOnTheDevice(plan.scaling.per_device_batch_size, steps))
    if plan.engine.uses_process_group and plan.scaling.world_size > 1:
        callbacks.append(StartupCheck(plan.collective_timeout.total_seconds()))
    if plan.share.backend == "nccl":  # set before the group starts; spawned ranks inherit it
        os.environ.update(flight_recorder_env(plan.run_dir))
    with quiet_lightning(), _stacks_on_timeout(plan):
        trainer = build_trainer(plan, callbacks)
        trainer.fit(model, datamodule=datamodule, ckpt_path=plan.resume_from)
        if meter.trained_from_step is None:
            _finish_skipped_fit(trainer, model, meter, replicas)
        ended_early = stopper.stopped_by or divergence.found
        scores = {} if ended_early else _evaluate(trainer, model, datamodule, meter)
        divergence.after_fit(scores, trainer.global_step)
    outcome = Outcome(
        is_global_zero=trainer.is_global_zero, global_step=trainer.global_step,
        epochs=trainer.current_epoch, scores={name: scores.get(name) for name in SCORES},
        meter=meter, replica_checksums=replicas.checksums,
        activation_dtype=probe.activation_dtype,
        params=sum(p.numel() for p in model.parameters()),
        stopped_by=None if divergence.found else stopper.stopped_by, diverged=divergence.found,
        requeue=stopper.requeue_if_asked if trainer.is_global_zero else (lambda: None),
        extra=_graph_figures(config, model),
    )
    plan.engine.shutdown()  # last: the trainer's rank questions need the engine up (Horovod)
    return outcome


def _graph_figures(config, model) -> Dict[str, object]:
    """How --compile and --cuda-graphs went: the graphs torch.compile made, the chunks
    replayed and run eagerly, and a failed capture said as a warning of the run (it
    trained on, eagerly)."""
    found: Dict[str, object] = {}
    if config.compile:
        found["compiled_graphs"] = private.compiled_graphs()
    if not config.cuda_graphs:
        return found
    figures = GraphsOnTheDevice.report(model)
    failed = figures["capture_failed"]
    return {**found, "cuda_graphs": figures,
            "warnings": [f"--cuda-graphs: the capture failed ({failed}): every step ran eagerly"
                         ] if failed else []}


def _finish_skipped_fit(trainer: pl.Trainer, model, meter: ThroughputMeter,
                        replicas: ReplicaCheck) -> None:
    """A resume from the end of training: Lightning skips the fit and its hooks (no
    on_train_start or on_train_end). What they record is recorded all the same."""
    meter.trained_from_step = trainer.global_step
    replicas.on_train_end(trainer, model)
    trainer.checkpoint_callback.finish(trainer)


@contextlib.contextmanager
def _stacks_on_timeout(plan: RunPlan) -> Iterator[None]:
    """A collective that times out (a hung or missing rank): write every rank's stack into
    the run directory, then fail with one line that says where."""
    try:
        yield
    except Exception as err:
        if not is_collective_timeout(err):
            raise
        stacks, dump = dump_stacks(plan.run_dir)
        what = timeout_line(err, plan.collective_timeout.total_seconds(), who_hangs(dump))
        raise RunFailed(f"{what}; stacks of every process of the run in {stacks}") from err


LOG_EVERY_N_STEPS = 50  # Lightning's default; fewer when validations come more often


def log_every_n_steps(steps_per_epoch: int, val_every_n_epochs: int = 1) -> int:
    """A train-loss row at least once between two validations. A shorter interval syncs
    the GPU more often: logging reads the loss (one sync a row), so epochs of one step,
    validated and logged every step, left the GPU idle between steps."""
    return max(1, min(LOG_EVERY_N_STEPS, steps_per_epoch * val_every_n_epochs))


def build_trainer(plan: RunPlan, callbacks: list) -> pl.Trainer:
    config, topology, scaling = plan.config, plan.topology, plan.scaling
    steps_per_epoch = max(1, plan.split_sizes["train"] // scaling.global_batch_size)
    stopper = next((c for c in callbacks if isinstance(c, StopOnSignal)), None)
    divergence = next((c for c in callbacks if isinstance(c, StopWhenDiverged)), None)

    def saves_no_more() -> bool:  # a stop cut the epoch short, or the weights are gone
        return bool(stopper and stopper.stopped_mid_epoch or divergence and divergence.found)

    callbacks = callbacks + [
        CheckpointToTheEnd(dirpath=plan.run_dir / "checkpoints", monitor="val_loss", save_last=True,
                           saves_no_more=saves_no_more),
    ]
    if config.progress:
        callbacks.append(BatchesProgressBar())
    # Who is who under torchrun and srun: Lightning's ClusterEnvironments (Horovod's strategy
    # brings its own).
    external = topology.launcher.external and topology.launcher is not Launcher.HOROVODRUN
    environment = [cluster_environment(topology.launcher)] if external else None
    plugins = [AtomicCheckpointIO()] + (environment or [])
    host = (topology.devices_per_node, topology.first_rank_on_host)
    return pl.Trainer(
        accelerator=plan.policy.accelerator,
        devices=plan.policy.trainer_devices(*host),
        num_nodes=topology.num_nodes,
        strategy=plan.engine.strategy(plan.share, scaling.world_size, plan.collective_timeout,
                                      plan.policy.rank_devices(*host)),
        max_epochs=config.max_epochs,
        max_steps=config.max_steps,
        check_val_every_n_epoch=config.val_every_n_epochs,
        precision=config.precision,
        logger=run_loggers(plan),
        callbacks=callbacks,
        # FlattenedDataModule already gives each rank its share of every batch.
        use_distributed_sampler=False,
        plugins=plugins,
        log_every_n_steps=log_every_n_steps(steps_per_epoch, config.val_every_n_epochs),
        enable_progress_bar=config.progress,
        enable_model_summary=False,  # the parameter count is in the summary line
        profiler=NoProfiler(),
        default_root_dir=plan.run_dir,
    )


def run_loggers(plan: RunPlan) -> list:
    """Where a run's metrics go: TensorBoard, and a CSV that a resumed run continues."""
    return [TensorBoardLogger(plan.run_dir, name="tensorboard", version=""),
            ContinuedCSVLogger(plan.run_dir, name="csv", version="",
                               resumed_from_step=plan.resumed_from_step)]


def _evaluate(trainer: pl.Trainer, model: LeanLitMLP, datamodule, meter: ThroughputMeter) -> dict:
    """Validation scores of the final weights (run again if --max-steps ended mid-epoch),
    then the test scores; read before testing, which resets the trainer's metrics."""
    if not meter.val_curve or meter.val_curve[-1]["step"] != trainer.global_step:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    elif "val_loss" not in trainer.callback_metrics:
        # A resume from the fit's end: its stopped attempt validated these weights, but a
        # checkpoint keeps no callback metrics. Again, then, unlogged: metrics.csv has the row.
        with _unlogged(trainer):
            trainer.validate(model, datamodule=datamodule, verbose=False)
    scores = {name: _metric(trainer, name) for name in ("val_loss", "val_rmse_wm2")}
    return {**scores, **trainer.test(model, datamodule=datamodule, verbose=False)[0]}


@contextlib.contextmanager
def _unlogged(trainer: pl.Trainer) -> Iterator[None]:
    loggers, trainer.loggers = trainer.loggers, []
    try:
        yield
    finally:
        trainer.loggers = loggers


def _metric(trainer: pl.Trainer, name: str) -> Optional[float]:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)

