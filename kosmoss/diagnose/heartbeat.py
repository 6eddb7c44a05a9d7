"""Heartbeats: each rank writes ``<run dir>/heartbeats/rank-<global rank>.json`` at most
once a second, for ``kosmoss watch`` (which only reads them).

    trainer = pl.Trainer(..., callbacks=[Heartbeat(run_dir)])

A file says where the rank is (state, step, epoch), how fast it goes over the last few
seconds (samples/s, steps/s) and where its step time goes: ``busy_ms`` (loading the
batch, forward, optimizer: the rank's own work) and ``wait_ms`` (backward, where DDP's
gradient all-reduce waits for the slowest rank). Under DDP every rank makes the same
number of steps per second, so a slow rank shows as the one with the largest ``busy_ms``
while the others wait in backward. On a GPU the CPU queues kernels and rarely waits, so
there the split is weak; compare GPU utilisation in ``watch`` instead.

Cost per step: three ``perf_counter`` calls and a few additions; the file (and the loss,
which on a GPU costs one synchronisation) only once per ``interval_s``.
"""
from __future__ import annotations

import math
import os
import socket
import time
from collections import deque
from pathlib import Path
from typing import Deque, Optional, Tuple

from ..core.files import atomic_write_json
from ..run.lean import LeanCallback
from .runs import heartbeat_path

INTERVAL_S = 1.0
WINDOW_S = 5.0  # rates are over this many seconds of the most recent steps


class Heartbeat(LeanCallback):
    """Writes this rank's heartbeat file (see the module docstring for its fields)."""

    def __init__(self, run_dir: Path, interval_s: float = INTERVAL_S) -> None:
        self.run_dir, self.interval_s = Path(run_dir), interval_s
        self._samples = 0
        self._steps = 0
        self._busy = 0.0  # totals since fit started; the window is taken at write time
        self._wait = 0.0
        self._batch_start: Optional[float] = None
        self._backward_start: Optional[float] = None
        self._last_end: Optional[float] = None
        self._last_write = float("-inf")
        self._history: Deque[Tuple[float, int, int, float, float]] = deque()
        self._loss: Optional[float] = None
        self._validation_start: Optional[float] = None

    def setup(self, trainer, pl_module, stage) -> None:
        self._write(trainer, "setup", force=True)  # names the rank's pid before any step

    def on_train_start(self, trainer, pl_module) -> None:
        self._history.clear()  # rates count from the first step, not from setup
        self._write(trainer, "train", force=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch_start = time.perf_counter()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._backward_start = time.perf_counter()

    def on_after_backward(self, trainer, pl_module) -> None:
        if self._backward_start is not None:
            self._wait += time.perf_counter() - self._backward_start
            self._backward_start = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._batch_start is not None:
            # Data loading happens between the previous batch's end and this batch's start.
            began = self._last_end if self._last_end is not None else self._batch_start
            self._busy += now - began
        self._last_end = now
        self._steps += getattr(batch, "steps", 1)  # a Chunk holds several (kosmoss.run.chunks)
        self._samples += _batch_size(batch)
        if now - self._last_write >= self.interval_s:
            self._loss = _loss_of(outputs)
            self._write(trainer, "train", now=now)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, "validate", force=True)
            self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self._validation_start is not None:
            self._leave_out(time.perf_counter() - self._validation_start)
            self._last_end = None
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            # Back to training: short epochs would otherwise leave "validate" in the file.
            self._write(trainer, "train", force=True)

    def _leave_out(self, seconds: float) -> None:
        """Validation is no step: its time is left out of the rates (the window's earlier
        points move later by it). Cleared instead, epochs shorter than ``interval_s`` (the
        tiny preset's) would never show a rate."""
        self._history = deque((t + seconds, *rest) for t, *rest in self._history)
        self._validation_start = None

    def on_train_end(self, trainer, pl_module) -> None:
        self._write(trainer, "ended", force=True)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._write(trainer, "failed", force=True, error=f"{type(exception).__name__}: "
                    f"{exception}"[:300])

    def _write(self, trainer, state: str, *, now: Optional[float] = None, force: bool = False,
               error: Optional[str] = None) -> None:
        now = time.perf_counter() if now is None else now
        if not force and now - self._last_write < self.interval_s:
            return
        self._last_write = now
        busy = self._busy - self._wait  # backward's time is waiting, not the rank's own work
        self._history.append((now, self._steps, self._samples, busy, self._wait))
        while len(self._history) > 2 and now - self._history[1][0] >= WINDOW_S:
            self._history.popleft()
        atomic_write_json(heartbeat_path(self.run_dir, trainer.global_rank), {
            "rank": trainer.global_rank, "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank, "world_size": trainer.world_size,
            "pid": os.getpid(), "host": socket.gethostname(), "state": state,
            "step": trainer.global_step, "epoch": trainer.current_epoch,
            "time": time.time(), "interval_s": self.interval_s, **_loss_fields(self._loss),
            "error": error, **self._rates(),
        })

    def _rates(self) -> dict:
        (t0, steps0, samples0, busy0, wait0), (t1, steps1, samples1, busy1, wait1) = \
            self._history[0], self._history[-1]
        steps, seconds = steps1 - steps0, t1 - t0
        if steps <= 0 or seconds <= 0:
            return {"window_s": None, "steps_per_s": None, "samples_per_s": None,
                    "busy_ms": None, "wait_ms": None}
        return {"window_s": round(seconds, 3), "steps_per_s": steps / seconds,
                "samples_per_s": (samples1 - samples0) / seconds,
                "busy_ms": 1000 * (busy1 - busy0) / steps,
                "wait_ms": 1000 * (wait1 - wait0) / steps}


def _batch_size(batch) -> int:
    if hasattr(batch, "samples"):  # a Chunk
        return batch.samples
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


def _loss_fields(loss: Optional[float]) -> dict:
    """JSON has no NaN (kosmoss writes null): a loss that is no number says which it was,
    so that `kosmoss watch` shows a diverging rank as nan, not as a blank
    (:func:`~.runs.loss_of_beat` reads it)."""
    if loss is None or math.isfinite(loss):
        return {"loss": loss}
    return {"loss": None, "loss_is": str(loss)}  # "nan", "inf" or "-inf": float() reads them


def _loss_of(outputs) -> Optional[float]:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(loss.detach()) if loss is not None else None
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return None
