"""``FlattenedDataModule``: the Lightning face of :mod:`kosmoss.data.loading`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from .loading import FlattenedDataset, RankBatchSampler, split_indices
from .store import PreparedDataset, open_dataset

STAGES = ("train", "val", "test")


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
        mode: str = "efficient",
        splits: Sequence[float] = (0.8, 0.1, 0.1),
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
            self.data = FlattenedDataset(open_dataset(self.dataset_path, verify=False), self.mode)
            parts = split_indices(len(self.data), self.splits, self.seed)
            self.indices = dict(zip(STAGES, parts))

    def _rank_and_world(self) -> tuple:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer else (0, 1)

    def loader(self, stage: str) -> DataLoader:
        rank, world = self._rank_and_world()
        sampler = RankBatchSampler(
            self.indices[stage], self.batch_size, rank=rank, world_size=world,
            shuffle=stage == "train", seed=self.seed,
        )
        # batch_size=None: the sampler yields whole batches and the dataset reads them at once.
        return DataLoader(
            self.data, sampler=sampler, batch_size=None, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
