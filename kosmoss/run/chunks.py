"""Several optimizer steps per step of Lightning's loop (Keras calls it
``steps_per_execution``): the Trainer's per-batch Python — its loop, hooks, fetcher and
closure, ~0.5 ms on 2 cores — is paid once per K steps instead of every step. At batch 256
on 2 cores it took kosmoss from 0.89 to 0.93 of the raw loop (issue 19,
docs/benchmarks.md). The steps themselves are the same, in the same order: losses and
weights are bit-identical to one step per batch.

Only where a step of the loop can hold several: one process of the DDP engine (DDP and
Horovod want one backward per forward of their wrapped model), the loader in this process
(workers and pinned memory hand out single batches), on the CPU and in 32-bit (autocast
would wrap the backward passes too; a GPU run at its batch is not bound by Python).
"""
from __future__ import annotations

import math
from typing import Optional

from ..data.datamodule import Chunk
from ..engines.base import Engine
from ..errors import ConfigError
from ..hooks import LeanCallback
from ..model import LitMLP

STEPS_PER_EXECUTION = 8  # 0.93 of the raw loop at 256 on 2 cores; 32 measured no better


def steps_per_execution(asked: Optional[int], world_size: int, engine: Engine, accelerator: str,
                        precision: str, num_workers: int) -> int:
    """K for a run: ``asked``, else STEPS_PER_EXECUTION where a loop step can hold several,
    else 1. Asking for more than 1 where it cannot is a ConfigError."""
    why_not = [reason for reason, holds in (
        (f"{world_size} processes", world_size == 1),
        (f"--strategy {engine.name}", engine.steps_in_chunks),
        (f"a {accelerator.upper()}", accelerator == "cpu"),
        (f"--precision {precision}", precision == "32-true"),
        (f"{num_workers} data workers", num_workers == 0)) if not holds]
    if asked is None:
        return 1 if why_not else STEPS_PER_EXECUTION
    if asked > 1 and why_not:
        raise ConfigError("steps_per_execution", f"{{field}} {asked}: several steps per batch "
                          "need one CPU process of the ddp engine, 32-true and no data workers; "
                          f"this run has {', '.join(why_not)}: give 1 or leave it out")
    return asked


class StepsInChunks(LitMLP):
    """LitMLP whose training step takes a :class:`Chunk` and makes one optimizer step per
    batch in it, as Lightning's automatic optimisation makes one per batch (zero_grad,
    backward, step, then the warm-up schedule). Same hyperparameters and state dict as
    LitMLP: its checkpoints load into either."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def _logs_this_step(self) -> bool:
        return False  # the chunk's loop logs train_loss itself, with the step it belongs to

    def training_step(self, chunk: Chunk, batch_idx: int):
        optimizer, schedule = self.optimizers(), self.lr_schedulers()
        loss, max_steps = None, self.trainer.max_steps
        if max_steps >= 0:  # the chunk's batches past --max-steps stay unread and untrained
            chunk.keep(max_steps - self.global_step)
        for batch in chunk:
            logs, step = LitMLP._logs_this_step(self), self.global_step
            loss = self._common_step(batch, "train")
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            if schedule is not None:
                schedule.step()
            if logs:
                self._log_train_loss(loss, step, len(batch[0]))
        # The loggers' step axis counts optimizer steps, as with one step a batch: Lightning
        # adds 1 to this count after each of its batches and logs validation at it.
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.global_step - 1
        return loss

    def _log_train_loss(self, loss, step: int, batch_size: int) -> None:
        # callback_metrics and the progress bar as LitMLP's own log fills them; the row goes
        # to the loggers here, at its own step: Lightning writes only at a chunk's end.
        self.log("train_loss", loss, prog_bar=self._shows_progress(), logger=False,
                 batch_size=batch_size)
        if (step + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            row = {"train_loss": float(loss), "epoch": self.current_epoch}
            for logger in self.loggers:
                logger.log_metrics(row, step=step)
                logger.save()


class ChunkCounts(LeanCallback):
    """A checkpoint counts its epoch's batches in the unit of the run that saved it (chunks
    or batches) and its steps in the optimisation it used (manual or automatic): a resume
    with another K (another world size) would restart mid-epoch at the wrong batch and at
    step 0. Before Lightning restores its loops, both are turned into this run's terms from
    what does not depend on them: the loader's batches done and the steps made."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        loops = checkpoint.get("loops", {}).get("fit_loop")
        if not loops:
            return
        loaders = loops.get("state_dict", {}).get("combined_loader") or [{}]
        done, epoch = loaders[0].get("batches_done"), loaders[0].get("epoch")
        batches = loops["epoch_loop.batch_progress"]
        if done is not None:
            _move(batches, self._chunks_done(trainer, done) - batches["current"]["processed"])
            self._reopen_epoch(loops["epoch_progress"], epoch, done, trainer)
        automatic = loops["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
        manual = loops["epoch_loop.manual_optimization.optim_step_progress"]
        steps = max(automatic["step"]["total"]["completed"], manual["total"]["completed"])
        for progress in (automatic["step"], automatic["zero_grad"], manual):
            _move(progress, steps - progress["total"]["completed"])


    @staticmethod
    def _reopen_epoch(epochs: dict, epoch: int, done: int, trainer) -> None:
        """--max-steps ends Lightning's epoch where it stops: a run trained further would
        go on with the next epoch's number (and its shuffle) after finishing this one's
        batches. Mid-epoch, the epoch stays open, as a checkpoint saved during it says."""
        per_epoch = trainer.datamodule.train_batches_per_epoch() if trainer.datamodule else None
        closed = epochs["current"]["completed"]
        if per_epoch is not None and done < per_epoch and closed == epoch + 1:
            for counters in (epochs["total"], epochs["current"]):
                counters["processed"] -= 1
                counters["completed"] -= 1

    def _chunks_done(self, trainer, done: int) -> int:
        """The epoch's chunks done: a chunk a step left part of at --max-steps counts once
        the resumed epoch has taken the rest (its first chunk fills up to K), unless it was
        the epoch's last."""
        per_epoch = trainer.datamodule.train_batches_per_epoch() if trainer.datamodule else None
        return math.ceil(done / self.steps) if done == per_epoch else done // self.steps


def _move(progress: dict, delta: int) -> None:
    """Move every counter of a Lightning progress by ``delta``: their differences, which
    tell Lightning where in a step the checkpoint was saved, stay."""
    for counters in (progress["total"], progress["current"]):
        for key in counters:
            counters[key] += delta
