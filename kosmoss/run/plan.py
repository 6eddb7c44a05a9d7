"""``prepare(config) -> RunPlan``: every decision of a run, made once and frozen.

Data (prepared if it is a missing preset: the one side effect), engine, topology, devices,
scaling arithmetic, run identity and resume point. Nothing is written and nothing is
printed here; :func:`kosmoss.run.train` trains a plan, :func:`kosmoss.run.report` reports.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple
import uuid

import psutil

from .. import launch, paths
from ..cpus import default_num_workers
from ..data import presets
from ..data.loading import SPLITS, split_indices
from ..data.store import PreparedDataset
from ..devices import DevicePolicy, MachineGpu, Sharing, decide, sharing
from ..engines import get as get_engine
from ..engines.base import Engine
from ..errors import ConfigError
from ..launch import Launcher, Topology
from ..records import RUN_ID_ENV
from ..scaling import ScalingPlan, plan as plan_scaling
from .config import COLLECTIVE_TIMEOUT_S, RunConfig, validate
from .preemption import CHECKPOINT as PREEMPTED


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    engine: Engine
    topology: Topology
    policy: DevicePolicy
    share: Sharing
    scaling: ScalingPlan
    dataset: PreparedDataset
    split_sizes: Dict[str, int]
    run_id: str
    run_dir: Path
    resume_from: Optional[Path]
    resumed_from_step: Optional[int]
    num_workers: int
    collective_timeout: timedelta
    warnings: Tuple[str, ...]

    @property
    def is_global_zero(self) -> bool:
        return self.topology.global_rank == 0

    @property
    def launches_nodes(self) -> bool:
        """This process only starts the simulated nodes; they train."""
        return self.topology.launcher is Launcher.SIMULATE

    def describe(self) -> List[str]:
        """What rank 0 prints before training: warnings, backend, the scaling arithmetic."""
        lines = [f"warning: {warning}" for warning in self.warnings]
        if self.scaling.world_size > 1:
            reason = self.engine.backend_reason(self.share, self.policy.gpu,
                                                self.topology.ranks_on_host)
            lines.append(f"backend: {reason}")
        return lines + ["scaling:"] + [f"  {line}" for line in self.scaling.lines()]


def prepare(config: RunConfig, *, log: Optional[Callable[[str], None]] = None) -> RunPlan:
    """Check everything and decide everything; raises :class:`ConfigError` (or another
    UsageError naming the file) before anything is written."""
    warnings = validate(config)
    engine = get_engine(config.strategy)
    engine.check_available()
    topology = launch.resolve(config.num_processes, config.num_nodes, engine)
    launch.check_master_port(topology)
    machine = MachineGpu(config.machine_gpu, config.gpu_index)
    policy = decide(machine, config.use_gpu, require=config.require_gpu, gpu_ids=config.gpu_ids)
    share = sharing(topology.ranks_on_host, policy.gpus_on_host)
    scaling = plan_scaling(config.batch_size, config.lr, config.scale_lr,
                           num_nodes=topology.num_nodes,
                           devices_per_node=topology.devices_per_node,
                           base_batch_size=config.base_batch_size,
                           warmup_steps=config.warmup_steps)
    dataset = presets.resolve(config.dataset, log=log, verify=False)  # checksums: at start
    sizes = _split_sizes(dataset, config.seed)
    _check_fits(config.dataset, sizes, scaling)
    run_id, run_dir = _run_identity(config.resume, topology, engine)
    resume_from = _checkpoint_to_resume(run_dir, config.resume, topology)
    timeout = config.collective_timeout_s or COLLECTIVE_TIMEOUT_S[policy.accelerator]
    return RunPlan(
        config=config, engine=engine, topology=topology, policy=policy, share=share,
        scaling=scaling, dataset=dataset, split_sizes=sizes, run_id=run_id, run_dir=run_dir,
        resume_from=resume_from, resumed_from_step=_step_of(resume_from, policy),
        num_workers=(config.num_workers if config.num_workers is not None
                     else default_num_workers(topology.ranks_on_host)),
        collective_timeout=timedelta(seconds=timeout),
        warnings=tuple(policy.warnings) + warnings,
    )


def _split_sizes(dataset: PreparedDataset, seed: int) -> Dict[str, int]:
    parts = split_indices(dataset.n_samples, SPLITS, seed)
    return {stage: len(part) for stage, part in zip(("train", "val", "test"), parts)}


def _check_fits(dataset: str, sizes: Dict[str, int], scaling: ScalingPlan) -> None:
    world = scaling.world_size
    for stage, rows in sizes.items():
        if rows < world:  # a rank with no rows would wait for the others' collectives
            each = f"{rows // world} or {rows // world + 1}" if rows % world else str(rows // world)
            raise ConfigError("dataset", f"{{field}} {dataset}: its {stage} split has {rows} "
                              f"row(s) for {world} ranks ({each} each): use a larger dataset "
                              "or fewer processes")
    if sizes["train"] < scaling.global_batch_size:
        raise ConfigError("batch_size", f"{{field}} {scaling.global_batch_size} is larger than "
                          f"the {sizes['train']} training samples of the dataset: use a smaller "
                          "batch or a larger dataset")


def new_run_id() -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def _run_identity(resume: Optional[str], topology: Topology, engine: Engine) -> Tuple[str, Path]:
    if resume:
        folder = Path(resume).expanduser() if "/" in resume else paths.runs_root() / resume
        if not folder.is_dir():
            raise ConfigError("resume", f"{{field}} {resume}: no such run; give a run id from "
                              f"{paths.runs_root()} or a run folder")
        return folder.name, folder
    run_id = _run_id(topology, engine)
    return run_id, paths.runs_root() / run_id


def _run_id(topology: Topology, engine: Engine) -> str:
    """Rank 0 names the run; ranks started by Lightning or by the simulated-node launcher
    inherit the name from their environment; Slurm's and torchrun's ranks derive it from
    the job's own id; Horovod's get rank 0's."""
    inherited = os.environ.get(RUN_ID_ENV)
    spawned = os.environ.get("LOCAL_RANK") or topology.launcher is Launcher.SIMULATED_NODE
    if inherited and spawned and not topology.launcher.external:
        return inherited
    if topology.launcher is Launcher.SLURM:  # the same across a requeue: resume finds it
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
        return f"slurm-{job}"
    if topology.launcher is Launcher.TORCHRUN:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID")
        if elastic and elastic != "none":
            return f"torchrun-{elastic[:12]}"
        agent = psutil.Process(os.getppid())  # without --rdzv-id the ranks share their agent
        return f"torchrun-{agent.pid}-{agent.create_time():.0f}"
    return engine.shared_run_id(new_run_id())


def _checkpoint_to_resume(run_dir: Path, explicit: Optional[str],
                          topology: Topology) -> Optional[Path]:
    """``--resume RUN``: its preempted (else last) checkpoint. Without it, a Slurm job that
    was requeued finds its own preempted checkpoint in its run directory."""
    folder = run_dir / "checkpoints"
    if not explicit:
        requeued = folder / PREEMPTED
        return requeued if topology.launcher is Launcher.SLURM and requeued.is_file() else None
    found = next((p for p in (folder / PREEMPTED, folder / "last.ckpt") if p.is_file()), None)
    if found is None:
        raise ConfigError("resume", f"{{field}} {explicit}: no checkpoints/{PREEMPTED} or "
                          f"last.ckpt in {run_dir}; nothing to resume")
    return found


def _step_of(checkpoint: Optional[Path], policy: DevicePolicy) -> Optional[int]:
    # Read before the run overwrites last.ckpt; a checkpoint from a GPU maps to this device.
    return None if checkpoint is None else int(policy.load(checkpoint)["global_step"])
