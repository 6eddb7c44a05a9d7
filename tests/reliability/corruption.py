"""A batch made inf on one rank at a chosen step: the way a run diverges (a corrupt column,
a rate too high) landing exactly where a test wants it. DDP averages that rank's NaN
gradients into every rank's weights, as it would a real one's.

``corrupt_at.py`` runs trainup_cpu.py with it (every rank Lightning starts runs the same
script); ``in_process`` adds it to a run in this process."""
from __future__ import annotations

import os
from typing import Optional

import pytorch_lightning as pl

STEP_ENV, RANK_ENV, WHERE_ENV = "CORRUPT_STEP", "CORRUPT_RANK", "CORRUPT_WHERE"


class CorruptBatchAt(pl.Callback):
    """Sets the first input of the batch that the step ``step`` trains on (counted as
    global_step before it) to +inf on ``rank``; ``where="val"``: of every batch of the
    validations during the fit at or after that step; ``"final"``: of the validation
    after the fit (trainer.validate)."""

    def __init__(self, step: int, rank: int = 0, where: str = "train") -> None:
        self.step, self.rank, self.where = step, rank, where

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.where != "train" or trainer.global_rank != self.rank:
            return
        steps = getattr(batch, "steps", None)  # a Chunk of K batches, read one by one
        if steps is None:
            if trainer.global_step == self.step:
                _corrupt(batch)
            return
        if trainer.global_step <= self.step < trainer.global_step + steps:
            index, read = self.step - trainer.global_step, batch._read
            chosen = batch.batches[index]
            batch._read = lambda indices: _corrupt(read(indices)) if indices is chosen \
                else read(indices)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                  dataloader_idx=0) -> None:
        when = {"val": "fit", "final": "validate"}.get(self.where)
        if (when == trainer.state.fn and not trainer.sanity_checking
                and trainer.global_step >= self.step and trainer.global_rank == self.rank):
            _corrupt(batch)


def _corrupt(batch):
    batch[0].view(-1)[0] = float("inf")  # a copy gathered for this batch: the store is intact
    return batch


def from_environment() -> Optional[CorruptBatchAt]:
    if STEP_ENV not in os.environ:
        return None
    return CorruptBatchAt(int(os.environ[STEP_ENV]), int(os.environ.get(RANK_ENV, "0")),
                          os.environ.get(WHERE_ENV, "train"))


def environment(step: int, rank: int = 0, where: str = "train") -> dict:
    return {STEP_ENV: str(step), RANK_ENV: str(rank), WHERE_ENV: where}
