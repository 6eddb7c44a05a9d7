"""Reading prepared datasets by batch.

The original course opened a memmap per *sample* (about 1.5k samples/s, slower than the
model). Here the sampler hands the dataset a whole batch of indices and the dataset
gathers them with one ``index_select`` per shard, so one Python call moves a whole
batch.
"""
from __future__ import annotations

import mmap
import threading
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset, Sampler

from . import MODES  # re-exported: the modes FlattenedDataset takes
from .store import PreparedDataset, open_dataset

# Map a memory-mapped dataset's pages at open, or (mode auto) copy it into RAM, when it takes
# less than this share of the free RAM (the large preset on a laptop does not, and is read
# as the epoch goes).
PREFAULT_RAM_SHARE = 0.5
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14; Python 3.13 names it
# A training split at least this long has its next epoch's order drawn in a thread while
# this epoch trains; a shorter one's draw takes about 1.5 ms or less on the 2-core VM,
# not worth a thread an epoch (docs/bench/2026-11-27-order-draw.py).
DRAW_AHEAD_FROM = 65_536


def map_pages_now(array: np.memmap) -> None:
    """Map every page of ``array`` into this process now, from the page cache (reading
    the file if it is not cached). Otherwise the first epoch maps them as it reads: one
    fault per 64 KiB, about 1 ms more for each batch of 256 on 2 cores (measured 2026-11-25), where
    the bench's raw loop holds its tensors in RAM already. Best effort: an older kernel or
    another OS only reads ahead."""
    handle = getattr(array, "_mmap", None)  # numpy's own mmap object
    if handle is None or not hasattr(handle, "madvise"):
        return
    try:
        handle.madvise(MADV_POPULATE_READ)
    except OSError:
        try:
            handle.madvise(mmap.MADV_WILLNEED)
        except (OSError, AttributeError):
            pass


# The share of a rank's GPU memory the data may take (auto): the rest is the model, its
# gradients and Adam's moments, the batch's activations and PyTorch's cache.
DEVICE_DATA_SHARE = 0.5


def dataset_bytes(dataset: PreparedDataset) -> int:
    return 4 * dataset.n_samples * (dataset.n_x + dataset.n_y)  # float32 x and y


def fits_in_memory(nbytes: int, copies: int = 1) -> bool:
    """``copies`` copies of ``nbytes`` take less than PREFAULT_RAM_SHARE of the free RAM."""
    return copies * nbytes < PREFAULT_RAM_SHARE * psutil.virtual_memory().available


def chosen_mode(mode: str, dataset: PreparedDataset, copies: int = 1,
                gpu_bytes: Optional[float] = None) -> str:
    """``auto`` made concrete: on a GPU with ``gpu_bytes`` for this rank, the data on the GPU
    (``device``) when it takes less than DEVICE_DATA_SHARE of them; else one tensor in RAM
    (``controlled``) when each of ``copies`` processes on this host can hold one, else
    memory-mapped shards (``efficient``); any other mode as asked. On an H200 the data on
    the GPU trained 2.3-2.6 M samples/s where the host loader fed 0.37 M (batch 16,384,
    docs/gpu/2026-11-26-h200.md): a batch gathered there never crosses PCIe. One tensor is
    gathered with one ``index_select`` each for x and y, as the bench's raw loop does; from
    8 mapped shards a batch of 256 takes sixteen, about twice as long on 2 cores."""
    if mode != "auto":
        return mode
    nbytes = dataset_bytes(dataset)
    if gpu_bytes is not None and nbytes < DEVICE_DATA_SHARE * gpu_bytes:
        return "device"
    return "controlled" if fits_in_memory(nbytes, copies) else "efficient"


