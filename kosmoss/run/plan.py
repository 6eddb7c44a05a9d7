"""``prepare(config) -> RunPlan``: every decision of a run, made once and frozen.

Data (prepared if it is a missing preset: the one side effect), engine, topology, devices,
scaling arithmetic, run identity and resume point (kosmoss.run.resume: a resume continues
with the stopped run's settings). Nothing is written and nothing is printed here (a run
recorded ``running`` whose processes are gone is recorded ``killed`` when resumed);
:func:`kosmoss.run.train` trains a plan, :func:`kosmoss.run.report` reports.
"""
from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple


from .. import launch
from ..core import paths
from ..core.errors import ConfigError, UsageError
from ..data import presets
from ..data.loading import batches_per_epoch, chosen_mode, dataset_bytes
from ..data.splits import SPLITS, split_sizes
from ..data.stats import Statistics
from ..data.store import PreparedDataset
from ..devices.cpus import default_num_workers
from ..devices.policy import DevicePolicy, MachineGpu, Sharing, decide, sharing
from ..engines import get as get_engine
from ..engines.base import Engine
from ..launch import records
from ..launch.records import RUN_ID_ENV
from ..launch.topology import Launcher, Topology
from ..scaling.arithmetic import ScalingPlan
from ..scaling.arithmetic import plan as plan_scaling
from ..scaling.arithmetic import warmup_factor
from . import memory, resume
from .chunks import steps_per_execution
from .config import COLLECTIVE_TIMEOUT_S, RunConfig, check_batch_fits, validate
from .flags import flag_names
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
    data_mode: str  # config.mode made concrete: auto holds the data in RAM if every rank can
    collective_timeout: timedelta
    warnings: Tuple[str, ...]
    notes: Tuple[str, ...] = ()  # what a resume took over or changed, said before training
    steps_per_execution: int = 1  # optimizer steps per step of Lightning's loop (run.chunks)
    memory_need: Optional[memory.MemoryNeed] = None  # one rank's, as the check counted it

    @property
    def is_global_zero(self) -> bool:
        return self.topology.global_rank == 0

    @property
    def launches_nodes(self) -> bool:
        """This process only starts the simulated nodes; they train."""
        return self.topology.launcher is Launcher.SIMULATE

    def describe(self) -> List[str]:
        """What rank 0 prints before training: warnings, backend, the scaling arithmetic."""
        lines = [f"warning: {warning}" for warning in self.warnings] + list(self.notes)
        if self.scaling.world_size > 1:
            reason = self.engine.backend_reason(self.share, self.policy.gpu,
                                                self.topology.ranks_on_host)
            lines.append(f"backend: {reason}")
        lines.append(f"data: {self._data_line()}")
        return lines + ["scaling:"] + [f"  {line}" for line in self.scaling.lines()]

    def _data_line(self) -> str:
        where = {"efficient": "memory-mapped shards (one page cache for every rank)",
                 "controlled": "one tensor in RAM per process",
                 "device": "one tensor on the training device per process"}[self.data_mode]
        asked = self.config.mode
        memory = "its GPU memory share" if self.data_mode == "device" else \
            f"{self.topology.ranks_on_host} process(es) on this host"
        return f"--mode {asked}: {where}" if asked != "auto" else \
            f"--mode auto: {where}, chosen for {memory} and {self.dataset.path.name}'s size"


