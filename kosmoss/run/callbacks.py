"""Callbacks that measure a run: steady-state throughput (with the times, losses and memory
peaks `kosmoss bench` reads) and replica agreement."""
from __future__ import annotations

import hashlib
import sys
import time
from typing import List, Optional

import psutil
import pytorch_lightning as pl
import torch

from ..devices import Sharing, apply_sharing, to_numpy


class ThroughputMeter(pl.Callback):
    """Training samples per second over the whole world, in steady state; when each
    validation ended and its loss (time to a target loss); peak memory of every rank.

    Lightning's ThroughputMonitor logs windowed per-step values to the loggers; a run
    summary needs one number, so this keeps totals: the first step (warm-up) and any
    interval that contains validation are left out. On a GPU the clock waits for the
    queued steps where an interval starts and ends (CUDA runs behind the Python loop).
    """

    def __init__(self) -> None:
        self.samples = 0
        self.elapsed = 0.0
        self.first_step_s: Optional[float] = None
        self.first_step_unix: Optional[float] = None
        self.samples_per_s: Optional[float] = None
        self.val_curve: List[dict] = []
        self.peak_host_rss_mib: List[float] = []
        self.peak_gpu_mib: List[float] = []
        self._fit_start = 0.0
        self._last: Optional[float] = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = _synced_clock(pl_module.device) if self._last is None else time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self._fit_start
            self.first_step_unix = time.time()
        elif self._last is not None:
            self.elapsed += now - self._last
            self.samples += len(batch[0])
        self._last = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self._close_interval(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        loss = trainer.callback_metrics.get("val_loss")
        if not trainer.sanity_checking and loss is not None:
            self.val_curve.append({"step": trainer.global_step, "unix_time": time.time(),
                                   "val_loss": float(loss)})

    def on_train_end(self, trainer, pl_module) -> None:
        self._close_interval(pl_module)
        device = pl_module.device  # NCCL reduces CUDA tensors only
        samples = trainer.strategy.reduce(torch.tensor(float(self.samples), device=device),
                                          reduce_op="sum")
        elapsed = trainer.strategy.reduce(torch.tensor(self.elapsed, device=device),
                                          reduce_op="mean")
        if float(elapsed) > 0:
            self.samples_per_s = float(samples) / float(elapsed)
        gpu = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        peaks = pl_module.all_gather(torch.tensor([peak_host_rss_mib(), gpu], device=device))
        self.peak_host_rss_mib, self.peak_gpu_mib = peaks.reshape(-1, 2).T.tolist()

    def _close_interval(self, pl_module) -> None:
        if self._last is not None and pl_module.device.type == "cuda":
            self.elapsed += _synced_clock(pl_module.device) - self._last  # the queued steps
        self._last = None


def _synced_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def peak_host_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (current RSS where the OS keeps
    no peak)."""
    try:
        import resource
    except ImportError:  # Windows
        return psutil.Process().memory_info().rss / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


class GpuShare(pl.Callback):
    """Ranks that share a GPU each take 1/n of its memory (kosmoss.devices.sharing)."""

    def __init__(self, share: Sharing) -> None:
        self.share = share

    def setup(self, trainer, pl_module, stage) -> None:
        apply_sharing(self.share, trainer.strategy.root_device)


def parameter_checksum(module: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    return hashlib.sha256(to_numpy(flat).tobytes()).hexdigest()[:15]


class ReplicaCheck(pl.Callback):
    """After training, gathers a checksum of every rank's weights: DDP replicas that
    agree bit for bit have the same checksum."""

    def __init__(self) -> None:
        self.checksums: List[str] = []

    def on_train_end(self, trainer, pl_module) -> None:
        mine = torch.tensor(int(parameter_checksum(pl_module), 16), dtype=torch.int64,
                            device=pl_module.device)  # NCCL gathers CUDA tensors only
        gathered = pl_module.all_gather(mine).reshape(-1)
        self.checksums = [f"{int(value):015x}" for value in gathered.tolist()]

    @property
    def identical(self) -> bool:
        return len(set(self.checksums)) == 1
