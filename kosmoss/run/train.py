"""Build the Trainer from a :class:`RunConfig`, fit, test, write ``result.json``.

Lightning's launcher re-runs the same command for every extra local rank, so this
function runs in every process: rank 0 prepares data, prints and writes; the others
find the dataset and run directory ready and only train.
"""
from __future__ import annotations

import json
import os
import platform
import uuid
import warnings
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import psutil
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint, RichProgressBar
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from pytorch_lightning.plugins.environments import SLURMEnvironment
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities import rank_zero_only
from rich.console import Console

from .. import __version__, launch, paths
from ..cpus import default_num_workers
from ..data import presets
from ..data.datamodule import FlattenedDataModule
from ..data.stats import Statistics
from ..data.store import verify_checksums
from ..devices import DevicePolicy, MachineGpu, Sharing, decide, sharing
from ..environment import detect_launcher
from ..errors import RunFailed, UsageError
from ..model import LitMLP
from ..scaling import ScalingPlan, plan
from .callbacks import GpuShare, ReplicaCheck, ThroughputMeter
from .preemption import CHECKPOINT as PREEMPTED
from .preemption import StopOnSignal
from .config import RunConfig, validate
from .. import records

SPLITS = (0.8, 0.1, 0.1)
SCORES = ("val_loss", "val_rmse_wm2", "test_loss", "test_rmse_wm2")
RUN_ID_ENV = records.RUN_ID_ENV


@rank_zero_only
def say(message: str) -> None:
    Console(highlight=False, soft_wrap=True).print(message, markup=False)


