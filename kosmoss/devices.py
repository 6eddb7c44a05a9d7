"""One device policy for launchers, model, loader and metrics.

Who decides (Fed-BioMed's split): the *machine* offers a GPU, forces it, or not at all,
and may pick one by index; the *run* requests one. The machine's setting wins; a run
that needs a GPU (``require``) fails with a one-line error instead of falling back.
The result (declearn's idea) is one object that tensors, checkpoints loaded from
elsewhere and metrics follow. See docs/devices.md for the whole decision table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

from .errors import UsageError

MACHINE_SETTINGS = ("none", "offer", "force")


@dataclass(frozen=True)
class MachineGpu:
    """What the machine allows: ``none`` (CPU only), ``offer`` (a GPU if the run asks),
    ``force`` (a GPU whatever the run asks); ``index`` picks one GPU."""

    setting: str = "none"
    index: Optional[int] = None

    def __post_init__(self) -> None:
        if self.setting not in MACHINE_SETTINGS:
            raise ValueError(f"setting must be one of {MACHINE_SETTINGS}, got {self.setting!r}")


@dataclass(frozen=True)
class DevicePolicy:
    """Where this process computes: ``gpu`` and its CUDA ``index``, and why (warnings)."""

    gpu: bool
    index: Optional[int] = None
    warnings: Tuple[str, ...] = field(default=())

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index or 0) if self.gpu else torch.device("cpu")

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpu else "cpu"

    def to(self, value: Any) -> Any:
        """Tensors and modules go to the policy's device; anything else is left as it is."""
        return value.to(self.device) if hasattr(value, "to") else value

    def load(self, path: Path) -> Any:
        """A checkpoint saved anywhere (a GPU run, another node), mapped to this device."""
        return torch.load(path, map_location=self.device, weights_only=False)


def decide(machine: MachineGpu, use_gpu: bool, *, require: bool = False,
           gpu_count: Optional[int] = None) -> DevicePolicy:
    """The decision table of docs/devices.md. ``gpu_count`` defaults to what torch sees."""
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    wants = machine.setting == "force" or (machine.setting == "offer" and use_gpu)
    warnings = []
    if use_gpu and machine.setting == "none":
        warnings.append("the run asks for a GPU but this machine does not offer one: CPU")
    if wants and count == 0:
        warnings.append("a GPU was wanted but none is visible (torch.cuda.device_count() == 0): CPU")
    if require and not (wants and count > 0):
        reason = warnings[-1] if warnings else "the machine's setting keeps this run on CPU"
        raise UsageError(f"--require-gpu: {reason}; run without --require-gpu to train on CPU")
    if not (wants and count > 0):
        return DevicePolicy(False, None, tuple(warnings))
    index = machine.index if machine.index is not None else 0
    if not 0 <= index < count:
        warnings.append(f"GPU {index} does not exist ({count} visible): using GPU 0")
        index = 0
    return DevicePolicy(True, index, tuple(warnings))


def gpu_for_local_rank(local_rank: int, gpu_ids: Sequence[int]) -> int:
    """DeepLIIF-style ``--gpu-ids``: local rank ``r`` uses ``gpu_ids[r]``."""
    if not 0 <= local_rank < len(gpu_ids):
        raise UsageError(f"--gpu-ids {','.join(map(str, gpu_ids))}: no id for local rank "
                         f"{local_rank}; give one id per process on the node")
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
        torch.cuda.set_per_process_memory_fraction(share.memory_fraction, device)


def to_numpy(value: Any) -> np.ndarray:
    """Any tensor, on any device and in any dtype (bf16 included), as a numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.numpy()
    return np.asarray(value)
