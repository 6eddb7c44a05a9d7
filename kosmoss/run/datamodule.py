"""The data module as the run path uses it: :class:`~kosmoss.data.datamodule.FlattenedDataModule`
whose training loader's position travels in checkpoints, so a run resumed mid-epoch
continues that epoch's own sample order and ends with the weights of a run never stopped;
with K optimizer steps per step of Lightning's loop, its batches come in
:class:`~kosmoss.run.chunks.Chunk` s of K."""
from __future__ import annotations

from typing import Callable, Optional, Union

from torch.utils.data import DataLoader

from ..data.datamodule import BatchLoader, FlattenedDataModule
from ..data.loading import RankBatchSampler
from . import lightning_private as private
from .chunks import ChunkedBatchLoader


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


class ResumableBatchLoader(Resumable, BatchLoader):
    pass


class ResumableLoader(Resumable, DataLoader):
    pass


TrainLoader = Union[ResumableBatchLoader, ChunkedBatchLoader, ResumableLoader]


class RunDataModule(FlattenedDataModule):
    """FlattenedDataModule with a resumable training loader (chunked when K > 1, which needs
    batches read in this process: no workers, no pinned memory)."""

    def __init__(self, *args, steps_per_execution: int = 1, chunked: Optional[bool] = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps_per_execution = steps_per_execution
        # Chunks of one step too where a CUDA graph replays them (kosmoss.run.graphs).
        self.chunked = steps_per_execution > 1 if chunked is None else chunked

    def train_dataloader(self) -> TrainLoader:
        sampler, options = self.sampler("train"), self.loader_options()
        if options is not None:
            return ResumableLoader(self.data, sampler=sampler, batches_done=self._batches_done,
                                   **options)
        if self.chunked:
            return ChunkedBatchLoader(self.data, sampler, self.steps_per_execution)
        return ResumableBatchLoader(self.data, sampler, batches_done=self._batches_done)

    def _batches_done(self) -> int:
        # Lightning's own count of the epoch's finished batches: the loader cannot count
        # them itself, Lightning's fetcher reads it one batch ahead.
        return private.batches_done(self.trainer) if self.trainer else 0

    def train_batches_per_epoch(self) -> int:
        return len(self.sampler("train"))