def prepare(config: RunConfig, *, log: Optional[Callable[[str], None]] = None) -> RunPlan:
    """Check everything and decide everything; raises :class:`ConfigError` (or another
    UsageError naming the file) before anything is written."""
    warnings = validate(config)
    point = resume.find(config) if config.resume else None
    placed: Tuple[str, ...] = ()
    if point is not None:  # the stopped run's settings, checked again as a whole
        config, placed = _placed_by_the_launcher(point.config)
        warnings = validate(config)
    engine = get_engine(config.strategy)
    engine.check_available()
    topology = launch.resolve(config.num_processes, config.num_nodes, engine)
    launch.check_master_port(topology)
    launch.check_master_addr(topology)
    _check_hosts_launch(config, topology)
    if point is not None and _starts_the_attempt(topology):
        point.check_can_continue(topology.world_size)
    machine = MachineGpu(config.machine_gpu, config.gpu_index)
    policy = decide(machine, config.use_gpu, require=config.require_gpu, gpu_ids=config.gpu_ids)
    share = sharing(topology.ranks_on_host, policy.gpus_on_host)
    try:
        scaling = plan_scaling(config.batch_size, config.lr, config.scale_lr,
                               num_nodes=topology.num_nodes,
                               devices_per_node=topology.devices_per_node,
                               base_batch_size=config.base_batch_size,
                               warmup_steps=config.warmup_steps)
    except ConfigError as error:
        if point is None or error.field != "batch_size":
            raise
        raise _unshared_batch(config, topology.world_size) from None
    dataset = _dataset(config, point, log)
    sizes = _split_sizes(dataset)
    _check_fits(config.dataset, sizes, scaling)
    statistics = dataset.statistics()  # read once: both checks below need it
    _check_numbers(config.dataset, statistics)
    data_mode = chosen_mode(config.mode, dataset, copies=topology.ranks_on_host,
                            gpu_bytes=gpu_bytes_per_rank(policy, share))
    need = _check_memory(config.hidden, dataset, policy, share, topology.ranks_on_host,
                         scaling.per_device_batch_size, data_mode)
    if point is not None:
        point.check_model(dataset.n_x, config.hidden, dataset.n_y)
        point.check_data(statistics)
    run_id, run_dir, resume_from, step = _identity(point, topology, engine)
    timeout = config.collective_timeout_s or COLLECTIVE_TIMEOUT_S[policy.accelerator]
    _check_link_time(config, topology, need, timeout)
    # Data on the device is gathered there, in this process: no worker would read it.
    num_workers = 0 if data_mode == "device" else (
        config.num_workers if config.num_workers is not None
        else default_num_workers(topology.ranks_on_host))
    _check_workers(num_workers, need, dataset, policy, topology.ranks_on_host,
                   scaling.per_device_batch_size)
    steps = steps_per_execution(config.steps_per_execution, topology.world_size, engine,
                                policy.accelerator, data_mode, num_workers,
                                num_nodes=topology.num_nodes)
    if config.cuda_graphs:
        carried = bool(config.resume) and "cuda_graphs" not in (config.given or ())
        _check_graphs(policy, topology, engine, data_mode, num_workers, carried)
        # A replay takes K full batches of one epoch: no more than an epoch holds.
        full = sizes["train"] // scaling.world_size // scaling.per_device_batch_size
        steps = max(1, min(steps, full))
    return RunPlan(
        config=config, engine=engine, topology=topology, policy=policy, share=share,
        scaling=scaling, dataset=dataset, split_sizes=sizes, run_id=run_id, run_dir=run_dir,
        resume_from=resume_from, resumed_from_step=step,
        num_workers=num_workers,
        data_mode=data_mode, memory_need=need,
        collective_timeout=timedelta(seconds=timeout),
        warnings=tuple(policy.warnings) + warnings + _short_warmup(config, scaling, sizes)
        + _unused_workers(config, data_mode, policy.gpu),
        notes=(point.notes if point is not None else ()) + placed +
        _elastic_notes(topology, run_dir, step, scaling),
        steps_per_execution=steps,
    )


def _short_warmup(config: RunConfig, scaling: ScalingPlan, sizes: Dict[str, int]
                  ) -> Tuple[str, ...]:
    """A warm-up longer than the run: the rate printed is never reached."""
    epoch = batches_per_epoch(sizes["train"], scaling.per_device_batch_size, scaling.world_size)
    steps = epoch * config.max_epochs
    steps = steps if config.max_steps == -1 else min(steps, config.max_steps)
    if steps >= scaling.warmup_steps:
        return ()
    last = scaling.lr * warmup_factor(steps - 1, scaling.warmup_steps,
                                      scaling.base_lr / scaling.lr)
    return (f"--warmup-steps {scaling.warmup_steps} is longer than the run ({steps} steps): "
            f"its last step trains at {last:.3g}, never at {scaling.lr:g}",)


