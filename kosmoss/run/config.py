"""The typed, frozen configuration of one training run, and its checks.

Errors name the *field* (:class:`kosmoss.core.errors.ConfigError`); the launchers render them
with their own flag names (:mod:`kosmoss.run.flags`).
"""
from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import FrozenSet, Optional, Tuple

from ..core import paths
from ..core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
from ..core.errors import ConfigError, UsageError
from ..core.files import MIN_FREE_BYTES, free_bytes, holds_no_files, nearest_existing, read_json
from ..data import MODES
from ..data.presets import DEFAULT_PRESET
from ..devices.cpus import available_cores
from ..engines import ENGINE_NAMES
from ..launch.topology import SIMULATED_NODE_ENV
from ..scaling.arithmetic import LR_RULES
from ..scaling.arithmetic import plan as plan_scaling

PRECISIONS = ("32-true", "bf16-mixed")
HOSTS = ("loopback", "netns")
STRATEGIES = ENGINE_NAMES
# Long enough for a slow first step on a loaded laptop, short enough for a course; NCCL's
# own default is 10 minutes, gloo's 30.
COLLECTIVE_TIMEOUT_S = {"cpu": 120.0, "gpu": 600.0}
# torch turns the timeout into int64 microseconds: about 9e12 s fits, 8e13 s wrapped round to
# a client timeout of 6e15 ms (torch 2.13). A year is past any wait worth having.
MAX_COLLECTIVE_TIMEOUT_S = 365 * 86400


@dataclass(frozen=True)
class RunConfig:
    batch_size: int = 256  # global: split over every process of the run
    num_processes: Optional[int] = None  # per node; None: 1, or what the launcher says
    lr: float = DEFAULT_LR
    scale_lr: str = "none"
    base_batch_size: Optional[int] = None
    warmup_steps: int = 0
    max_epochs: int = 10
    val_every_n_epochs: int = 1  # Lightning's check_val_every_n_epoch
    max_steps: int = -1
    dataset: str = DEFAULT_PRESET
    seed: int = 42
    result_json: Optional[Path] = None
    hidden: Tuple[int, ...] = DEFAULT_HIDDEN
    mode: str = "auto"
    num_workers: Optional[int] = None  # None: sized per process from the cores
    machine_gpu: str = "none"  # what this machine allows: none | offer | force
    gpu_index: Optional[int] = None
    use_gpu: bool = False  # what the run asks for (kosmoss.devices.policy decides)
    require_gpu: bool = False
    num_nodes: Optional[int] = None  # None: 1, or what the launcher says
    gpu_ids: Optional[Tuple[int, ...]] = None
    progress: bool = True
    resume: Optional[str] = None  # a run id or run folder whose checkpoint to continue
    strategy: str = "ddp"  # an engine of kosmoss.engines
    precision: str = "32-true"  # Lightning's name; bf16-mixed autocasts (GPU or CPU)
    collective_timeout_s: Optional[float] = None  # None: COLLECTIVE_TIMEOUT_S by device
    steps_per_execution: Optional[int] = None  # None: as many as the run allows (run.chunks)
    compile: bool = False  # torch.compile the network (inductor)
    cuda_graphs: bool = False  # each chunk's steps replayed from one CUDA graph (run.graphs)
    hosts: str = "loopback"  # simulated nodes: over loopback, or netns (kosmoss.launch.hosts)
    link_rate: Optional[str] = None  # with hosts netns: each host's link, e.g. 1gbit
    # The fields the user typed (flags given), so a resume keeps the stopped run's value for
    # the others; None: those that differ from the defaults (a call from code).
    given: Optional[FrozenSet[str]] = None

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("given")
        data["result_json"] = str(self.result_json) if self.result_json else None
        return data


MAX_SEED = 2**32 - 1  # Lightning's seed_everything: numpy's legacy seed is a uint32


