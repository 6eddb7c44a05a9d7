"""Stop cleanly on SIGUSR1 / SIGTERM: every rank checkpoints at the same step, then exits.

Slurm sends SIGUSR1 ``--signal=SIGUSR1@90`` seconds before the time limit, and SIGTERM
on scancel or preemption. Lightning's own handlers save the checkpoint (or broadcast)
*inside* the signal handler, while a peer may sit in an all-reduce: here that left a job
neither requeued nor finished. So the handler only sets a flag; at the end of every step
the ranks all-reduce it, and all of them stop together at the same global step.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Optional

import pytorch_lightning as pl
import torch

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
CHECKPOINT = "preempted.ckpt"


class StopOnSignal(pl.Callback):
    def __init__(self, checkpoint_dir: Path) -> None:
        self.checkpoint = Path(checkpoint_dir) / CHECKPOINT
        self.received: Optional[int] = None
        self.stopped_by: Optional[str] = None
        self.stopped_at_step: Optional[int] = None

    def _note(self, signum, frame) -> None:
        self.received = signum

    def on_train_start(self, trainer, pl_module) -> None:
        # After Lightning registered its own handlers (Trainer._run), so these win.
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._note)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # On the rank's device: NCCL reduces CUDA tensors only.
        local = torch.tensor(float(self.received or 0), device=pl_module.device)
        signum = int(trainer.strategy.reduce(local, reduce_op="max"))
        if not signum:
            return
        self.stopped_by = signal.Signals(signum).name
        self.stopped_at_step = trainer.global_step
        trainer.save_checkpoint(self.checkpoint)
        trainer.should_stop = True

    def requeue_if_asked(self) -> Optional[str]:
        """Under Slurm, SIGUSR1 means "time is nearly up": put the job back in the queue;
        it comes back with the same job id, so the same run directory, and resumes.
        Called on global zero only; returns the requeued job's id."""
        job = os.environ.get("SLURM_JOB_ID")
        if self.stopped_by != "SIGUSR1" or not job:
            return None
        return job if subprocess.run(["scontrol", "requeue", job]).returncode == 0 else None
