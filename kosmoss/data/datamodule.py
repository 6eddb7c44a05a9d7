"""``FlattenedDataModule``: the Lightning face of :mod:`kosmoss.data.loading`."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from .loading import FlattenedDataset, RankBatchSampler, split_indices
from .splits import SPLITS
from .store import PreparedDataset, open_dataset

STAGES = ("train", "val", "test")


class BatchLoader:
    """``dataset[batch]`` for each batch of the sampler, in this process: what a torch
    DataLoader with ``batch_size=None``, no workers and no pinned memory does, without its
    per-batch Python (a profiler range, the fetcher, ``default_convert``): 30 µs a one-row
    batch and 50-100 µs a batch of 256 on 2 cores, 1-2 % of a step (python -m kosmoss.bench.step_cost). Lightning
    takes any sized iterable, and sets the epoch on its ``sampler``."""

    batch_sampler = None  # a DataLoader's, when its sampler yields whole batches (Lightning asks)

    def __init__(self, dataset, sampler) -> None:
        self.dataset, self.sampler = dataset, sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator:
        read = self.dataset.__getitem__
        return (read(batch) for batch in self.sampler)


# A BatchLoader where no workers or pinning are asked for.
Loader = Union[BatchLoader, DataLoader]


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
    ):
        super().__init__()
        self.dataset_path = Path(dataset.path if isinstance(dataset, PreparedDataset) else dataset)
        self.batch_size, self.mode, self.splits = batch_size, mode, tuple(splits)
        self.seed, self.num_workers = seed, num_workers
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

    def sampler(self, stage: str) -> RankBatchSampler:
        """This rank's batches of ``stage``: shuffled every epoch for training."""
        rank, world = self._rank_and_world()
        return RankBatchSampler(self.indices[stage], self.batch_size, rank=rank, world_size=world,
                                shuffle=stage == "train", seed=self.seed)

    def loader_options(self) -> Optional[dict]:
        """torch DataLoader options, or None when each batch is best read in this process.

        Data on the device is gathered there, in this process; host batches bound for a
        GPU go through pinned memory (asynchronous copies), and worker processes read
        ahead: both need torch's DataLoader. Otherwise each batch is one read, in place."""
        workers = 0 if self.mode == "device" else self.num_workers
        pin = self._device().type == "cuda" and self.mode != "device"
        if not workers and not pin:
            return None
        # batch_size=None: the sampler yields whole batches and the dataset reads them at once.
        return dict(batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                    pin_memory=pin)

    def loader(self, stage: str) -> Loader:
        sampler, options = self.sampler(stage), self.loader_options()
        if options is None:
            return BatchLoader(self.data, sampler)
        return DataLoader(self.data, sampler=sampler, **options)

    def train_dataloader(self) -> Loader:
        return self.loader("train")

    def val_dataloader(self) -> Loader:
        return self.loader("val")

    def test_dataloader(self) -> Loader:
        return self.loader("test")
