"""The one step clock: samples/s in steady state, for a kosmoss run (through
:class:`kosmoss.run.callbacks.ThroughputMeter`) and for the bench's raw loop alike.

The first step (warm-up) is not counted, nor any pause (validation); on a GPU the clock
waits for the queued steps where an interval starts and ends (CUDA runs behind Python).
Lightning's ThroughputMonitor logs windowed per-step values to the loggers; a run summary
and the bench need one number and the same rule on both sides, so it is kept here.

The clock also counts this process's minor page faults over the same timed steps: a step
that hands its buffers back to the system and faults them in again costs as much as the
arithmetic here (docs/bench/2026-11-22.md), and the count shows it where timings on a shared machine don't.
It reads them where an interval of steps starts and where it pauses, never per step:
``getrusage(RUSAGE_SELF)`` sums every thread's counters: after a 2-thread matmul on this
2-core VM it took 4 µs (mean) with the other core idle, but a mean of 0.5 ms (up to 8 ms)
with another process busy on it — as each rank of a 2-rank run is for the other.
"""
from __future__ import annotations

import resource
import time
from typing import Optional

import torch


def minor_faults() -> int:
    """Minor page faults of this process so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class StepClock:
    def __init__(self) -> None:
        self.samples, self.steps, self.elapsed, self.faults = 0, 0, 0.0, 0
        self.squares = 0.0  # sum of the squared step times: their spread (step_cv)
        self.first_step_unix: Optional[float] = None
        self._last: Optional[float] = None
        self._faults_at_start = 0  # where the running interval of timed steps began

    def step_done(self, samples: int, device: torch.device, ended: Optional[float] = None,
                  set_up_s: float = 0.0) -> bool:
        """Count a finished step (``ended``: when, by ``time.perf_counter``, if not now: the
        steps of a chunk are counted after it; ``set_up_s``: seconds inside it that were no
        training, a CUDA graph's capture); True for the first one (the warm-up)."""
        if self._last is None:  # an interval starts: its first step only sets the clock
            self._last = synced_clock(device) if ended is None else ended
            self._faults_at_start = minor_faults()
            first = self.first_step_unix is None
            if first:
                self.first_step_unix = time.time()
            return first
        now = time.perf_counter() if ended is None else ended
        took = now - self._last - set_up_s
        self.elapsed += took
        self.squares += took ** 2
        self.samples += samples
        self.steps += 1
        self._last = now
        return False

    def start(self, at: float) -> None:
        """Begin an interval at ``at`` (``time.perf_counter``) unless one runs: the next step
        is counted whole."""
        if self._last is None:
            self._last = at
            self._faults_at_start = minor_faults()

    def pause(self, device: torch.device) -> None:
        if self._last is not None:
            if device.type == "cuda":
                self.elapsed += synced_clock(device) - self._last  # the queued steps
            self.faults += minor_faults() - self._faults_at_start
        self._last = None

    @property
    def samples_per_s(self) -> Optional[float]:
        return self.samples / self.elapsed if self.elapsed > 0 else None

    @property
    def step_cv(self) -> Optional[float]:
        """Standard deviation of the timed steps ÷ their mean: how much a step jitters. Ranks
        that meet at every step wait for the slowest, so jitter costs DDP time
        (kosmoss.scaling.projection)."""
        if self.steps < 2 or self.elapsed <= 0:
            return None
        mean = self.elapsed / self.steps
        return max(0.0, self.squares / self.steps - mean * mean) ** 0.5 / mean

    @property
    def faults_per_step(self) -> Optional[float]:
        """Minor page faults per timed step (the steps the samples/s counts)."""
        running = minor_faults() - self._faults_at_start if self._last is not None else 0
        return (self.faults + running) / self.steps if self.steps else None


def synced_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
