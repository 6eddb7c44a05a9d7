"""Stop cleanly on SIGUSR1 / SIGTERM: every rank checkpoints at the same step, then exits.

Slurm sends SIGUSR1 ``--signal=SIGUSR1@90`` seconds before the time limit, and SIGTERM
on scancel or preemption. Lightning's own handlers save the checkpoint (or broadcast)
*inside* the signal handler, while a peer may sit in an all-reduce: here that left a job
neither requeued nor finished. So the handler only sets a flag, and the ranks agree on it
in an all-reduce at the end of a step (or of a validation): all of them stop together at
the same global step.

An all-reduce every step is a per-step collective (a synchronisation of the ranks, ~0.1 ms
on gloo, more on a busy host), so the ranks agree on it about once a second: the same
all-reduce carries each rank's proposal of how many steps a second is, and the smallest
one fixes the next check, at the same step on every rank. A single process checks its own
flag every step, with no collective.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from . import lightning_private as private
from .lean import LeanCallback

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
CHECKPOINT = "preempted.ckpt"
CHECK_EVERY_S = 1.0  # Slurm warns 90 s ahead; a stop within a second of the signal is plenty
MAX_STEPS_BETWEEN_CHECKS = 1000


class StopOnSignal(LeanCallback):
    """Stops every rank at one step on SIGUSR1 or SIGTERM, with ``preempted.ckpt``: inside
    an epoch, at once and with nothing a run never stopped would not do; on an epoch's last
    batch or during its validation, once the epoch has ended as in that run (its validation,
    its checkpoints)."""

    def __init__(self, checkpoint_dir: Path, *,
                 halted: Callable[[], bool] = lambda: False,
                 diverged_before_save: Optional[Callable[[], bool]] = None) -> None:
        self.checkpoint = Path(checkpoint_dir) / CHECKPOINT
        # The run ended otherwise at this step (its weights are NaN: kosmoss.run.divergence):
        # nothing to stop, nothing worth saving. Every rank knows it at the same step.
        self.halted = halted
        # The same, with a divergence check still on its way decided (a wait on a GPU): asked
        # only before a save, so the steps without a signal never wait for the GPU.
        self.diverged_before_save = diverged_before_save or halted
        self.received: Optional[int] = None
        self.stopped_by: Optional[str] = None
        self.stopped_at_step: Optional[int] = None
        self.stopped_mid_epoch = False
        self.checks = 0  # flag exchanges between the ranks (collectives) so far
        self._next_check_step = 0
        self._last_check: Optional[tuple] = None  # (global step, perf_counter) of the last one

    def _note(self, signum, frame) -> None:
        self.received = signum

    def on_train_start(self, trainer, pl_module) -> None:
        # After Lightning registered its own handlers (Trainer._run), so these win.
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._note)
        # Lightning 2.6 broadcasts rank 0's SIGTERM flag before every training step when the
        # world is larger than one: a collective per step (9 % of a 2-rank CPU step at batch
        # 256, py-spy, 2026-11-24). Its handler that sets the flag is replaced above, so the
        # flag is always 0, and these ranks agree on stops about once a second instead.
        private.drop_sigterm_broadcast(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.stopped_by or self.halted():
            return
        if trainer.world_size == 1:
            signum = self.received or 0
        elif trainer.global_step >= self._next_check_step:
            signum = self._agree(trainer, pl_module.device)
        else:
            return
        if not signum or self.diverged_before_save():
            return
        self._stop_here(trainer, signum)
        if private.on_last_batch(trainer):
            return  # every rank has as many batches: all of them save in on_train_end
        self.stopped_mid_epoch = True
        self._save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        """A signal that came during the epoch's validation stops the fit at that epoch's
        end, as one on its last batch would; left to the next step, it cost one more step
        of Lightning's loop (K batches) of the time Slurm gives before its kill, and after
        the fit's last validation it went unheard: the test pass ran on, into Slurm's kill
        where it outlasts the warning."""
        if self.stopped_by or trainer.sanity_checking or trainer.state.fn != "fit" or \
                self.halted():
            return  # the same on every rank: a validation ends on all of them together
        signum = self.received or 0
        if trainer.world_size > 1:
            signum = self._agree(trainer, pl_module.device)
        if signum and not self.diverged_before_save():
            self._stop_here(trainer, signum)

    def _stop_here(self, trainer, signum: int) -> None:
        self.stopped_by = signal.Signals(signum).name
        self.stopped_at_step = trainer.global_step
        private.end_fit_here(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.stopped_by and not self.stopped_mid_epoch and not self.diverged_before_save():
            self._save(trainer)

    def _save(self, trainer) -> None:
        # All of it (optimizer, loops, callbacks), said: Lightning logs a line per rank when
        # weights_only is left unset, the one line of a stopped run of simulated nodes.
        trainer.save_checkpoint(self.checkpoint, weights_only=False)

    def _agree(self, trainer, device) -> int:
        """One all-reduce (max) of [signal, -steps until the next check]: the signal any rank
        got, and the smallest proposal, so every rank checks next at the same step."""
        step, now = trainer.global_step, time.perf_counter()
        mine = torch.tensor([float(self.received or 0), -float(self._steps_per_check(step, now))],
                            device=device)  # on the rank's device: NCCL reduces CUDA tensors only
        signum, minus_steps = trainer.strategy.reduce(mine, reduce_op="max").tolist()
        self.checks += 1
        self._next_check_step = step + int(-minus_steps)
        self._last_check = (step, now)
        return int(signum)

    def _steps_per_check(self, step: int, now: float) -> int:
        if self._last_check is None or step <= self._last_check[0]:
            return 1  # no step time measured yet: check again after the next step
        step_s = (now - self._last_check[1]) / (step - self._last_check[0])
        return max(1, min(MAX_STEPS_BETWEEN_CHECKS, int(CHECK_EVERY_S / max(step_s, 1e-9))))

    def requeue_if_asked(self) -> Optional[str]:
        """Under Slurm, SIGUSR1 means "time is nearly up": put the job back in the queue;
        it comes back with the same job id, so the same run directory, and resumes.
        Called on global zero only; returns the requeued job's id."""
        job = os.environ.get("SLURM_JOB_ID")
        if self.stopped_by != "SIGUSR1" or not job:
            return None
        return job if subprocess.run(["scontrol", "requeue", job]).returncode == 0 else None

