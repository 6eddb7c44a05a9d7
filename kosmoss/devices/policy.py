"""One device policy for launchers, model, loader and metrics.

Who decides (Fed-BioMed's split): the *machine* offers a GPU, forces it, or not at all,
and may pick one by index; the *run* requests one. The machine's setting wins; a run
that needs a GPU (``require``) fails with a one-line error instead of falling back.
The result (declearn's idea) is one object that tensors, checkpoints loaded from
elsewhere and metrics follow. See docs/devices.md for the whole decision table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from ..core.errors import ConfigError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import torch

MACHINE_ENV, INDEX_ENV = "KOSMOSS_MACHINE_GPU", "KOSMOSS_GPU_INDEX"

MACHINE_SETTINGS = ("none", "offer", "force")


def __getattr__(name: str):
    # torch is imported when first used: a launcher's usage error must not wait seconds for it.
    if name == "torch":
        import torch

        return torch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class MachineGpu:
    """What the machine allows: ``none`` (CPU only), ``offer`` (a GPU if the run asks),
    ``force`` (a GPU whatever the run asks); ``index`` picks one GPU."""

    setting: str = "none"
    index: Optional[int] = None

    def __post_init__(self) -> None:
        if self.setting not in MACHINE_SETTINGS:
            raise ValueError(f"setting must be one of {MACHINE_SETTINGS}, got {self.setting!r}")

    @classmethod
    def from_environment(cls, default: str) -> "MachineGpu":
        """The machine's own say, for every entry point: ``KOSMOSS_MACHINE_GPU`` (none, offer,
        force; default: the entry point's) and ``KOSMOSS_GPU_INDEX`` (one GPU to use)."""
        setting = os.environ.get(MACHINE_ENV) or default
        index = os.environ.get(INDEX_ENV)
        if setting not in MACHINE_SETTINGS:
            raise UsageError(f"{MACHINE_ENV}={setting}: choose one of {', '.join(MACHINE_SETTINGS)}")
        if index is not None and not index.isdigit():
            raise UsageError(f"{INDEX_ENV}={index}: give a CUDA index >= 0, or unset it")
        return cls(setting, int(index) if index is not None else None)


@dataclass(frozen=True)
class DevicePolicy:
    """Where this process computes: ``gpu`` and its CUDA ``index``, and why (warnings);
    ``gpu_ids``: the CUDA ids of the local ranks (``--gpu-ids``), ``visible``: GPUs seen."""

    gpu: bool
    index: Optional[int] = None
    warnings: Tuple[str, ...] = field(default=())
    gpu_ids: Optional[Tuple[int, ...]] = None
    visible: int = 0

    @property
    def gpus_on_host(self) -> int:
        """The GPUs this host's ranks share (0 on CPU)."""
        if not self.gpu:
            return 0
        return len(self.gpu_ids) if self.gpu_ids else self.visible

    def trainer_devices(self, processes_per_node: int, first_on_host: int = 0):
        """Lightning's ``devices``: a list of CUDA ids pins local rank r to ids[r] (Lightning's
        own mapping); a machine that picked one GPU gives it to its one process. Where the
        ranks share GPUs (:meth:`rank_devices`), the GPUs they use: Lightning checks that
        each exists, and would refuse ``devices=2`` on a machine with one."""
        shared = self.rank_devices(processes_per_node, first_on_host)
        if shared:
            return sorted({device.index for device in shared})
        if self.gpu and self.gpu_ids:
            return list(self.gpu_ids)
        if self.gpu and self.index and processes_per_node == 1:
            return [self.index]
        return processes_per_node

    def rank_devices(self, processes_per_node: int, first_on_host: int = 0):
        """Each local rank's CUDA device, for the strategy's ``parallel_devices``, where
        Lightning's own mapping (local rank r on GPU r) does not hold: more ranks on this
        host than GPUs, or a simulated node whose ranks are not the host's first
        (``first_on_host``: the host's ranks before this node's). The host's rank h uses GPU
        h mod GPUs, the round-robin :func:`sharing` counts. None where Lightning's holds, and
        where the machine picked one GPU (``KOSMOSS_GPU_INDEX``): its ranks stay on it."""
        if not self.gpu or self.gpu_ids or self.index or not self.visible:
            return None
        if first_on_host == 0 and processes_per_node <= self.visible:
            return None
        import torch

        return [torch.device("cuda", (first_on_host + rank) % self.visible)
                for rank in range(processes_per_node)]

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.index or 0) if self.gpu else torch.device("cpu")

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpu else "cpu"

    def to(self, value: Any) -> Any:
        """Tensors and modules go to the policy's device; anything else is left as it is."""
        return value.to(self.device) if hasattr(value, "to") else value

    def load(self, path: Path) -> Any:
        """A checkpoint saved anywhere (a GPU run, another node), mapped to this device."""
        import torch

        return torch.load(path, map_location=self.device, weights_only=False)


