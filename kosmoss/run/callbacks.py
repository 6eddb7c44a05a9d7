"""Callbacks that measure a run: steady-state throughput (with the times, losses and memory
peaks `kosmoss bench` reads) and replica agreement; and the checkpointing of every run."""
from __future__ import annotations

import hashlib
import time
from typing import Callable, List, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar
from pytorch_lightning.utilities import rank_zero_warn
from torch.nn.parallel import DistributedDataParallel

from ..core.output import ReaderMayLeave
from ..devices.memory import peak_host_rss_mib
from ..devices.policy import Sharing, apply_sharing, to_numpy
from . import lightning_private as private
from .chunks import Chunk, ChunkedBatchLoader
from .lean import LeanCallback, LeanModelCheckpoint
from .throughput import StepClock


class CheckpointToTheEnd(LeanModelCheckpoint):
    """Lightning's ModelCheckpoint, whose ``last.ckpt`` also holds the final step. Lightning
    saves ``last`` after each validation and, at the end of training, only if it never saved
    one: a run ended by ``--max-steps`` mid-epoch kept the last validation's, and resuming
    it to train further trained the steps after that validation a second time. An epoch
    that a stop cut short is no epoch's end: nothing is saved then, as in a run never
    stopped (``preempted.ckpt`` holds that step); nor once the weights are NaN or inf
    (kosmoss.run.divergence). ``saves_no_more`` says when either happened."""

    def __init__(self, *args, saves_no_more: Callable[[], bool] = lambda: False,
                 **kwargs) -> None:
        # One run folder, one run: a resumed attempt replaces last.ckpt, never last-v1.ckpt.
        super().__init__(*args, enable_version_counter=False, **kwargs)
        self.saves_no_more = saves_no_more

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.saves_no_more():  # a NaN validation loss: its weights are not kept
            super().on_validation_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # --max-steps can end the first epoch before any validation: no val_loss yet to rank
        # a checkpoint by, and ModelCheckpoint would warn that it is missing (it saves none
        # either way). on_train_end below still saves last.ckpt.
        if self.monitor is not None and self.monitor not in trainer.callback_metrics:
            return
        if not self.saves_no_more():
            super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.saves_no_more():
            return  # Lightning's own would save last.ckpt at the stop
        if self.save_last and private.last_saved_step(self) != trainer.global_step:
            private.save_last(self, trainer)
        super().on_train_end(trainer, pl_module)

    def finish(self, trainer: pl.Trainer) -> None:
        """After a fit that had nothing to train (a resume at its end): last.ckpt holds the
        final step all the same."""
        if self.save_last and private.last_saved_step(self) != trainer.global_step:
            private.save_last(self, trainer)


# A failed fit waits this long for the rows a GPU still owes: they are the steps before the
# failure, and a stream stuck in a collective would otherwise hold the exit until NCCL's timeout.
ROWS_WAIT_ON_FAILURE_S = 10.0


