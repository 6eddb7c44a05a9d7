"""``FlattenedDataModule``: the Lightning face of :mod:`kosmoss.data.loading`."""
from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from .loading import SPLITS, FlattenedDataset, RankBatchSampler, split_indices
from .store import PreparedDataset, open_dataset

STAGES = ("train", "val", "test")


class Resumable:
    """A loader that Lightning checkpoints with its loops (it saves ``state_dict()`` of
    loaders that have one): a run resumed mid-epoch continues the epoch's own sample order
    instead of starting the epoch over. ``batches_done`` tells how many batches of the
    epoch were trained."""

    sampler: RankBatchSampler

    def __init__(self, *args, batches_done: Callable[[], int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches_done = batches_done

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches_done": self.batches_done()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.resume(state["epoch"], state["batches_done"])


class BatchLoader:
    """``dataset[batch]`` for each batch of the sampler, in this process: what a torch
    DataLoader with ``batch_size=None``, no workers and no pinned memory does, without its
    per-batch Python (a profiler range, the fetcher, ``default_convert``): 30 µs a one-row
    batch and 50-100 µs a batch of 256 on 2 cores, 1-2 % of a step (issue 19). Lightning
    takes any sized iterable, and sets the epoch on its ``sampler``."""

    batch_sampler = None  # a DataLoader's, when its sampler yields whole batches (Lightning asks)

    def __init__(self, dataset, sampler) -> None:
        self.dataset, self.sampler = dataset, sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator:
        read = self.dataset.__getitem__
        return (read(batch) for batch in self.sampler)


class ResumableBatchLoader(Resumable, BatchLoader):
    pass


class Chunk:
    """Up to K of an epoch's batches for one training step of Lightning's loop (one per
    optimizer step, kosmoss.run.chunks): each is read when the step takes it, so it is
    still in the cache (a chunk read whole first lost the gain, docs/benchmarks.md)."""

    def __init__(self, read: Callable, batches: List, taken: Callable[[], None]) -> None:
        self._read, self._taken = read, taken
        self.keep(len(batches), batches)
        # When each step ended: the moment the next batch (or the end) was asked for.
        self.step_ends: List[float] = []

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


class ResumableLoader(Resumable, DataLoader):
    pass


# A BatchLoader where no workers or pinning are asked for (chunked when K > 1).
Loader = Union[BatchLoader, ChunkedBatchLoader, DataLoader]


class FlattenedDataModule(pl.LightningDataModule):
    """Seeded train/val/test split of a prepared dataset, read batch by batch.

    ``batch_size`` is per device (the launcher divides the global batch). Each rank gets
    its own slice of every global batch, so no Lightning DistributedSampler is needed:
    build the Trainer with ``use_distributed_sampler=False``.
    """

    def __init__(
        self,
        dataset: PreparedDataset | str | Path,
        batch_size: int = 256,
        mode: str = "auto",
        splits: Sequence[float] = SPLITS,
        seed: int = 42,
        num_workers: int = 0,
        steps_per_execution: int = 1,
    ):
        super().__init__()
        self.dataset_path = Path(dataset.path if isinstance(dataset, PreparedDataset) else dataset)
        self.batch_size, self.mode, self.splits = batch_size, mode, tuple(splits)
        self.seed, self.num_workers = seed, num_workers
        # K > 1: the training loader hands out Chunks of K batches (in-process reads only).
        self.steps_per_execution = steps_per_execution
        self.data: Optional[FlattenedDataset] = None
        self.indices: dict = {}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.data is None:
            self.data = FlattenedDataset(open_dataset(self.dataset_path, verify=False), self.mode,
                                         device=self._device())
            parts = split_indices(len(self.data), self.splits, self.seed)
            self.indices = dict(zip(STAGES, parts))

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer else torch.device("cpu")

    def _rank_and_world(self) -> tuple:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer else (0, 1)

    def loader(self, stage: str) -> Loader:
        rank, world = self._rank_and_world()
        sampler = RankBatchSampler(
            self.indices[stage], self.batch_size, rank=rank, world_size=world,
            shuffle=stage == "train", seed=self.seed,
        )
        # Data on the device is gathered there, in this process; host batches bound for a
        # GPU go through pinned memory (asynchronous copies), and worker processes read
        # ahead: both need torch's DataLoader. Otherwise each batch is one read, in place.
        workers = 0 if self.mode == "device" else self.num_workers
        pin = self._device().type == "cuda" and self.mode != "device"
        train = stage == "train"
        if not workers and not pin:
            if train and self.steps_per_execution > 1:
                return ChunkedBatchLoader(self.data, sampler, self.steps_per_execution)
            if train:
                return ResumableBatchLoader(self.data, sampler,
                                            batches_done=self._train_batches_done)
            return BatchLoader(self.data, sampler)
        # batch_size=None: the sampler yields whole batches and the dataset reads them at once.
        options = dict(sampler=sampler, batch_size=None, num_workers=workers,
                       persistent_workers=workers > 0, pin_memory=pin)
        if train:
            return ResumableLoader(self.data, batches_done=self._train_batches_done, **options)
        return DataLoader(self.data, **options)

    def _train_batches_done(self) -> int:
        # Lightning's own count of the epoch's finished batches: the loader cannot count
        # them itself, Lightning's fetcher reads it one batch ahead.
        trainer = self.trainer
        return trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer else 0

    def train_batches_per_epoch(self) -> int:
        rank, world = self._rank_and_world()
        return len(RankBatchSampler(self.indices["train"], self.batch_size, rank=rank,
                                    world_size=world))

    def train_dataloader(self) -> Loader:
        return self.loader("train")

    def val_dataloader(self) -> Loader:
        return self.loader("val")

    def test_dataloader(self) -> Loader:
        return self.loader("test")
