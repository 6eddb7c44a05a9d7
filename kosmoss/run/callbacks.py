"""Callbacks that measure a run: steady-state throughput and replica agreement."""
from __future__ import annotations

import hashlib
import time
from typing import List, Optional

import pytorch_lightning as pl
import torch

from ..devices import Sharing, apply_sharing, to_numpy


class ThroughputMeter(pl.Callback):
    """Training samples per second over the whole world, in steady state.

    Lightning's ThroughputMonitor logs windowed per-step values to the loggers; a run
    summary needs one number, so this keeps totals: the first step (warm-up) and any
    interval that contains validation are left out.
    """

    def __init__(self) -> None:
        self.samples = 0
        self.elapsed = 0.0
        self.first_step_s: Optional[float] = None
        self.samples_per_s: Optional[float] = None
        self._fit_start = 0.0
        self._last: Optional[float] = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self._fit_start
        elif self._last is not None:
            self.elapsed += now - self._last
            self.samples += len(batch[0])
        self._last = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self._last = None

    def on_train_end(self, trainer, pl_module) -> None:
        samples = trainer.strategy.reduce(torch.tensor(float(self.samples)), reduce_op="sum")
        elapsed = trainer.strategy.reduce(torch.tensor(self.elapsed), reduce_op="mean")
        if float(elapsed) > 0:
            self.samples_per_s = float(samples) / float(elapsed)


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
        mine = torch.tensor(int(parameter_checksum(pl_module), 16), dtype=torch.int64)
        gathered = pl_module.all_gather(mine).reshape(-1)
        self.checksums = [f"{int(value):015x}" for value in gathered.tolist()]

    @property
    def identical(self) -> bool:
        return len(set(self.checksums)) == 1