def _unshared_batch(config: RunConfig, world: int) -> ConfigError:
    """A resume keeps its batch: the world size is what can change, so name that."""
    batch, given = config.batch_size, config.given or frozenset()
    field = "num_nodes" if "num_nodes" in given and "num_processes" not in given \
        else "num_processes"
    fits = [n for n in range(1, batch + 1) if batch % n == 0]
    below = max((n for n in fits if n < world), default=None)
    above = min((n for n in fits if n > world), default=None)
    choices = " or ".join(str(n) for n in (below, above) if n is not None)
    return ConfigError(field, f"{{field}}: a world of {world} processes cannot share the "
                       f"resumed run's --batch-size {batch} evenly (a resume keeps it): resume "
                       f"on a world size that divides {batch}, e.g. {choices}")


def _unused_workers(config: RunConfig, data_mode: str, gpu: bool) -> Tuple[str, ...]:
    """Workers asked for where each process gathers its own batches (--mode device)."""
    if data_mode != "device" or not config.num_workers:
        return ()
    chosen = "--mode device" if config.mode == "device" else "--mode auto chose device"
    where = "on the GPU" if gpu else "in its memory"
    return (f"--num-workers {config.num_workers} is not used: with {chosen} each process "
            f"gathers its batches from the data it holds {where}",)


def _check_graphs(policy: DevicePolicy, topology: Topology, engine, data_mode: str,
                  num_workers: int, carried: bool = False) -> None:
    """--cuda-graphs captures a chunk's steps, the batch gather included: one GPU process,
    its data on that GPU, steps that do not change from one chunk to the next. ``carried``:
    the resumed run's own, not typed (then --no-cuda-graphs is the way out)."""
    why_not = [reason for reason, holds in (
        ("it trains on CPU (no CUDA GPU it may use)", policy.gpu),
        (f"it has {topology.world_size} processes (DDP's all-reduces are not captured)",
         topology.world_size == 1),
        (f"it uses --strategy {engine.name}", engine.steps_in_chunks),
        (f"its data is not on the GPU (--mode {data_mode}; give --mode device)",
         data_mode == "device"),
        (f"it has {num_workers} data workers", num_workers == 0)) if not holds]
    if why_not:
        whose = "the resumed run's {field}" if carried else "{field}"
        way_out = "; drop it with --no-cuda-graphs" if carried else ""
        raise ConfigError("cuda_graphs", f"{whose}: a CUDA graph replays one GPU process's steps "
                          f"with its data on the GPU, and this run cannot: {'; '.join(why_not)}"
                          f"{way_out}")


def _starts_the_attempt(topology: Topology) -> bool:
    """This process starts the attempt: the ranks and nodes it starts find it running."""
    return topology.global_rank == 0 and topology.launcher is not Launcher.SIMULATED_NODE


def gpu_bytes_per_rank(policy: DevicePolicy, share: Sharing) -> Optional[float]:
    """The GPU memory each rank on this host may use (its share of the GPU's total: the same
    figure on every rank, whatever the others hold yet); None on CPU."""
    if not policy.gpu:
        return None
    return gpu_total_bytes(policy.index or 0) * share.memory_fraction


def gpu_total_bytes(index: int) -> int:
    """The GPU's memory, from its properties (cudaGetDeviceProperties): ``mem_get_info``
    creates a CUDA context (pytorch/pytorch#103584), which a launcher that only starts the
    ranks would then hold, a few hundred MiB of the GPU, for the whole run."""
    import torch

    return torch.cuda.get_device_properties(index).total_memory


def _check_memory(hidden: Tuple[int, ...], dataset: PreparedDataset, policy: DevicePolicy,
                  share: Sharing, ranks_on_host: int, batch: int,
                  data_mode: str) -> memory.MemoryNeed:
    """A model that cannot fit is a one-line error, not an allocation failure (run.memory);
    returns one rank's need."""
    # The copy of the data is where the mode puts it: RAM (controlled) or the GPU (device).
    held = data_mode == ("device" if policy.gpu else "controlled")
    rank = memory.need(dataset.n_x, hidden, dataset.n_y, batch,
                       data_bytes=dataset_bytes(dataset) if held else 0)
    if policy.gpu:
        memory.check_gpu(rank, hidden, gpu_bytes_per_rank(policy, share), policy.index or 0)
    else:
        memory.check_host(rank, hidden, ranks_on_host)
    return rank