@records.tracked  # run.json and this process's record say how the run ended
def run(config: RunConfig, *, echo: Callable[[str], None] = say) -> dict:
    """Check everything, then train. Bad input raises :class:`UsageError` before anything
    is written (only a missing preset dataset is prepared)."""
    config.warnings = validate(config) + list(config.warnings)
    topology = launch.resolve(config.num_processes, config.num_nodes, config.process_flag,
                              strategy=config.strategy)
    rank_zero_only.rank = topology.global_rank_hint()  # Lightning sets the same, later
    launch.check_master_port(topology)
    policy = decide(MachineGpu(config.machine_gpu, config.gpu_index), config.use_gpu,
                    require=config.require_gpu)
    config.warnings += list(policy.warnings)
    gpus_here = (len(config.gpu_ids or ()) or torch.cuda.device_count()) if policy.gpu else 0
    share = sharing(_ranks_on_host(topology), gpus_here)
    scaling = plan(config.batch_size, config.lr, config.scale_lr, num_nodes=topology.num_nodes,
                   devices_per_node=topology.devices_per_node,
                   base_batch_size=config.base_batch_size, warmup_steps=config.warmup_steps)
    dataset = presets.resolve(config.dataset, log=echo, verify=False)  # checksums: below
    _check_fits(dataset.n_samples, scaling)
    if topology.launcher != "simulated-node":  # the parent process already said it all
        for warning in config.warnings:
            echo(f"warning: {warning}")
        if scaling.world_size > 1:
            echo(f"backend: {_backend_reason(config, policy, share, topology)}")
        echo("\n".join(["scaling:"] + [f"  {line}" for line in scaling.lines()]))
    if topology.launcher == "simulate":
        return _simulate(topology, echo)

    run_dir = _run_dir(config.resume)
    resume_from = _checkpoint_to_resume(run_dir, config.resume)
    resumed_from_step = _step_of(resume_from)  # before the run overwrites last.ckpt
    if rank_zero_only.rank == 0:  # after every other check: from here on, things are written
        verify_checksums(dataset, trust_unchanged=True)  # records in the dataset what matched
        run_dir.mkdir(parents=True, exist_ok=True)
    records.start(run_dir, kind=topology.launcher, global_rank=rank_zero_only.rank)
    pl.seed_everything(config.seed, workers=True, verbose=False)
    datamodule = FlattenedDataModule(
        dataset, batch_size=scaling.per_device_batch_size, mode=config.mode, splits=SPLITS,
        seed=config.seed, num_workers=_num_workers(config, topology),
    )
    stats = dataset.statistics()
    model = LitMLP(dataset.n_x, config.hidden, dataset.n_y, lr=scaling.lr, stats=stats,
                   warmup_steps=scaling.warmup_steps, warmup_start_lr=scaling.base_lr)
    meter, replicas = ThroughputMeter(), ReplicaCheck()
    stopper = StopOnSignal(run_dir / "checkpoints")
    trainer = _trainer(config, topology, scaling, policy, share, run_dir, dataset.n_samples,
                       [meter, replicas, stopper, GpuShare(share)])
    with warnings.catch_warnings():
        # Worker count is sized per process on purpose (kosmoss.cpus): silence the hint.
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        # Lightning 2.6 calls torch APIs that torch 2.13 deprecates: nothing a user can act on.
        warnings.filterwarnings("ignore", ".*LeafSpec.*is deprecated.*")
        warnings.filterwarnings("ignore", ".*all_gather is deprecated.*")
        trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from)
        scores = {} if stopper.stopped_by else _evaluate(trainer, model, datamodule, meter)
    result = {
        "run_id": run_dir.name,
        "run_dir": str(run_dir),
        "dataset": str(dataset.path),
        "n_samples": dataset.n_samples,
        "split_sizes": {k: len(v) for k, v in datamodule.indices.items()},
        **_topology(scaling, policy, share, topology, config.strategy),
        "global_step": trainer.global_step,
        "epochs": trainer.current_epoch,
        "train_samples_per_s": meter.samples_per_s,
        "time_to_first_step_s": meter.first_step_s,
        "first_step_unix": meter.first_step_unix,
        "val_curve": meter.val_curve,
        "peak_host_rss_mib": meter.peak_host_rss_mib,
        "peak_gpu_mib": meter.peak_gpu_mib,
        **{name: scores.get(name) for name in SCORES},
        "mean_baseline_loss": mean_baseline_loss(stats),
        "params": sum(p.numel() for p in model.parameters()),
        "replica_checksums": replicas.checksums,
        "replicas_identical": replicas.identical,
        "precision": config.precision,
        "stopped_by": stopper.stopped_by,
        "resumed_from": str(resume_from) if resume_from else None,
        "resumed_from_step": resumed_from_step,
        "warnings": config.warnings,
        "seed": config.seed,
        "config": config.as_dict(),
        "versions": _versions(),
    }
    if trainer.is_global_zero:
        _write_results(result, run_dir, config.result_json)
        echo(summary(result))
        if stopper.requeue_if_asked():
            echo(f"requeued Slurm job {os.environ['SLURM_JOB_ID']}: it resumes from "
                 f"{stopper.checkpoint}")
    if torch.distributed.is_initialized():
        # Lightning leaves the group up; a rank exiting with gloo's threads alive was seen
        # to abort ("terminate called without an active exception", 1 torchrun run in 12).
        torch.distributed.destroy_process_group()
    if config.strategy == "horovod":
        from ..engines.horovod import shutdown

        shutdown()  # the strategy keeps Horovod up between fit and test; this ends it
    return result


def _evaluate(trainer: pl.Trainer, model: LitMLP, datamodule, meter: ThroughputMeter) -> dict:
    """Validation scores of the final weights (run again if --max-steps ended mid-epoch),
    then the test scores; read before testing, which resets the trainer's metrics."""
    if not meter.val_curve or meter.val_curve[-1]["step"] != trainer.global_step:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    scores = {name: _metric(trainer, name) for name in ("val_loss", "val_rmse_wm2")}
    return {**scores, **trainer.test(model, datamodule=datamodule, verbose=False)[0]}


