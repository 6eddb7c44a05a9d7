"""Prepared datasets on disk: shards of flattened ``x``/``y`` plus metadata and statistics.

Layout of ``<dataset>/``::

    metadata.json          schema, shapes, dtype, shard sizes, checksums, source, seed
    stats.npz              per-feature mean/std of x and y (streaming, float64)
    x_00000.npy y_00000.npy ...

A dataset is written into a hidden sibling folder and renamed into place, so an
interrupted preparation never leaves a folder that loads. Opening checks every shard
against the metadata and names the first one that does not match.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import numpy as np

from ..errors import DatasetError
from .schema import ColumnSchema
from .sources import ColumnSource
from .stats import RunningMoments, Statistics

FORMAT = "kosmoss-flattened"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
# Size and mtime of each file when its checksum last matched: a training run hashes only
# files changed since (hashing the 20 GB of `large` before every run would cost minutes).
VERIFIED_FILE = ".verified.json"
STATS_FILE = "stats.npz"
DTYPE = np.float32


@dataclass(frozen=True)
class Shard:
    x_file: str
    y_file: str
    rows: int
    x_sha256: str
    y_sha256: str


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset folder whose metadata has been read and whose shards were checked."""

    path: Path
    metadata: dict

    @property
    def schema(self) -> ColumnSchema:
        return ColumnSchema.from_dict(self.metadata["schema"])

    @property
    def n_samples(self) -> int:
        return int(self.metadata["n_samples"])

    @property
    def n_x(self) -> int:
        return int(self.metadata["n_x"])

    @property
    def n_y(self) -> int:
        return int(self.metadata["n_y"])

    @property
    def shards(self) -> List[Shard]:
        return [Shard(**shard) for shard in self.metadata["shards"]]

    def statistics(self) -> Statistics:
        return Statistics.load(self.path / STATS_FILE)


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------- writing