class LogsWithCheckpoints(LeanCallback):
    """The loggers write their rows before every checkpoint: a run killed after one resumes
    from it with every row up to it on disk (the CSV logger writes every 100 steps). A fit
    that an exception ends writes the rows still waiting for a GPU's values first."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        for logger in trainer.loggers:
            logger.save()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Lightning's loggers close the failed run after the callbacks' on_exception; the
        # rows a GPU has not handed back (kosmoss.run.chunks) are only in pl_module till then.
        write_rows = getattr(pl_module, "write_rows_after_failure", None)
        if write_rows is None or not trainer.is_global_zero:  # the loggers write on rank 0 only
            return
        not_written = write_rows(ROWS_WAIT_ON_FAILURE_S)
        if not_written:
            rank_zero_warn(not_written)


class BatchesProgressBar(RichProgressBar):
    """Lightning's RichProgressBar, counting the epoch's batches (optimizer steps) where a step
    of its loop holds K of them (kosmoss.run.chunks): "26/26, 180 it/s", not "4/4, 23 it/s".
    Its console writes to standard output through ReaderMayLeave: a reader gone mid-fit
    leaves the bar silent, not the fit ended."""

    def __init__(self, **kwargs) -> None:
        kwargs["console_kwargs"] = {"file": ReaderMayLeave(), **kwargs.get("console_kwargs", {})}
        super().__init__(**kwargs)

    @property
    def total_train_batches(self):
        loader = self.trainer.train_dataloader
        if isinstance(loader, ChunkedBatchLoader):
            return len(loader.sampler)
        return super().total_train_batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ChunkedBatchLoader):  # its count includes a resumed epoch's skips
            batch_idx = loader.state_dict()["batches_done"] - 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class ThroughputMeter(LeanCallback):
    """Training samples per second over the whole world, in steady state (the one
    :class:`kosmoss.run.throughput.StepClock` rule, shared with the bench's raw loop); when each
    validation ended and its loss (time to a target loss); peak memory and minor page faults
    per timed step of every rank (a step that hands buffers back to the system and faults
    them in again shows here, not only as a slower step)."""

    def __init__(self) -> None:
        self.clock = StepClock()
        self.first_step_s: Optional[float] = None
        self.samples_per_s: Optional[float] = None
        self.val_curve: List[dict] = []
        self.peak_host_rss_mib: List[float] = []
        self.peak_gpu_mib: List[float] = []
        self.page_faults_per_step: List[float] = []
        self.step_time_cv: List[float] = []
        self.trained_from_step: Optional[int] = None
        self.restored_curve = False  # the curve before this attempt came from its checkpoint
        # The torch threads and world size of the attempt that saved the checkpoint resumed.
        self.threads_before: Optional[int] = None
        self.world_before: Optional[int] = None
        self._world_size = 1
        self._fit_start = 0.0
        # Several steps a loop step (kosmoss.run.chunks): from one chunk's last step to the
        # next chunk's first batch runs Lightning's loop alone, once per chunk.
        self._loop_gaps: List[float] = []
        self._last_chunk_end: Optional[float] = None

    @property
    def loop_step_s(self) -> Optional[float]:
        """Lightning's loop between two chunks (median), what a run making one step a batch
        pays every step; None without chunks."""
        gaps = sorted(self._loop_gaps)
        return gaps[len(gaps) // 2] if gaps else None

    @property
    def first_step_unix(self) -> Optional[float]:
        return self.clock.first_step_unix

    def state_dict(self) -> dict:
        # In every checkpoint: a resume, even from a killed attempt's, keeps the curve.
        return {"val_curve": list(self.val_curve), "torch_threads": torch.get_num_threads(),
                "world_size": self._world_size}

    def load_state_dict(self, state_dict: dict) -> None:
        self.val_curve = list(state_dict.get("val_curve", []))
        self.restored_curve = True
        self.threads_before = state_dict.get("torch_threads")  # absent before 2026-12-03
        self.world_before = state_dict.get("world_size")

    def setup(self, trainer, pl_module, stage) -> None:
        self._world_size = trainer.world_size

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()
        # The trainer's own step once a checkpoint is loaded: proof that a resume did not
        # start over (the checkpoint file's step would say the same either way).
        self.trained_from_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if isinstance(batch, Chunk):  # one optimizer step per batch in it, each timed
            if self.clock.first_step_unix is not None and batch.step_ends:
                # After a pause (a validation) the chunk's first step is no warm-up: counted
                # from the chunk's start (an epoch of one chunk would lose 1/K of it).
                self.clock.start(batch.step_ends[0])
            for j, (samples, ended) in enumerate(zip(batch.sizes, batch.step_ends[1:])):
                # A capture before the replay is set-up, not the first step's time.
                self._step_done(samples, pl_module.device, ended,
                                batch.set_up_s if j == 0 else 0.0)
            if self._last_chunk_end is not None and batch.step_ends:
                self._loop_gaps.append(batch.step_ends[0] - self._last_chunk_end)
            self._last_chunk_end = batch.step_ends[-1] if batch.step_ends else None
        else:
            self._step_done(len(batch[0]), pl_module.device, None)

    def _step_done(self, samples: int, device, ended: Optional[float],
                   set_up_s: float = 0.0) -> None:
        if self.clock.step_done(samples, device, ended, set_up_s):
            self.first_step_s = (ended or time.perf_counter()) - self._fit_start

    def on_validation_start(self, trainer, pl_module) -> None:
        self.clock.pause(pl_module.device)
        self._last_chunk_end = None  # a validation is no gap of the loop

    def on_validation_end(self, trainer, pl_module) -> None:
        loss = trainer.callback_metrics.get("val_loss")
        again = bool(self.val_curve) and self.val_curve[-1]["step"] == trainer.global_step
        if not trainer.sanity_checking and loss is not None and not again:  # a resume's rescore
            self.val_curve.append({"step": trainer.global_step, "unix_time": time.time(),
                                   "val_loss": float(loss)})

    def on_train_end(self, trainer, pl_module) -> None:
        self.clock.pause(pl_module.device)
        device = pl_module.device  # NCCL reduces CUDA tensors only
        samples = trainer.strategy.reduce(torch.tensor(float(self.clock.samples), device=device),
                                          reduce_op="sum")
        elapsed = trainer.strategy.reduce(torch.tensor(self.clock.elapsed, device=device),
                                          reduce_op="mean")
        if float(elapsed) > 0:
            self.samples_per_s = float(samples) / float(elapsed)
        gpu = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        faults, jitter = self.clock.faults_per_step or 0.0, self.clock.step_cv or 0.0
        mine = torch.tensor([peak_host_rss_mib(), gpu, faults, jitter], device=device)
        ranks = pl_module.all_gather(mine).reshape(-1, 4).T.tolist()
        (self.peak_host_rss_mib, self.peak_gpu_mib, self.page_faults_per_step,
         self.step_time_cv) = ranks


class PrecisionProbe(LeanCallback):
    """Records the dtype the first layer outputs in Lightning's training-step context (its
    precision plugin's ``train_step_context``): proof that bf16-mixed autocast was really
    active, not just a flag read back. The layer runs once on zeros, outside any step: a
    forward hook was traced into the first compiled step, whose graph then differed from
    the others' (a resumed run left the straight one by a rounding, --compile)."""

    def __init__(self) -> None:
        self.activation_dtype: Optional[str] = None

    def on_train_start(self, trainer, pl_module) -> None:
        if self.activation_dtype is None:  # once, before the first step
            first = next(m for m in pl_module.modules() if isinstance(m, torch.nn.Linear))
            zeros = first.weight.new_zeros(1, first.in_features)
            with torch.no_grad(), trainer.precision_plugin.train_step_context():
                self.activation_dtype = str(first(zeros).dtype).replace("torch.", "")


def per_parameter_allreduce(group, bucket):
    """DDP's all-reduce (the mean over ranks), one parameter at a time. With 3 or more ranks
    an element's sum rounds by where it sits in the buffer reduced (a ring starts each chunk
    at another rank), and DDP lays its buckets out again after a process's first iteration:
    a resumed run, whose first iteration is its checkpoint's next, left the run it continues
    by the last bit (pytorch/pytorch#30509). A parameter reduced alone sits at the same place
    whatever the bucket."""
    world = torch.distributed.get_world_size(group)
    done = [torch.distributed.all_reduce(grad.div_(world), group=group, async_op=True)
            .get_future() for grad in bucket.gradients()]  # views of the bucket's buffer
    return torch.futures.collect_all(done).then(lambda _: bucket.buffer())


class ExactAllReduce(LeanCallback):
    """Registers :func:`per_parameter_allreduce` on DDP's module when 3 or more ranks train
    (with 2 a sum is one addition, exact in any order). Lightning's DDPStrategy registers a
    comm hook on CUDA only (strategies/ddp.py, _register_ddp_hooks), so it is done here."""

    def on_fit_start(self, trainer, pl_module) -> None:
        model = trainer.strategy.model
        if trainer.world_size >= 3 and isinstance(model, DistributedDataParallel):
            model.register_comm_hook(None, per_parameter_allreduce)


class GpuShare(LeanCallback):
    """Ranks that share a GPU each take 1/n of its memory (kosmoss.devices.policy.sharing)."""

    def __init__(self, share: Sharing) -> None:
        self.share = share

    def setup(self, trainer, pl_module, stage) -> None:
        apply_sharing(self.share, trainer.strategy.root_device)


def parameter_checksum(module: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes in order, one parameter at a time: the same digest
    as of their concatenation, without a copy of the model in memory."""
    digest = hashlib.sha256()
    for parameter in module.parameters():
        digest.update(to_numpy(parameter.detach().contiguous().flatten()).data)
    return digest.hexdigest()[:15]


class ReplicaCheck(LeanCallback):
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