def _checkpoint_to_resume(run_dir: Path, explicit: Optional[str]) -> Optional[Path]:
    """``--resume RUN``: its preempted (else last) checkpoint. Without it, a Slurm job that
    was requeued finds its own preempted checkpoint in its run directory."""
    folder = run_dir / "checkpoints"
    if not explicit:
        requeued = folder / PREEMPTED
        return requeued if detect_launcher() == "slurm" and requeued.is_file() else None
    found = next((p for p in (folder / PREEMPTED, folder / "last.ckpt") if p.is_file()), None)
    if found is None:
        raise UsageError(f"--resume {explicit}: no checkpoints/{PREEMPTED} or last.ckpt in "
                         f"{run_dir}; nothing to resume")
    return found


def _step_of(checkpoint: Optional[Path]) -> Optional[int]:
    if checkpoint is None:
        return None
    return int(torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"])


def summary(result: dict) -> str:
    if result["stopped_by"]:
        return (f"stopped by {result['stopped_by']} at step {result['global_step']}, checkpoint "
                f"saved; continue with --resume {result['run_id']}")
    speed = result["train_samples_per_s"]
    return (f"val_loss {result['val_loss']:.4g} (predicting the mean: "
            f"{result['mean_baseline_loss']:.3g}), test_loss {result['test_loss']:.4g}, "
            f"{f'{speed:,.0f} samples/s' if speed else 'too few steps to time'}; "
            f"results in {result['run_dir']}/result.json")


def _check_fits(n_samples: int, scaling: ScalingPlan) -> None:
    n_train = int(n_samples * SPLITS[0])
    if n_train < scaling.global_batch_size:
        raise UsageError(f"--batch-size {scaling.global_batch_size} is larger than the "
                         f"~{n_train} training samples of the dataset: use a smaller batch "
                         "or a larger --dataset")


def _simulate(topology: launch.Topology, echo) -> dict:
    run_id = _new_run_id()
    records.start(paths.runs_root() / run_id, kind=topology.launcher)  # marks the nodes
    code = launch.simulate_nodes(topology, {RUN_ID_ENV: run_id}, echo)
    if code != 0:
        raise RunFailed(f"a node process exited with code {code}; the other nodes were "
                        f"ended too (run {run_id})")
    # Node 0's rank 0 wrote result.json (and --result-json, the same flags reached it).
    return json.loads((paths.runs_root() / run_id / "result.json").read_text())


def _new_run_id() -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def _run_id() -> str:
    """Rank 0 names the run; ranks started by Lightning or by the simulated-node launcher
    inherit the name; Slurm's and torchrun's ranks derive it from the job's own id."""
    inherited = os.environ.get(RUN_ID_ENV)
    if inherited and (os.environ.get("LOCAL_RANK") or os.environ.get(launch.SIMULATED_NODE_ENV)):
        return inherited
    if detect_launcher() == "slurm":  # the same across a requeue: resume finds it
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
        return f"slurm-{job}"
    if detect_launcher() == "horovodrun":
        from ..engines.horovod import shared_run_id

        return shared_run_id(_new_run_id())
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"torchrun-{elastic[:12]}"
    if elastic:  # torchrun without --rdzv-id: the ranks of a node share their agent
        agent = psutil.Process(os.getppid())
        return f"torchrun-{agent.pid}-{agent.create_time():.0f}"
    return _new_run_id()


def _run_dir(resume: Optional[str] = None) -> Path:
    if resume:
        folder = Path(resume).expanduser() if "/" in resume else paths.runs_root() / resume
        if not folder.is_dir():
            raise UsageError(f"--resume {resume}: no such run; give a run id from "
                             f"{paths.runs_root()} or a run folder")
        os.environ[RUN_ID_ENV] = folder.name
        return folder
    run_id = _run_id()
    os.environ[RUN_ID_ENV] = run_id
    return paths.runs_root() / run_id  # rank 0 creates it once the input is checked


def _ranks_on_host(topology: launch.Topology) -> int:
    # Simulated nodes all run on this host: their ranks share its cores and its GPUs.
    simulated = topology.launcher in ("simulate", "simulated-node")
    return topology.devices_per_node * (topology.num_nodes if simulated else 1)


def _num_workers(config: RunConfig, topology: launch.Topology) -> int:
    if config.num_workers is not None:
        return config.num_workers
    return default_num_workers(_ranks_on_host(topology))


def _trainer(config: RunConfig, topology: launch.Topology, scaling: ScalingPlan,
             policy: DevicePolicy, share: Sharing, run_dir: Path, n_samples: int,
             callbacks: list) -> pl.Trainer:
    steps_per_epoch = max(1, int(n_samples * SPLITS[0]) // scaling.global_batch_size)
    distributed = scaling.world_size > 1
    callbacks = callbacks + [
        ModelCheckpoint(dirpath=run_dir / "checkpoints", monitor="val_loss", save_last=True),
    ]
    if config.progress:
        callbacks.append(RichProgressBar())
    return pl.Trainer(
        accelerator=policy.accelerator,
        # A list of CUDA ids pins local rank r to ids[r] (Lightning's own mapping).
        devices=list(config.gpu_ids) if policy.gpu and config.gpu_ids else topology.devices_per_node,
        num_nodes=topology.num_nodes,
        strategy=_strategy(config.strategy, share, distributed),
        max_epochs=config.max_epochs,
        max_steps=config.max_steps,
        precision=config.precision,
        logger=[TensorBoardLogger(run_dir, name="tensorboard", version=""),
                CSVLogger(run_dir, name="csv", version="")],
        callbacks=callbacks,
        # FlattenedDataModule already gives each rank its share of every batch.
        use_distributed_sampler=False,
        # kosmoss handles SIGUSR1/SIGTERM itself (run/preemption.py), Lightning must not.
        plugins=[SLURMEnvironment(auto_requeue=False)] if topology.launcher == "slurm" else None,
        log_every_n_steps=min(50, steps_per_epoch),
        enable_progress_bar=config.progress,
        default_root_dir=run_dir,
    )


def _strategy(name: str, share: Sharing, distributed: bool):
    if name == "horovod":  # also with one process: the run says what it would scale with
        from ..engines.horovod import HorovodStrategy

        return HorovodStrategy()
    return DDPStrategy(process_group_backend=share.backend) if distributed else "auto"


def _backend_reason(config: RunConfig, policy: DevicePolicy, share: Sharing,
                    topology: launch.Topology) -> str:
    if config.strategy == "horovod":
        from ..engines.horovod import backend_reason

        return backend_reason(policy.gpu, topology.devices_per_node)
    return share.reason


def _topology(scaling: ScalingPlan, policy: DevicePolicy, share: Sharing,
              topology: launch.Topology, strategy: str = "ddp") -> dict:
    distributed = scaling.world_size > 1
    return {
        "launcher": topology.launcher,
        "world_size": scaling.world_size,
        "num_nodes": scaling.num_nodes,
        "devices_per_node": scaling.devices_per_node,
        "accelerator": policy.accelerator,
        "device": str(policy.device),
        "strategy": "horovod" if strategy == "horovod" else "ddp" if distributed else "single",
        "backend": "horovod" if strategy == "horovod" else share.backend if distributed else "none",
        "gpu_memory_fraction": share.memory_fraction if policy.gpu else None,
        "global_batch_size": scaling.global_batch_size,
        "per_device_batch_size": scaling.per_device_batch_size,
        "base_batch_size": scaling.base_batch_size,
        "base_lr": scaling.base_lr,
        "lr": scaling.lr,
        "lr_rule": scaling.lr_rule,
        "lr_factor": scaling.lr_factor,
        "warmup_steps": scaling.warmup_steps,
    }


def _metric(trainer: pl.Trainer, name: str) -> Optional[float]:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def mean_baseline_loss(stats: Statistics) -> float:
    """Loss of always predicting the mean, on normalised targets: the bar to beat."""
    return float(np.mean((stats.y_std / Statistics.safe_std(stats.y_std)) ** 2))


def _versions() -> dict:
    return {"kosmoss": __version__, "torch": torch.__version__, "lightning": pl.__version__,
            "python": platform.python_version()}


def _write_results(result: dict, run_dir: Path, extra: Optional[Path]) -> None:
    for target in [run_dir / "result.json"] + ([Path(extra)] if extra else []):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, target)