def validate(config: RunConfig) -> Tuple[str, ...]:
    """Raise :class:`ConfigError` for the first bad field; return warnings for odd ones.
    Cheap: no torch; only looks at ``result_json``, the run to resume and $KOSMOSS_HOME."""
    check_home_writable()
    if config.num_processes is not None:
        _at_least(config.num_processes, 1, "num_processes")
    if config.num_nodes is not None:
        _at_least(config.num_nodes, 1, "num_nodes")
    if config.gpu_ids is not None:
        _check_gpu_ids(config)
    _at_least(config.max_epochs, 1, "max_epochs")
    _at_least(config.val_every_n_epochs, 1, "val_every_n_epochs")
    if config.max_steps != -1 and config.max_steps < 1:
        raise ConfigError("max_steps", f"{{field}} {config.max_steps}: must be >= 1 (or -1 for "
                          "no limit)")
    _one_of(config.scale_lr, LR_RULES, "scale_lr")
    # The rate, warmup and base batch now, with the world size where the flags alone decide
    # it (the rest once the launcher's is known): --batch-size 255 --num-processes 2 is one
    # line before torch is imported, not after seconds of imports.
    check_launcher_numbers()
    nodes, processes = _world_from_flags(config)
    plan_scaling(config.batch_size, config.lr, config.scale_lr, num_nodes=nodes,
                 devices_per_node=processes, base_batch_size=config.base_batch_size,
                 warmup_steps=config.warmup_steps)
    _one_of(config.precision, PRECISIONS, "precision")
    _one_of(config.strategy, STRATEGIES, "strategy")
    _one_of(config.mode, MODES, "mode")
    if not config.hidden or min(config.hidden) < 1:
        raise ConfigError("hidden", f"{{field}} {' '.join(map(str, config.hidden))}: give one "
                          "or more layer sizes >= 1")
    if not 0 <= config.seed <= MAX_SEED:
        raise ConfigError("seed", f"{{field}} {config.seed}: give a seed from 0 to {MAX_SEED} "
                          "(Lightning seeds numpy's generator, which takes no other)")
    if config.num_workers is not None and config.num_workers < 0:
        raise ConfigError("num_workers", f"{{field}} {config.num_workers}: must be >= 0")
    if config.steps_per_execution is not None:
        _at_least(config.steps_per_execution, 1, "steps_per_execution")
    timeout = config.collective_timeout_s
    if timeout is not None and not (0 < timeout <= MAX_COLLECTIVE_TIMEOUT_S):
        raise ConfigError("collective_timeout_s", f"{{field}} {timeout}: give a number of "
                          f"seconds > 0, at most {MAX_COLLECTIVE_TIMEOUT_S} (a year)")
    if config.result_json is not None:
        _check_output(Path(config.result_json))
    _one_of(config.hosts, HOSTS, "hosts")
    if config.hosts == "netns" or config.link_rate is not None:
        check_hosts(config.hosts, config.num_nodes, config.link_rate)
    if config.resume:
        run_folder(config.resume)
    return _warnings(config)


# Set by the launchers whose world size is theirs to decide (torchrun, srun, horovodrun,
# mpirun, kosmoss's simulated nodes): found by name, since asking Lightning imports torch.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                      "SLURM_NTASKS", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                      SIMULATED_NODE_ENV)


# The launchers' counts and ranks that torch, Lightning or torchmetrics read with int() at
# import (torchmetrics' prints.py: LOCAL_RANK): a broken one would be a traceback there.
LAUNCHER_NUMBERS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                    "GROUP_RANK", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                    "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "HOROVOD_RANK", "HOROVOD_SIZE",
                    "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_SIZE",
                    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "PMI_RANK", "PMI_SIZE")


def check_launcher_numbers(environment=os.environ) -> None:
    for name in LAUNCHER_NUMBERS:
        value = environment.get(name)
        if value is not None and not value.strip().isdecimal():
            raise UsageError(f"{name}={value!r} is not a whole number >= 0: unset it, or start "
                             "the run under the launcher that sets it")


def _world_from_flags(config: RunConfig) -> Tuple[int, int]:
    """(nodes, processes per node) as the flags give them outside any launcher; (1, 1) where
    a launcher or a resumed run decides."""
    if config.resume or any(name in os.environ for name in LAUNCHER_VARIABLES):
        return 1, 1
    return config.num_nodes or 1, config.num_processes or 1


def check_hosts(hosts: str, num_nodes: Optional[int], link_rate: Optional[str]) -> None:
    """--hosts netns: two or more nodes, a rate that parses, root and namespaces here, a
    socket interface that is the hosts' link, no host set left by another run."""
    from ..launch import hosts as host_sets

    if hosts != "netns":
        raise ConfigError("link_rate", f"{{field}} {link_rate}: only with --hosts netns (over "
                          "loopback there is no link to shape)")
    if (num_nodes or 1) < 2:
        raise ConfigError("hosts", "{field} netns: give --num-nodes 2 or more (each node is a "
                          "host)")
    host_sets.parse_rate(link_rate, "--link-rate")
    host_sets.check_support("--hosts netns")
    host_sets.check_count(num_nodes, "--num-nodes")
    host_sets.check_socket_interfaces()
    host_sets.check_no_leftovers()


def check_batch_fits(dataset: str, train_rows: int, global_batch_size: int) -> None:
    """A global batch no epoch can fill: the flags check it before torch is imported, the
    plan again (from the same split sizes, kosmoss.data.splits)."""
    if train_rows < global_batch_size:
        raise ConfigError("batch_size", f"{{field}} {global_batch_size} is larger than the "
                          f"{train_rows} training samples of the dataset {dataset}: use a smaller "
                          "batch or a larger dataset")