class FlattenedDataset(Dataset):
    """Rows of a prepared dataset. ``mode='efficient'`` memory-maps the shards (the page
    cache is shared by every rank); ``mode='controlled'`` copies them into one tensor in RAM;
    ``mode='device'`` copies them to ``device`` (a GPU: batches never cross PCIe; on CPU
    the same as controlled); ``mode='auto'`` is controlled when the copy fits in RAM, else
    efficient (:func:`chosen_mode`; ``self.mode`` says which; a run's plan, which knows the
    GPU it trains on, passes ``device`` when the data fits there).

    ``dataset[i]`` gives one sample; ``dataset[[i, j, ...]]`` gives a whole batch, which is
    how :class:`FlattenedDataModule` reads.
    """

    def __init__(self, dataset: PreparedDataset | str | Path, mode: str = "auto",
                 device: torch.device | str = "cpu"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(dataset, PreparedDataset):
            dataset = open_dataset(Path(dataset), verify=False)
        self.prepared, self.mode = dataset, chosen_mode(mode, dataset)
        self.device = torch.device(device if mode == "device" else "cpu")
        self.offsets = np.cumsum([0] + [s.rows for s in dataset.shards])
        self._open_shards()

    def _open_shards(self) -> None:
        folder, shards = self.prepared.path, self.prepared.shards
        if self.mode == "efficient":
            self._x = [self._open(folder / s.x_file) for s in shards]
            self._y = [self._open(folder / s.y_file) for s in shards]
            self._starts = self.offsets  # row where each held tensor starts
        else:
            # One tensor for x and one for y: a batch is then one gather each, not one per
            # shard (sixteen small index_selects cost 0.16 ms more per batch of 256 on 2
            # cores than two large ones, 2026-11-25).
            self._x = [self._concatenated([folder / s.x_file for s in shards])]
            self._y = [self._concatenated([folder / s.y_file for s in shards])]
            self._starts = np.array([0, len(self)])

    def _concatenated(self, files: List[Path]) -> torch.Tensor:
        """The shards' rows in one tensor on ``self.device``, filled shard by shard (the
        peak is the whole plus one shard, not twice the whole)."""
        first = np.load(files[0], mmap_mode="r")
        whole = torch.empty((len(self), first.shape[1]), dtype=torch.float32, device=self.device)
        for file, lo, hi in zip(files, self.offsets[:-1], self.offsets[1:]):
            whole[lo:hi].copy_(torch.from_numpy(np.load(file)))
        return whole

    def _open(self, file: Path) -> torch.Tensor:
        # Copy-on-write mapping: writable for torch.from_numpy, yet never written to disk.
        # torch's index_select gathers rows about 5x faster than np.take on 2 cores.
        array = np.load(file, mmap_mode="c")
        if self._fits_in_memory():
            map_pages_now(array)
        return torch.from_numpy(array)

    def _fits_in_memory(self) -> bool:
        if not hasattr(self, "_fits"):
            self._fits = fits_in_memory(dataset_bytes(self.prepared))
        return self._fits

    def __getstate__(self) -> dict:
        # A pickled memmap becomes a full in-memory copy: data workers re-open the files.
        state = dict(self.__dict__)
        if self.mode == "efficient":
            state["_x"] = state["_y"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._x is None:
            self._open_shards()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def resident(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """Every row of x and of y as one tensor each (controlled or device mode), or None
        (memory-mapped shards)."""
        return (self._x[0], self._y[0]) if len(self._x) == 1 else None

    def __getitem__(self, index) -> Tuple[torch.Tensor, torch.Tensor]:
        if np.ndim(index) == 0:
            x, y = self.read(np.array([index]))
            return x[0], y[0]
        return self.read(np.asarray(index))

    def read(self, indices: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """Gather rows ``indices`` (any order) -> float32 tensors (len, n_x), (len, n_y)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"indices out of range for a dataset of {len(self)} rows")
        if len(self._x) == 1:  # one tensor (RAM or device): one gather each, in any order
            rows = torch.from_numpy(indices).to(self.device)
            return torch.index_select(self._x[0], 0, rows), torch.index_select(self._y[0], 0, rows)
        # Sorted reads walk each memmap forwards and land in one contiguous slice per shard.
        order = np.argsort(indices, kind="stable")
        sorted_idx = indices[order]
        new = dict(dtype=torch.float32, device=self.device)
        x = torch.empty((len(indices), self._x[0].shape[1]), **new)
        y = torch.empty((len(indices), self._y[0].shape[1]), **new)
        bounds = np.searchsorted(sorted_idx, self._starts)
        for held, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            if hi > lo:
                local = torch.from_numpy(sorted_idx[lo:hi] - self._starts[held]).to(self.device)
                torch.index_select(self._x[held], 0, local, out=x[lo:hi])
                torch.index_select(self._y[held], 0, local, out=y[lo:hi])
        if not (order[1:] > order[:-1]).all():  # put rows back in the order asked for
            back = torch.from_numpy(np.argsort(order)).to(self.device)
            x, y = x[back], y[back]
        return x, y


def split_indices(n: int, fractions: Sequence[float], seed: int) -> List[np.ndarray]:
    """Seeded split of ``range(n)``; sizes always add up to ``n`` (torch's
    ``random_split`` hands out the rounding remainder). Each part comes back sorted."""
    parts = torch.utils.data.random_split(
        range(n), list(fractions), generator=torch.Generator().manual_seed(seed)
    )
    return [np.sort(np.asarray(part.indices, dtype=np.int64)) for part in parts]


def batches_per_epoch(samples: int, batch_size: int, world_size: int = 1) -> int:
    """A :class:`RankBatchSampler`'s batches per epoch (optimizer steps): the global batches
    of ``world_size x batch_size``, and the last partial one unless it has fewer rows than
    ranks (they join the batch before)."""
    global_batch = batch_size * world_size
    full = samples // global_batch
    return full + (1 if (samples - full * global_batch >= world_size or full == 0) else 0)


def draw_order(indices: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """An epoch's order, the same on every rank: ``indices[rng.permutation(n)]`` with the
    generator of (seed, epoch). Shuffling a copy in place gives it to the element (the same
    Fisher-Yates swaps from the same generator) without the arange and the gather: 131,072
    indices in 0.6 to 0.8 of the time (docs/bench/2026-11-27-order-draw.py)."""
    order = indices.copy()
    np.random.default_rng([seed, epoch]).shuffle(order)
    return order


class OrderAhead:
    """One epoch's order, drawn in a daemon thread that ends once it is drawn.

    A plain thread, not a ``concurrent.futures`` pool: a pool's thread outlives its work,
    and a process that forks with a live thread (torch's DataLoader workers, Lightning's
    notebook launcher) risks the child. A fork mid-draw leaves the child without the
    thread: ``take`` then finds no order, and the sampler draws it itself."""

    def __init__(self, indices: np.ndarray, seed: int, epoch: int) -> None:
        self.epoch, self.order = epoch, None
        self._thread = threading.Thread(target=self._draw, args=(indices, seed),
                                        name=f"kosmoss-order-{epoch}", daemon=True)
        self._thread.start()

    def _draw(self, indices: np.ndarray, seed: int) -> None:
        self.order = draw_order(indices, seed, self.epoch)

    def take(self, epoch: int) -> Optional[np.ndarray]:
        """The order if it is ``epoch``'s, once drawn; None if not (the caller draws it)."""
        if epoch != self.epoch:
            return None
        self._thread.join()
        return self.order


class RankBatchSampler(Sampler[np.ndarray]):
    """Batches of indices for one rank: every index exactly once per epoch across ranks,
    and every rank the same number of batches (DDP needs both).

    The epoch's order is one permutation of all indices, the same on every rank (seed +
    epoch), cut into global batches of ``world_size x batch_size``; rank ``r`` takes its
    slice of each. The last, partial global batch is shared out as evenly as possible;
    when it has fewer rows than ranks they join the previous batch of the first ranks, so
    no rank ever gets an empty batch. Lightning's DistributedSampler pads with repeated
    samples instead, which double-counts them in validation metrics.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, *, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        if len(indices) < world_size:
            raise ValueError(f"{len(indices)} samples cannot feed {world_size} ranks")
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._resume_at: Optional[Tuple[int, int]] = None
        self._ahead: Optional[OrderAhead] = None  # the next epoch's order, being drawn
        self._span = int(self.indices.max()) + 1 if len(self.indices) else 0
        # One process, one batch an epoch: that batch is the whole split, whatever the order.
        self._whole = np.sort(self.indices) if world_size == 1 and \
            batch_size >= len(self.indices) else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, batches_done: int) -> None:
        """Continue ``epoch`` after its first ``batches_done`` batches, once; a pass over
        another epoch is whole. Sets the epoch too: a resumed Lightning run reads its first
        batch before it calls ``set_epoch``.

        A position at the epoch's end (every batch done: a checkpoint taken on its last
        batch, before Lightning's epoch-end) is the next epoch's start: Lightning creates the
        resumed run's iterator before it moves on to that epoch and does not create it again,
        so an empty remainder would leave the next epoch empty and its order skipped."""
        if batches_done >= len(self):
            epoch, batches_done = epoch + 1, 0
        self.epoch, self._resume_at = epoch, (epoch, batches_done)

    @property
    def skips(self) -> int:
        """How many of the epoch's batches the next pass leaves out (a resume's)."""
        at = self._resume_at
        return at[1] if at and at[0] == self.epoch else 0

    def _epoch_order(self) -> np.ndarray:
        if not self.shuffle:
            return self.indices
        ahead, self._ahead = self._ahead, None
        order = ahead.take(self.epoch) if ahead else None
        return draw_order(self.indices, self.seed, self.epoch) if order is None else order

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ahead": None}  # a copy draws its own orders

    def batches(self) -> List[np.ndarray]:
        order, b, r, w = self._epoch_order(), self.batch_size, self.rank, self.world_size
        full = len(order) // (w * b)
        batches = [order[(s * w + r) * b:(s * w + r + 1) * b] for s in range(full)]
        rest = order[full * w * b:]
        if len(rest) >= w or full == 0:
            batches.append(np.array_split(rest, w)[r])
        elif r < len(rest):
            batches[-1] = np.concatenate([batches[-1], rest[r:r + 1]])
        return batches

    def __iter__(self) -> Iterator[np.ndarray]:
        # A generator: the resume's skip is taken at the first batch asked for, not when the
        # iterator is made. torch's worker iterator makes two and reads the second
        # (_BaseDataLoaderIter.__init__, then _reset): the first took the skip, and a run
        # resumed with --num-workers started its epoch over (torch 2.13).
        skip, self._resume_at = self.skips, None
        # A batch is a set: sorting it changes no gradient and lets reads walk forwards.
        if self._whole is not None:  # no permutation to draw: an epoch is one step
            yield from [self._whole.copy()][skip:]
            return
        yield from self._handed_out(self.batches()[skip:], self.epoch)

    def _handed_out(self, batches: List[np.ndarray], epoch: int) -> Iterator[np.ndarray]:
        """The batches in ascending order. Once the first is out, the next epoch's order is
        drawn in a thread (numpy releases the GIL while it shuffles), so that epoch's first
        step does not wait for it: started then, not when the epoch's iterator is made,
        because torch's DataLoader forks its workers in between."""
        for number, batch in enumerate(batches):
            yield self._ascending(batch)
            if number == 0 and self.shuffle and len(self.indices) >= DRAW_AHEAD_FROM:
                self._ahead = OrderAhead(self.indices, self.seed, epoch + 1)

    def _ascending(self, batch: np.ndarray) -> np.ndarray:
        """``np.sort(batch)``; a batch of an eighth of the indices' span or more by marking
        its rows instead. Best of 7 on the 2-core VM (2026-11-27), a span of 131,072:
        131,072 rows 2.51 ms sorted, 0.46 ms marked; 16,384 rows 0.24 and 0.17 ms; 8,192
        rows 0.13 and 0.11 ms. Marking costs the whole span whatever the batch, so below an
        eighth sorting wins. Host time a GPU step at those batches waits for
        (docs/bench/2026-11-27-sampler-per-step.py)."""
        if 8 * len(batch) < self._span:
            return np.sort(batch)
        marked = np.zeros(self._span, dtype=bool)
        marked[batch] = True
        rows = np.flatnonzero(marked)
        return rows if len(rows) == len(batch) else np.sort(batch)  # an index given twice

    def __len__(self) -> int:
        return batches_per_epoch(len(self.indices), self.batch_size, self.world_size)