def _check_workers(num_workers: int, rank: memory.MemoryNeed, dataset: PreparedDataset,
                   policy: DevicePolicy, ranks_on_host: int, batch: int) -> None:
    """The data workers on the host, beside what each rank takes there (all of its need on
    CPU; on a GPU, this process and its slack)."""
    workers = memory.workers_bytes(num_workers, batch, dataset.n_x, dataset.n_y)
    rank_host = rank.runtime + rank.slack if policy.gpu else rank.total
    memory.check_workers(num_workers, workers, rank_host, rank.runtime, ranks_on_host)


def _split_sizes(dataset: PreparedDataset) -> Dict[str, int]:
    """Each split's rows (the seed draws which rows, not how many)."""
    return dict(zip(("train", "val", "test"), split_sizes(dataset.n_samples, SPLITS)))


def _check_numbers(name: str, statistics: Statistics) -> None:
    """A feature that holds a NaN or inf: normalised by its statistics, every column's
    inputs or targets are NaN and the run would diverge at its first step, blaming its rate."""
    inputs, outputs = statistics.not_numbers()
    if inputs or outputs:
        raise ConfigError("dataset", f"{{field}} {name}: {inputs} input and {outputs} output "
                          "feature(s) hold NaN or inf values (their mean or std is no number): "
                          "every step would be NaN; prepare it again from a clean source")