def decide(machine: MachineGpu, use_gpu: bool, *, require: bool = False,
           gpu_count: Optional[int] = None,
           gpu_ids: Optional[Sequence[int]] = None) -> DevicePolicy:
    """The decision table of docs/devices.md. ``gpu_count`` defaults to what torch sees."""
    count = _visible_gpus() if gpu_count is None else gpu_count
    wants = machine.setting == "force" or (machine.setting == "offer" and use_gpu)
    warnings = []
    if use_gpu and machine.setting == "none":
        warnings.append("the run asks for a GPU but this machine does not offer one: CPU")
    if wants and count == 0:
        warnings.append("a GPU was wanted but none is visible (torch.cuda.device_count() == 0): CPU")
    if require and not (wants and count > 0):
        reason = warnings[-1] if warnings else "the machine's setting keeps this run on CPU"
        raise ConfigError("require_gpu", f"{{field}}: {reason}; run without {{field}} to train "
                          "on CPU")
    if not (wants and count > 0):
        return DevicePolicy(False, None, tuple(warnings), visible=count)
    missing = [i for i in gpu_ids or () if i >= count]
    if missing:
        raise ConfigError("gpu_ids", f"{{field}} {','.join(map(str, gpu_ids))}: CUDA id "
                          f"{missing[0]} does not exist ({count} visible: 0..{count - 1})")
    index = machine.index if machine.index is not None else 0
    if not 0 <= index < count:
        warnings.append(f"GPU {index} does not exist ({count} visible): using GPU 0")
        index = 0
    if gpu_ids:
        index = gpu_ids[0]
    return DevicePolicy(True, index, tuple(warnings), tuple(gpu_ids) if gpu_ids else None, count)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def gpu_for_local_rank(local_rank: int, gpu_ids: Sequence[int]) -> int:
    """DeepLIIF-style ``--gpu-ids``: local rank ``r`` uses ``gpu_ids[r]``."""
    if not 0 <= local_rank < len(gpu_ids):
        raise ConfigError("gpu_ids", f"{{field}} {','.join(map(str, gpu_ids))}: no id for local "
                          f"rank {local_rank}; give one id per process on the node")
    return gpu_ids[local_rank]


@dataclass(frozen=True)
class Sharing:
    """How ranks share the GPUs of one host (SecretFlow's rule)."""

    backend: str
    memory_fraction: float
    reason: str


def sharing(ranks_on_host: int, gpus_on_host: int) -> Sharing:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); gloo accepts CUDA
    tensors, so ranks that share a card use gloo and 1/n of its memory each."""
    if gpus_on_host == 0:
        return Sharing("gloo", 1.0, "no GPU: gloo is the CPU backend")
    if ranks_on_host <= gpus_on_host:
        return Sharing("nccl", 1.0, "one rank per GPU: NCCL")
    per_gpu = -(-ranks_on_host // gpus_on_host)
    return Sharing("gloo", 1.0 / per_gpu,
                   f"{ranks_on_host} ranks share {gpus_on_host} GPU(s): NCCL refuses duplicate "
                   f"GPUs, so gloo, and each rank may use 1/{per_gpu} of its GPU's memory")


def apply_sharing(share: Sharing, device: torch.device) -> None:
    """In each rank, once its CUDA device is known: cap it at its share of the GPU."""
    if device.type == "cuda" and share.memory_fraction < 1.0:
        import torch

        torch.cuda.set_per_process_memory_fraction(share.memory_fraction, device)


def to_numpy(value: Any) -> np.ndarray:
    """Any tensor, on any device and in any dtype (bf16 included), as a numpy array."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.numpy()
    return np.asarray(value)
