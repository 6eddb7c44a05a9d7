"""The typed configuration of one training run, and its checks."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from ..cpus import available_cores
from ..data import MODES
from ..data.presets import DEFAULT_PRESET
from ..errors import UsageError
from ..scaling import LR_RULES

PRECISIONS = ("32-true", "bf16-mixed")
STRATEGIES = ("ddp", "horovod")


@dataclass
class RunConfig:
    batch_size: int = 256  # global: split over every process of the run
    num_processes: Optional[int] = None  # per node; None: 1, or what the launcher says
    lr: float = 1e-3
    scale_lr: str = "none"
    base_batch_size: Optional[int] = None
    warmup_steps: int = 0
    max_epochs: int = 10
    max_steps: int = -1
    dataset: str = DEFAULT_PRESET
    seed: int = 42
    result_json: Optional[Path] = None
    hidden: Tuple[int, ...] = (100, 100, 100)
    mode: str = "efficient"
    num_workers: Optional[int] = None  # None: sized per process from the cores
    machine_gpu: str = "none"  # what this machine allows: none | offer | force
    gpu_index: Optional[int] = None
    use_gpu: bool = False  # what the run asks for (kosmoss.devices decides)
    require_gpu: bool = False
    num_nodes: Optional[int] = None  # None: 1, or what the launcher says
    gpu_ids: Optional[Tuple[int, ...]] = None
    process_flag: str = "--num-processes"  # how the launcher script names num_processes
    progress: bool = True
    resume: Optional[str] = None  # a run id or run folder whose checkpoint to continue
    strategy: str = "ddp"  # ddp (torch.distributed) | horovod (kosmoss.engines.horovod)
    precision: str = "32-true"  # Lightning's name; bf16-mixed autocasts (GPU or CPU)
    warnings: List[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["result_json"] = str(self.result_json) if self.result_json else None
        return data


def validate(config: RunConfig) -> List[str]:
    """Raise :class:`UsageError` for the first bad flag; return warnings for odd ones."""
    if config.num_processes is not None:
        _at_least(config.num_processes, 1, config.process_flag)
    if config.num_nodes is not None:
        _at_least(config.num_nodes, 1, "--num-nodes")
    if config.gpu_ids is not None:
        ids = ",".join(map(str, config.gpu_ids))
        if config.num_processes is not None and len(config.gpu_ids) != config.num_processes:
            raise UsageError(f"--gpu-ids {ids} names {len(config.gpu_ids)} GPU(s) but "
                             f"{config.process_flag} is {config.num_processes}: give one id "
                             "per process")
        if min(config.gpu_ids) < 0 or len(set(config.gpu_ids)) != len(config.gpu_ids):
            raise UsageError(f"--gpu-ids {ids}: give distinct CUDA ids >= 0")
    _at_least(config.max_epochs, 1, "--max-epochs")
    if config.max_steps != -1 and config.max_steps < 1:
        raise UsageError(f"--max-steps {config.max_steps}: must be >= 1 (or -1 for no limit)")
    if config.scale_lr not in LR_RULES:
        raise UsageError(f"--scale-lr {config.scale_lr!r}: choose one of {', '.join(LR_RULES)}")
    if config.precision not in PRECISIONS:
        raise UsageError(f"--precision {config.precision!r}: choose one of {', '.join(PRECISIONS)}")
    if config.strategy not in STRATEGIES:
        raise UsageError(f"--strategy {config.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if config.strategy == "horovod":
        from ..engines import horovod

        horovod.require()  # not installed: one line naming scripts/install_horovod.sh
    if config.mode not in MODES:
        raise UsageError(f"--mode {config.mode!r}: choose one of {', '.join(MODES)}")
    if not config.hidden or min(config.hidden) < 1:
        raise UsageError(f"--hidden {config.hidden}: give one or more layer sizes >= 1")
    if config.num_workers is not None and config.num_workers < 0:
        raise UsageError(f"--num-workers {config.num_workers}: must be >= 0")
    if config.result_json is not None and Path(config.result_json).is_dir():
        raise UsageError(f"--result-json {config.result_json}: is a directory; give a file path")
    warnings = []
    cores = available_cores()
    processes = config.num_processes or 1
    if not config.use_gpu and processes > cores:
        warnings.append(f"{config.process_flag} {processes} is more than the {cores} "
                        "CPU cores available: processes will share cores and run slower")
    return warnings


def _at_least(value: int, minimum: int, flag: str) -> None:
    if value < minimum:
        raise UsageError(f"{flag} {value}: must be >= {minimum}")