def check_home_writable() -> None:
    """A run writes under $KOSMOSS_HOME/runs: a home that cannot be written is said before
    anything starts (not as a traceback once the data has loaded)."""
    runs = paths.runs_root()
    existing = nearest_existing(runs)
    if not existing.is_dir() or not _writable(existing):
        raise UsageError(f"KOSMOSS_HOME {paths.home()}: {existing} cannot be written (runs go "
                         f"to {runs}); set KOSMOSS_HOME to a folder you can write")
    free = free_bytes(existing)
    if free < MIN_FREE_BYTES:
        raise UsageError(f"KOSMOSS_HOME {paths.home()}: the disk holding {existing} is full "
                         f"({free // 1024} KiB free; runs go to {runs}); free "
                         "some space or set KOSMOSS_HOME to a folder on another disk")


def run_folder(resume: str) -> Tuple[Path, Optional[Path]]:
    """``--resume``'s run folder, and the checkpoint it names or None: a run id, a run folder
    or a checkpoint file inside a run's ``checkpoints/``."""
    given = Path(resume).expanduser()
    if given.suffix == ".ckpt" or ("/" in resume and given.is_file()):
        return _checkpoint_file(resume, given)
    folder = given if "/" in resume else paths.runs_root() / resume
    if not folder.is_dir():
        raise ConfigError("resume", f"{{field}} {resume}: no such run; give a run id from "
                          f"{paths.runs_root()} or a run folder")
    return folder, None


def _checkpoint_file(resume: str, given: Path) -> Tuple[Path, Path]:
    """A file named by --resume: a checkpoint in a run's checkpoints/ folder (the run's
    settings are in the folder above)."""
    if not given.is_file():
        raise ConfigError("resume", f"{{field}} {resume}: no such checkpoint file; give one "
                          "from a run's checkpoints/ folder, a run id or a run folder")
    if given.suffix != ".ckpt":
        raise ConfigError("resume", f"{{field}} {resume}: a file, not a checkpoint (*.ckpt); "
                          "give a run id, a run folder or a checkpoint file of a run")
    if given.parent.name != "checkpoints" or not given.parent.parent.is_dir():
        raise ConfigError("resume", f"{{field}} {resume}: the checkpoint file is not in a "
                          "run's checkpoints/ folder, where the run's settings are found; give "
                          "one that is")
    return given.parent.parent, given


def _check_gpu_ids(config: RunConfig) -> None:
    ids = ",".join(map(str, config.gpu_ids))
    if config.num_processes is not None and len(config.gpu_ids) != config.num_processes:
        raise ConfigError("gpu_ids", f"{{field}} {ids} names {len(config.gpu_ids)} GPU(s) but "
                          f"{config.num_processes} processes per node were asked for: give one "
                          "id per process")
    if min(config.gpu_ids) < 0 or len(set(config.gpu_ids)) != len(config.gpu_ids):
        raise ConfigError("gpu_ids", f"{{field}} {ids}: give distinct CUDA ids >= 0")


def _check_output(path: Path) -> None:
    """Found before training, not after it: a folder, a device or a FIFO (reading or writing
    one blocks or never ends), a file that is not a kosmoss result (the user's own: never
    overwritten), or a place that cannot be written."""
    try:
        mode = path.expanduser().stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise ConfigError("result_json", f"{{field}} {path}: cannot be looked at "
                          f"({err.strerror}); give another path") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigError("result_json", f"{{field}} {path}: is a directory; give a file path")
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError("result_json", f"{{field}} {path}: is not a regular file (a device, "
                          "a FIFO or a socket); give a file path")
    if mode is not None and not is_kosmoss_result(path.expanduser()):
        raise ConfigError("result_json", f"{{field}} {path}: exists and is not a kosmoss "
                          "result.json; give a new path (a previous result is replaced)")
    parent = path.expanduser().absolute().parent
    existing = nearest_existing(parent)
    if not existing.is_dir() or not _writable(existing):
        raise ConfigError("result_json", f"{{field}} {path}: {existing} cannot be written; give a "
                          "path in a folder you can write")


def is_kosmoss_result(path: Path) -> bool:
    """A result.json kosmoss wrote (its keys), which a new run may replace."""
    try:
        data = read_json(path)  # a FIFO or /dev/zero is not read
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"run_id", "run_dir", "world_size", "config"} <= set(data)


def _writable(folder: Path) -> bool:
    """Takes new files: root passes os.access on /proc and /sys, which hold none."""
    return os.access(folder, os.W_OK | os.X_OK) and not holds_no_files(folder)


def _warnings(config: RunConfig) -> Tuple[str, ...]:
    cores = available_cores()
    processes = (config.num_processes or 1) * (config.num_nodes or 1)
    if not config.use_gpu and processes > cores:
        return (f"{processes} processes is more than the {cores} CPU cores available: "
                "processes will share cores and run slower",)
    return ()


def _at_least(value: int, minimum: int, field: str) -> None:
    if value < minimum:
        raise ConfigError(field, f"{{field}} {value}: must be >= {minimum}")


def _one_of(value: str, choices, field: str) -> None:
    if value not in choices:
        raise ConfigError(field, f"{{field}} {value!r}: choose one of {', '.join(choices)}")