def _check_fits(dataset: str, sizes: Dict[str, int], scaling: ScalingPlan) -> None:
    world = scaling.world_size
    for stage, rows in sizes.items():
        if rows < world:  # a rank with no rows would wait for the others' collectives
            each = f"{rows // world} or {rows // world + 1}" if rows % world else str(rows // world)
            raise ConfigError("dataset", f"{{field}} {dataset}: its {stage} split has {rows} "
                              f"row(s) for {world} ranks ({each} each): use a larger dataset "
                              "or fewer processes")
    check_batch_fits(dataset, sizes["train"], scaling.global_batch_size)


def new_run_id() -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def _run_id(topology: Topology, engine: Engine) -> str:
    """Rank 0 names the run; ranks started by Lightning or by the simulated-node launcher
    inherit the name from their environment; Slurm's and torchrun's ranks derive it from
    the job's own id; Horovod's get rank 0's."""
    inherited = os.environ.get(RUN_ID_ENV)
    spawned = os.environ.get("LOCAL_RANK") or topology.launcher is Launcher.SIMULATED_NODE
    if inherited and spawned and not topology.launcher.external:
        return inherited
    if topology.launcher in (Launcher.SLURM, Launcher.TORCHRUN):
        # Slurm's: the same across a requeue (resume finds it). Without --rdzv-id torchrun's
        # ranks share their agent, their parent.
        agent = records.ProcessId.of(os.getppid())
        return records.external_run_id(topology.launcher.value, agent)
    return engine.shared_run_id(new_run_id())


def _identity(point: Optional[resume.ResumePoint], topology: Topology,
              engine: Engine) -> Tuple[str, Path, Optional[Path], Optional[int]]:
    """(run id, run folder, checkpoint to resume from, its step): the resumed run's, or a
    new run's (a requeued Slurm job is not new: it finds its own checkpoint)."""
    if point is not None:
        return point.run_id, point.run_dir, point.checkpoint, point.step
    run_id = _run_id(topology, engine)
    run_dir = paths.runs_root() / run_id
    checkpoint = _requeued_checkpoint(run_dir, topology) or _elastic_checkpoint(run_dir,
                                                                                topology)
    return run_id, run_dir, checkpoint, (None if checkpoint is None
                                         else resume.checkpoint_step(checkpoint))


def _requeued_checkpoint(run_dir: Path, topology: Topology) -> Optional[Path]:
    """A Slurm job that was requeued finds its own preempted checkpoint in its run directory
    (same job id, same run id)."""
    requeued = run_dir / "checkpoints" / PREEMPTED
    return requeued if topology.launcher is Launcher.SLURM and requeued.is_file() else None


def _check_link_time(config: RunConfig, topology: Topology, need: memory.MemoryNeed,
                     timeout: float) -> None:
    """On shaped hosts, every step's all-reduce (and DDP's first broadcast) moves the model
    across a link at least once: slower than the collective timeout, every run fails."""
    from ..launch.hosts import parse_rate, rate_name

    rate = parse_rate(config.link_rate, "--link-rate") if config.hosts == "netns" else None
    if rate is None or topology.num_nodes < 2:
        return
    nbytes = need.params * 4  # float32 gradients, whatever the precision of the compute
    crossing = nbytes * 8 / rate
    if crossing < timeout:
        return
    said = "{field}" if config.collective_timeout_s else "the default {field}"
    raise ConfigError("collective_timeout_s", f"{said} {timeout:g} s: over the hosts' "
                      f"{rate_name(rate)} link the model's {nbytes / 1e6:.3g} MB of gradients "
                      f"take {crossing:,.0f} s to cross once, as every step's all-reduce must; "
                      f"give {{field}} {math.ceil(2 * crossing)} or more, or a faster "
                      "--link-rate")


def _dataset(config: RunConfig, point, log) -> PreparedDataset:
    """The run's dataset (checksums: at start); a resumed run's that is gone may have moved."""
    try:
        return presets.resolve(config.dataset, log=log, verify=False)
    except UsageError as error:
        if point is None or "dataset" in (config.given or ()):
            raise
        said = str(error).removeprefix("--dataset ")  # presets.resolve names its flag
        raise ConfigError("dataset", f"the resumed run's {{field}} {said}; if its data moved, "
                          "give {field} with the new folder (checked against the checkpoint)"
                          ) from None


def _placed_by_the_launcher(config: RunConfig) -> Tuple[RunConfig, Tuple[str, ...]]:
    """A run resumed under torchrun, srun or horovodrun: the launcher places the ranks, so
    the stopped run's own placement (not typed again) is left to it, and said."""
    from ..devices.environment import detect_launcher

    found = detect_launcher()
    if found not in Launcher._value2member_map_ or not Launcher(found).external:
        return config, ()
    own = dict(num_processes=None, num_nodes=None, hosts="loopback", link_rate=None)
    left = {name: value for name, value in own.items() if name not in (config.given or ())
            and getattr(config, name) != value}
    notes = tuple(f"resume: {found} places the ranks: the stopped run's {flag_names()[name]} "
                  f"{getattr(config, name)} is left to it" for name in left)
    return replace(config, **left), notes


def _check_hosts_launch(config: RunConfig, topology: Topology) -> None:
    """--hosts netns is for nodes kosmoss starts; another launcher's ranks are checked for
    a socket interface that cannot reach MASTER_ADDR (kosmoss.launch.hosts)."""
    from ..launch.hosts import check_rank_interface

    if config.hosts == "netns" and topology.launcher.external:
        raise ConfigError("hosts", f"{{field}} netns: {topology.launcher.value} placed the "
                          "ranks already; drop it, and start the launcher inside the hosts "
                          "(kosmoss hosts up prints the commands)")
    if topology.launcher.external and topology.world_size > 1:
        check_rank_interface()


def _elastic_checkpoint(run_dir: Path, topology: Topology) -> Optional[Path]:
    """torchrun restarted its workers (a host lost or back, --max-restarts): every attempt's
    ranks share the run (--rdzv-id names it) and continue from its furthest checkpoint."""
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if topology.launcher is not Launcher.TORCHRUN or not elastic or elastic == "none":
        return None
    try:
        return resume.readable_checkpoint(run_dir, None, run_dir.name)[0]
    except ConfigError:  # none yet: the run's first attempt
        return None


def _elastic_notes(topology: Topology, run_dir: Path, step: Optional[int],
                   scaling: ScalingPlan) -> Tuple[str, ...]:
    """What an elastic restart keeps and what it cannot, said before training."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if topology.launcher is not Launcher.TORCHRUN or step is None:
        return ()
    before = (records.read_run(run_dir) or {}).get("world_size") or scaling.world_size
    # A host joining restarts the workers too, without counting against --max-restarts.
    return (f"torchrun restarted the workers ({restart} restart(s) counted against "
            f"--max-restarts): run {run_dir.name} continues from its checkpoint at "
            f"step {step} with {scaling.world_size} rank(s) (the attempt before had {before}); "
            f"kept: the global batch {scaling.global_batch_size} and the learning rate; not "
            f"kept: the per-device batch ({scaling.global_batch_size // before} before, "
            f"{scaling.per_device_batch_size} now), the steps trained after that checkpoint "
            "(trained again), the samples/s",)
