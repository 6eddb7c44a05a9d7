"""Several optimizer steps per step of Lightning's loop (Keras calls it
``steps_per_execution``): the Trainer's per-batch Python — its loop, hooks, fetcher and
closure, ~0.5 ms on 2 cores — is paid once per K steps instead of every step. At batch 256
on 2 cores it took kosmoss from 0.89 to 0.93 of the raw loop
(docs/bench/2026-11-26-midday.md). The steps themselves are the same, in the same order:
losses and weights are bit-identical to one step per batch (bf16-mixed included: the
backward passes run outside the step's autocast, as Lightning runs them).

Only where a step of the loop can hold several: one process of the DDP engine (DDP and
Horovod want one backward per forward of their wrapped model), the loader in this process
(workers and pinned memory hand out single batches: on a GPU the data must be there,
``--mode device``). With ``--cuda-graphs`` a chunk's K steps are replayed from one CUDA
graph (:mod:`.graphs`).
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from typing import Callable, Iterator, List, Optional

import pytorch_lightning as pl
import torch
from torch import nn

from ..core.errors import ConfigError
from ..data.loading import RankBatchSampler
from ..engines.base import Engine
from . import lightning_private as private
from .host_reads import LaterRead
from .lean import LeanLitMLP

STEPS_PER_EXECUTION = 8  # 0.93 of the raw loop at 256 on 2 cores; 32 measured no better


def steps_per_execution(asked: Optional[int], world_size: int, engine: Engine, accelerator: str,
                        data_mode: str, num_workers: int, num_nodes: int = 1) -> int:
    """K for a run: ``asked``, else STEPS_PER_EXECUTION where a loop step can hold several,
    else 1. Asking for more than 1 where it cannot is a ConfigError."""
    world = (f"{world_size} processes" if num_nodes == 1 else
             f"{num_nodes} nodes ({world_size} processes)")
    why_not = [reason for reason, holds in (
        (world, world_size == 1),
        (f"--strategy {engine.name}", engine.steps_in_chunks),
        (f"a GPU fed from host memory (--mode {data_mode})",
         accelerator == "cpu" or data_mode == "device"),
        (f"{num_workers} data workers", num_workers == 0)) if not holds]
    if asked is None:
        return 1 if why_not else STEPS_PER_EXECUTION
    if asked > 1 and why_not:
        raise ConfigError("steps_per_execution", f"{{field}} {asked}: several steps per batch "
                          "need one process of the ddp engine reading its batches in-process "
                          "(no data workers; on a GPU, --mode device); this run has "
                          f"{', '.join(why_not)}: give 1 or leave it out")
    return asked


class Chunk:
    """Up to K of an epoch's batches for one training step of Lightning's loop (one per
    optimizer step, kosmoss.run.chunks): each is read when the step takes it, so it is
    still in the cache (a chunk read whole first lost the gain, docs/bench/2026-11-26-midday.md)."""

    def __init__(self, read: Callable, batches: List, taken: Callable[[], None]) -> None:
        self._read, self._taken = read, taken
        self.keep(len(batches), batches)
        # When each step ended: the moment the next batch (or the end) was asked for.
        self.step_ends: List[float] = []
        self.set_up_s = 0.0  # inside the first step's interval, no step's time (a capture)

    def keep(self, steps: int, batches: Optional[List] = None) -> None:
        """Only the first ``steps`` batches (--max-steps): the others stay unread."""
        self.batches = (self.batches if batches is None else batches)[:max(0, steps)]
        self.sizes = [len(batch) for batch in self.batches]
        self.samples, self.steps = sum(self.sizes), len(self.batches)

    def __iter__(self) -> Iterator:
        for batch in self.batches:
            self.step_ends.append(time.perf_counter())
            self._taken()
            yield self._read(batch)
        self.step_ends.append(time.perf_counter())

    def taken_whole(self, started: float, set_up_s: float = 0.0,
                    ends: Optional[List[float]] = None) -> None:
        """Every batch trained at once (from ``started``): taken, and the steps timed at
        ``ends`` where they ran one by one, else (a replay) as equal shares of it, after
        the ``set_up_s`` seconds of a capture that preceded it."""
        ended = time.perf_counter()
        for _ in self.batches:
            self._taken()
        self.set_up_s = set_up_s
        if ends and len(ends) == self.steps:
            self.step_ends = [started, *ends]
            return
        share = (ended - started - set_up_s) / max(1, self.steps)
        self.step_ends = [started] + [started + set_up_s + share * step
                                      for step in range(1, self.steps + 1)]


class ChunkedBatchLoader:
    """A BatchLoader whose items are :class:`Chunk` s of ``steps`` batches, cut from the
    epoch's start (the last one shorter), so the count Lightning takes from ``len`` holds
    for every epoch and a resumed one. It checkpoints the batches the steps took, not its
    chunks: a step that stops at ``--max-steps`` leaves the rest of its chunk unread."""

    batch_sampler = None  # as BatchLoader

    def __init__(self, dataset, sampler: RankBatchSampler, steps: int) -> None:
        self.dataset, self.sampler, self.steps = dataset, sampler, steps
        self._skipped = self._taken = 0

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.steps)

    def __iter__(self) -> Iterator[Chunk]:
        # Now, not at the first chunk: a resumed Lightning run sets the sampler's epoch
        # between the two (RankBatchSampler.resume).
        self._skipped, self._taken = self.sampler.skips, 0
        return self._chunks(iter(self.sampler))

    def _chunks(self, batches: Iterator) -> Iterator[Chunk]:
        # A resumed epoch first fills its chunk up to the next boundary of K.
        size = self.steps - self._skipped % self.steps
        while True:
            chunk = list(itertools.islice(batches, size))  # index arrays: nothing read yet
            if not chunk:
                return
            yield Chunk(self.dataset.__getitem__, chunk, self._took_one)
            size = self.steps

    def _took_one(self) -> None:
        self._taken += 1

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches_done": self._skipped + self._taken}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.resume(state["epoch"], state["batches_done"])


class StepsInChunks(LeanLitMLP):
    """LitMLP whose training step takes a :class:`Chunk` and makes one optimizer step per
    batch in it, as Lightning's automatic optimisation makes one per batch (zero_grad,
    backward, step, then the warm-up schedule). Same hyperparameters and state dict as
    LitMLP: its checkpoints load into either. ``graphs`` (set by the run path for
    ``--cuda-graphs``) replays a chunk's steps from a CUDA graph where it can."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False
        self.graphs = None  # a kosmoss.run.graphs.GraphedSteps, or None
        self.eager_chunks = 0  # chunks the graph could not take (graphs: how many it took)
        self._rows: List[tuple] = []  # train_loss rows not yet written: (LaterRead, step, epoch)

    def logs_train_loss_now(self) -> bool:
        return False  # the chunk's loop logs train_loss itself, with the step it belongs to

    def loss_of_normalised(self, x_normalised: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of LitMLP's step for inputs already normalised (a replay's
        bf16 store, kosmoss.run.graphs): the same arithmetic past the normalisation."""
        return nn.functional.mse_loss(self.net(x_normalised), self.normalize_y(y))

    def raw_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizers().optimizer

    def backward_context(self):
        # Lightning runs automatic optimisation's backward outside the step's autocast.
        return torch.autocast(self.device.type, enabled=False)

    def training_step(self, chunk: Chunk, batch_idx: int):
        schedule, max_steps = self.lr_schedulers(), self.trainer.max_steps
        if max_steps >= 0:  # the chunk's batches past --max-steps stay unread and untrained
            chunk.keep(max_steps - self.global_step)
        started = time.perf_counter()
        losses = self.graphs.run(chunk.batches) if self._may_replay() else None
        if (losses is None and chunk.batches and self._may_replay()
                and self.graphs.stored is not None):
            losses = self.graphs.eager(chunk.batches)  # the replays' inputs, in bf16
            self.eager_chunks += 1
        if losses is None:
            loss = self._eager(chunk, schedule)
            self.eager_chunks += 1
        else:
            chunk.taken_whole(started, self.graphs.set_up_s, self.graphs.step_ends)
            loss = self._count_replayed(chunk, losses, schedule)
        # The loggers' step axis counts optimizer steps, as with one step a batch: Lightning
        # adds 1 to this count after each of its batches and logs validation at it.
        private.set_logged_steps(self.trainer, self.global_step - 1)
        self.write_rows(wait=False)  # those whose values reached the host: the next chunk is queued
        return loss

    def _eager(self, chunk: Chunk, schedule):
        optimizer, loss = self.optimizers(), None
        for batch in chunk:
            logs, step = LeanLitMLP.logs_train_loss_now(self), self.global_step
            loss = self._common_step(batch, "train")
            optimizer.zero_grad()
            with self.backward_context():
                self.manual_backward(loss)
            optimizer.step()
            if schedule is not None:
                schedule.step()
            if logs:
                self._log_train_loss(loss, step, len(batch[0]))
        return loss

    def _may_replay(self) -> bool:
        """A captured step keeps the rate it was captured with: replay once the warm-up of
        the rate is over."""
        warmup = self.hparams.warmup_steps or 0
        return self.graphs is not None and self.global_step >= warmup

    def _count_replayed(self, chunk: Chunk, losses: torch.Tensor, schedule):
        """What Lightning and the eager loop do around each step, for the replayed ones:
        the step counters, the rate schedule, the logged rows."""
        for j, size in enumerate(chunk.sizes):
            logs, step = LeanLitMLP.logs_train_loss_now(self), self.global_step
            private.count_manual_step(self.trainer)
            if schedule is not None:
                schedule.step()
            if logs:
                self._log_train_loss(losses[j], step, size)
        return losses[-1]

    def _log_train_loss(self, loss, step: int, batch_size: int) -> None:
        # callback_metrics and the progress bar as LitMLP's own log fills them; the row goes
        # to the loggers here, at its own step: Lightning writes only at a chunk's end.
        # Past LeanLitMLP.log, which passes train_loss only on the loggers' steps.
        pl.LightningModule.log(self, "train_loss", loss, prog_bar=self.shows_progress(),
                               logger=False, batch_size=batch_size)
        if (step + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            self._rows.append((LaterRead(loss), step, self.current_epoch))

    def write_rows(self, wait: bool = True) -> None:
        """Writes the pending train_loss rows, in order: all of them (``wait``: before a
        validation logs its own, a checkpoint or the fit's end), or those whose value is
        on the host already (float(loss) at once waits for the chunk just queued on a GPU)."""
        while self._rows and (wait or self._rows[0][0].ready()):
            read, step, epoch = self._rows.pop(0)
            self._write_row(float(read.value()), step, epoch)

    def write_rows_after_failure(self, within_s: float) -> Optional[str]:
        """Writes the pending rows whose values reach the host within ``within_s``: a GPU
        stream stuck in a collective with a dead rank never hands them back, and a failed
        fit must still end. Returns why the others were not written (None: all were)."""
        rows, values, failed = self._rows, [], []
        self._rows = []

        def read() -> None:  # apart, so that waiting can stop; it only fills ``values``
            try:
                for row in rows:
                    values.append(float(row[0].value()))
            except RuntimeError as error:  # a sticky CUDA error: the values are gone
                failed.append(str(error))

        reader = threading.Thread(target=read, name="kosmoss-train-loss-rows", daemon=True)
        reader.start()
        reader.join(within_s)
        arrived = list(values)  # the reader may go on filling ``values``: not read again
        for value, (_, step, epoch) in zip(arrived, rows):
            self._write_row(value, step, epoch)
        if len(arrived) == len(rows):
            return None
        why = failed[0] if failed else f"their values did not reach the host in {within_s:g} s"
        return f"{len(rows) - len(arrived)} train_loss row(s) not written: {why}"

    def _write_row(self, value: float, step: int, epoch: int) -> None:
        for logger in self.loggers:
            logger.log_metrics({"train_loss": value, "epoch": epoch}, step=step)
            logger.save()

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self.write_rows()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        self.write_rows()  # a resume from it keeps every row up to its step

    def on_train_end(self) -> None:
        super().on_train_end()
        self.write_rows()