def prepare(
    source: ColumnSource,
    dest: Path,
    shard_size: int,
    *,
    force: bool = False,
    on_shard: Optional[Callable[[int, int], None]] = None,
) -> PreparedDataset:
    """Write ``source`` as a dataset at ``dest``; returns it. An existing complete dataset
    is kept as it is unless ``force``; an existing folder that is not one is never touched."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest):
        if dest.exists() and not force:
            return _existing(dest)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            _write(source, tmp, shard_size, dest.name, on_shard)
            _swap_into_place(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return open_dataset(dest, verify=False)


def _existing(dest: Path) -> PreparedDataset:
    try:
        return open_dataset(dest, verify=False)
    except DatasetError as err:
        raise DatasetError(f"{dest} exists but is not a usable dataset ({err}); "
                           "move it away or pass --force to replace it") from None


@contextlib.contextmanager
def _lock(dest: Path) -> Iterator[None]:
    # Ranks started together (torchrun, srun) may all ask for the same preset: one prepares.
    with open(dest.parent / f".{dest.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write(source: ColumnSource, folder: Path, shard_size: int, name: str, on_shard) -> None:
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    folder.mkdir()
    schema = source.schema
    x_moments, y_moments = RunningMoments(), RunningMoments()
    shards, done = [], 0
    for index, blocks in enumerate(source.iter_chunks(shard_size)):
        x, y = schema.flatten(blocks)
        shards.append(_write_shard(folder, index, x, y))
        x_moments.update(x)
        y_moments.update(y)
        done += len(x)
        if on_shard:
            on_shard(done, source.n_columns)
    if done != source.n_columns:
        raise RuntimeError(f"source gave {done} columns, announced {source.n_columns}")
    stats = Statistics(x_moments.mean, x_moments.std, y_moments.mean, y_moments.std)
    stats.save(folder / STATS_FILE)
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name,
        "source": source.describe(),
        "seed": source.describe().get("seed"),
        "schema": schema.to_dict(),
        "n_samples": done,
        "n_x": schema.n_x,
        "n_y": schema.n_y,
        "shapes": {"x": [done, schema.n_x], "y": [done, schema.n_y]},
        "dtype": np.dtype(DTYPE).name,
        "shard_size": shard_size,
        "shards": [shard.__dict__ for shard in shards],
        "stats": {"file": STATS_FILE, "sha256": sha256_of(folder / STATS_FILE)},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # metadata.json is written last: a folder without it is never a dataset.
    (folder / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")


def _write_shard(folder: Path, index: int, x: np.ndarray, y: np.ndarray) -> Shard:
    names = (f"x_{index:05d}.npy", f"y_{index:05d}.npy")
    for name, array in zip(names, (x, y)):
        np.save(folder / name, np.ascontiguousarray(array, dtype=DTYPE))
    return Shard(names[0], names[1], len(x), sha256_of(folder / names[0]), sha256_of(folder / names[1]))


def _swap_into_place(tmp: Path, dest: Path) -> None:
    if not dest.exists():
        os.rename(tmp, dest)
        return
    old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- reading


def open_dataset(path: Path, *, verify: bool = True,
                 trust_unchanged: bool = False) -> PreparedDataset:
    """Read and check a dataset folder; ``verify`` also compares the checksums (of every
    file, or with ``trust_unchanged`` of the files changed since they last matched)."""
    path = Path(path)
    if not path.is_dir():
        raise DatasetError(f"{path}: no such dataset folder; prepare it with `kosmoss data prepare`")
    metadata = _read_metadata(path)
    dataset = PreparedDataset(path, metadata)
    offsets_total = 0
    for shard in dataset.shards:
        for name, columns in ((shard.x_file, dataset.n_x), (shard.y_file, dataset.n_y)):
            _check_array_file(path / name, (shard.rows, columns), metadata["dtype"])
        offsets_total += shard.rows
    if offsets_total != dataset.n_samples:
        raise DatasetError(f"{path / METADATA_FILE}: shards hold {offsets_total} rows, "
                           f"metadata says {dataset.n_samples}; prepare the dataset again")
    if not (path / STATS_FILE).is_file():
        raise DatasetError(f"{path / STATS_FILE}: missing; prepare the dataset again")
    if verify:
        verify_checksums(dataset, trust_unchanged=trust_unchanged)
    return dataset


def _read_metadata(path: Path) -> dict:
    file = path / METADATA_FILE
    if not file.is_file():
        raise DatasetError(f"{path}: no {METADATA_FILE}, so not a complete kosmoss dataset "
                           "(interrupted or foreign); prepare it with `kosmoss data prepare`")
    try:
        metadata = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DatasetError(f"{file}: unreadable ({err}); prepare the dataset again") from None
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{file}: not a {FORMAT} v{FORMAT_VERSION} dataset; prepare it again")
    return metadata


def _check_array_file(file: Path, shape: tuple, dtype: str) -> None:
    if not file.is_file():
        raise DatasetError(f"{file}: shard missing; prepare the dataset again")
    try:
        array = np.load(file, mmap_mode="r")
    except (ValueError, OSError) as err:
        raise DatasetError(f"{file}: corrupted shard ({err}); prepare the dataset again") from None
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise DatasetError(f"{file}: shape {array.shape} {array.dtype}, metadata says {shape} "
                           f"{dtype}; prepare the dataset again")


def verify_checksums(dataset: PreparedDataset, *, trust_unchanged: bool = False) -> None:
    """Hash every file against metadata.json. With ``trust_unchanged``, a file whose size and
    modification time are those recorded when it last matched is not hashed again (the
    quick check rsync and make use; `kosmoss data info --verify` hashes everything)."""
    expected = {name: digest for shard in dataset.shards
                for name, digest in ((shard.x_file, shard.x_sha256), (shard.y_file, shard.y_sha256))}
    stats = dataset.metadata["stats"]
    expected[stats["file"]] = stats["sha256"]
    matched = _read_verified(dataset.path) if trust_unchanged else {}
    for name, digest in expected.items():
        file = dataset.path / name
        if matched.get(name) != _stamp(file) and sha256_of(file) != digest:
            raise DatasetError(f"{file}: checksum does not match metadata.json "
                               "(corrupted or modified); prepare the dataset again")
    _write_verified(dataset.path, {name: _stamp(dataset.path / name) for name in expected})


def _stamp(file: Path) -> list:
    info = file.stat()
    return [info.st_size, info.st_mtime_ns]


def _read_verified(folder: Path) -> dict:
    try:
        return json.loads((folder / VERIFIED_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_verified(folder: Path, stamps: dict) -> None:
    tmp = folder / f".{VERIFIED_FILE}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(stamps))
        os.replace(tmp, folder / VERIFIED_FILE)
    except OSError:  # a read-only shared dataset: it is simply hashed again next time
        tmp.unlink(missing_ok=True)
