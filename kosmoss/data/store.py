"""Prepared datasets on disk: shards of flattened ``x``/``y`` plus metadata and statistics.

    kosmoss data prepare tiny                  # $KOSMOSS_HOME/data/tiny
    kosmoss data prepare --columns 300 --levels 6 --name mini
    kosmoss data info                          # lists them; reports and removes leftovers
    kosmoss data info mini --verify            # hashes every file

Layout of ``<dataset>/``::

    metadata.json          schema, shapes, dtype, shard sizes, checksums, source, seed
    stats.npz              per-feature mean/std of x and y (streaming, float64)
    x_00000.npy y_00000.npy ...

A dataset is written into a hidden sibling ``.NAME.tmp-PID@HOST-XXXXXXXX`` and renamed
into place, so an interrupted preparation never leaves a folder that loads. One killed
outright (``kill -9``) leaves that folder behind: the next preparation of NAME and
``kosmoss data info`` report it and remove it once its writer process is gone.

metadata.json keeps the request (the source's description and the shard size): asking
for a name again with another request is an error naming the difference, never a silent
reuse; ``force`` replaces only a folder that is a kosmoss dataset. Opening checks every
shard and the statistics against the metadata and names the first file that does not
match, with the command that prepares it again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import numpy as np
import psutil

from ..core.errors import DatasetError, RunFailed, name_too_long
from ..core.files import (KERNEL_FILE_SYSTEM, atomic_write_json, free_bytes, holds_no_files,
                          nearest_existing, read_json, why_not_a_file)
from .catalog import METADATA_FILE, again, request_difference, request_of
from .schema import ColumnSchema
from .sources import ColumnSource
from .stats import RunningMoments, Statistics

FORMAT = "kosmoss-flattened"
FORMAT_VERSION = 1
# Size and mtime of each file when its checksum last matched: a training run hashes only
# files changed since (hashing the 20 GB of `large` before every run would cost minutes).
VERIFIED_FILE = ".verified.json"
STATS_FILE = "stats.npz"
DTYPE = np.float32
# The same request read by a newer plugin release is still the same request.
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)(?:@(?P<host>[^/]+))?"
                      r"-[0-9a-f]{8}$")


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
    reused: bool = dataclasses.field(default=False, compare=False)  # by prepare(): already there

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
    log: Optional[Callable[[str], None]] = None,
) -> PreparedDataset:
    """Write ``source`` as a dataset at ``dest``; returns it. A dataset already there from
    the same request is reused (``reused`` set); one from another request is an error
    unless ``force``; a folder that is not a kosmoss dataset, or a dataset folder holding
    files kosmoss did not write, is never touched. A folder that cannot be written is a
    :class:`DatasetError`, a disk that fills up a :class:`RunFailed`: one line each, and
    nothing half-written is left."""
    dest = Path(dest)
    try:
        return _prepare(source, dest, shard_size, force, on_shard, log)
    except OSError as err:
        raise _write_error(dest, err) from None


def _prepare(source: ColumnSource, dest: Path, shard_size: int, force: bool, on_shard,
             log) -> PreparedDataset:
    existing = nearest_existing(dest)
    if holds_no_files(existing):  # its mkdir says ENOENT, its statvfs "0 B free"
        raise DatasetError(f"{dest}: {existing} {KERNEL_FILE_SYSTEM}; write elsewhere (--out)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    request = request_of(source, shard_size)
    with _lock(dest):
        for line in clean_leftovers(dest.parent, dest.name):
            if log:
                log(line)
        if _occupied(dest):
            if not force:
                return _reuse(dest, request)
            _check_replaceable(dest)
        _check_room(source, dest)
        tmp = _aside(dest, "tmp")
        try:
            _write(source, tmp, shard_size, dest.name, on_shard)
            _swap_into_place(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    prepared = open_dataset(dest, verify=False)
    inputs, outputs = prepared.statistics().not_numbers()
    if (inputs or outputs) and log:  # kept, for `kosmoss data info`; runs refuse it
        log(f"warning: {dest}: {inputs} input and {outputs} output feature(s) hold NaN or inf "
            "values; a run on it is refused until it is prepared from a clean source")
    return prepared


def _check_room(source: ColumnSource, dest: Path) -> None:
    """A dataset larger than the disk's free space is refused before a byte is written:
    filling the disk first would hurt every other program on it. Synthetic sources only:
    a download's size is known once it is opened."""
    from ..scaling.allreduce import human_size
    from .sources import SyntheticSource

    if not isinstance(source, SyntheticSource):
        return
    need = source.n_columns * (source.schema.n_x + source.schema.n_y) * np.dtype(DTYPE).itemsize
    existing = nearest_existing(dest)
    free = free_bytes(existing)
    if need > free:
        raise DatasetError(f"{dest}: {source.n_columns:,} columns take {human_size(need)}, and "
                           f"the disk holding {existing} has {human_size(free)} free; prepare "
                           "fewer columns, or free space or write elsewhere (--out)")


def _write_error(dest: Path, err: OSError) -> Exception:
    too_long = name_too_long(err)
    if too_long is not None:  # --name or --out: the input's, not a failure
        return too_long
    where = f"{err.filename}: " if err.filename else ""
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DatasetError(f"{dest}: cannot be written ({where}{err.strerror}); nothing "
                            "written: give a folder you can write (--out DIR, or another "
                            "KOSMOSS_HOME)")
    # numpy's np.save checks the space first, or its fwrite comes back short ("N requested
    # and M written", numpy/_core/src/multiarray/convert.c): an OSError without an errno.
    if err.errno in (errno.ENOSPC, errno.EDQUOT) or "free space" in str(err) or \
            re.search(r"\d+ requested and \d+ written", str(err)):
        return RunFailed(f"{dest}: the disk filled up while preparing it "
                         f"({err.strerror or os.strerror(errno.ENOSPC)}); "
                         f"nothing half-written is left: free space in {dest.parent}, then "
                         "prepare it again")
    return RunFailed(f"{dest}: preparing it failed ({where}{err.strerror or err}); nothing "
                     "half-written is left")


def is_kosmoss_dataset(folder: Path) -> bool:
    """Whether ``folder`` holds a metadata.json written by kosmoss (complete or not)."""
    try:
        metadata = read_json(Path(folder) / METADATA_FILE)  # a FIFO there is not waited on
    except (OSError, ValueError):
        return False
    return isinstance(metadata, dict) and metadata.get("format") == FORMAT


def _occupied(dest: Path) -> bool:
    # An empty folder holds nothing to lose: the new dataset is renamed over it.
    return dest.exists() and not (dest.is_dir() and not any(dest.iterdir()))


def _reuse(dest: Path, request: dict) -> PreparedDataset:
    if not is_kosmoss_dataset(dest):
        raise DatasetError(f"{dest}: exists and is not a kosmoss dataset (no kosmoss "
                           f"{METADATA_FILE}); nothing changed: choose another name or folder")
    dataset = open_dataset(dest, verify=False)
    difference = request_difference(dataset.metadata, request)
    if difference:
        raise DatasetError(f"{dest}: holds another dataset: {difference}; choose another "
                           "name, or add --force to replace it")
    return dataclasses.replace(dataset, reused=True)


def _check_replaceable(dest: Path) -> None:
    if not is_kosmoss_dataset(dest):
        raise DatasetError(f"{dest}: not a kosmoss dataset (no kosmoss {METADATA_FILE}), so "
                           "--force does not replace it; nothing deleted: choose another "
                           "name or folder")
    foreign = sorted(set(os.listdir(dest)) - _files_kosmoss_wrote(dest))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise DatasetError(f"{dest}: holds files kosmoss did not write ({shown}), so --force "
                           "does not replace it; nothing deleted: move them out, or choose "
                           "another name or folder")


def _files_kosmoss_wrote(dest: Path) -> set:
    """What a preparation writes in a dataset folder: its metadata names the shards."""
    names = {METADATA_FILE, STATS_FILE, VERIFIED_FILE}
    try:
        shards = json.loads((dest / METADATA_FILE).read_text()).get("shards") or []
        names |= {shard[key] for shard in shards for key in ("x_file", "y_file")}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # a broken metadata.json names no shard: its folder's files count as foreign
    return names


@contextlib.contextmanager
def _lock(dest: Path) -> Iterator[None]:
    # Ranks started together (torchrun, srun) may all ask for the same preset: one prepares.
    # The lock is on the parent folder itself: a lock file stayed beside every target.
    handle = os.open(dest.parent, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing it releases the lock


def _aside(dest: Path, kind: str) -> Path:
    # The writer's pid and host in the name tell a later cleaner whether it is still at work.
    writer = f"{os.getpid()}@{socket.gethostname()}"
    return dest.parent / f".{dest.name}.{kind}-{writer}-{uuid.uuid4().hex[:8]}"


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
    atomic_write_json(folder / METADATA_FILE, metadata)


def _write_shard(folder: Path, index: int, x: np.ndarray, y: np.ndarray) -> Shard:
    names = (f"x_{index:05d}.npy", f"y_{index:05d}.npy")
    for name, array in zip(names, (x, y)):
        np.save(folder / name, np.ascontiguousarray(array, dtype=DTYPE))
    return Shard(names[0], names[1], len(x), sha256_of(folder / names[0]),
                 sha256_of(folder / names[1]))


def _swap_into_place(tmp: Path, dest: Path) -> None:
    if not _occupied(dest):
        os.rename(tmp, dest)
        return
    old = _aside(dest, "old")
    os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- leftovers


@dataclass(frozen=True)
class Leftover:
    """A hidden ``.NAME.tmp-*`` (or ``.old-*``) folder of a preparation."""

    path: Path
    pid: int
    host: Optional[str]

    def writer_alive(self) -> bool:
        if self.host not in (None, socket.gethostname()):
            return True  # another node's process: nothing here can tell, so leave it alone
        try:
            process = psutil.Process(self.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            # A pid reused by a process started after the folder was last written is not its writer.
            return process.create_time() <= self.path.stat().st_mtime + 1.0
        except psutil.NoSuchProcess:
            return False
        except (psutil.Error, OSError):
            return True

    def size(self) -> int:
        return sum(f.lstat().st_size for f in self.path.rglob("*") if not f.is_dir())


def leftovers(parent: Path, name: Optional[str] = None) -> List[Leftover]:
    """The hidden working folders of preparations in ``parent`` (of ``name`` only if given)."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = []
    for entry in sorted(parent.iterdir()):
        match = LEFTOVER.match(entry.name)
        if match and entry.is_dir() and name in (None, match["name"]):
            found.append(Leftover(entry, int(match["pid"]), match["host"]))
    return found


def clean_leftovers(parent: Path, name: Optional[str] = None) -> List[str]:
    """Remove the leftovers whose writer is gone; one line per leftover found, saying
    what it was and what happened to it."""
    lines = []
    for leftover in leftovers(parent, name):
        megabytes = f"{leftover.size() / 1e6:,.1f} MB"
        writer = f"pid {leftover.pid}" + (f" on {leftover.host}" if leftover.host else "")
        if leftover.writer_alive():
            lines.append(f"{leftover.path}: {megabytes} being written by {writer}, still "
                         "running; left alone")
            continue
        shutil.rmtree(leftover.path, ignore_errors=True)
        done = "could not remove it" if leftover.path.exists() else "removed"
        lines.append(f"{leftover.path}: {megabytes} left by an interrupted preparation "
                     f"({writer}, gone); {done}")
    return lines


# ---------------------------------------------------------------- reading


def open_dataset(path: Path, *, verify: bool = True,
                 trust_unchanged: bool = False) -> PreparedDataset:
    """Read and check a dataset folder; ``verify`` also compares the checksums (of every
    file, or with ``trust_unchanged`` of the files changed since they last matched)."""
    path = Path(path)
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such dataset folder"
        raise DatasetError(f"{path}: {what}; give a dataset folder, or prepare one with "
                           "`kosmoss data prepare`")
    metadata = _read_metadata(path)
    dataset = PreparedDataset(path, metadata)
    offsets_total = 0
    for shard in dataset.shards:
        for name, columns in ((shard.x_file, dataset.n_x), (shard.y_file, dataset.n_y)):
            _check_array_file(path / name, (shard.rows, columns), metadata["dtype"])
        offsets_total += shard.rows
    if offsets_total != dataset.n_samples:
        raise DatasetError(f"{path / METADATA_FILE}: shards hold {offsets_total} rows, "
                           f"metadata says {dataset.n_samples}; {again(path)}")
    _check_stats_file(dataset)
    if verify:
        verify_checksums(dataset, trust_unchanged=trust_unchanged)
    return dataset


def _read_metadata(path: Path) -> dict:
    file = path / METADATA_FILE
    if not file.is_file():
        raise DatasetError(f"{path}: no {METADATA_FILE}, so not a complete kosmoss dataset "
                           "(interrupted or foreign); prepare it with `kosmoss data prepare`")
    try:
        metadata = read_json(file)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{file}: unreadable ({err}); if {path} is a kosmoss dataset, "
                           "delete it and prepare it again") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise DatasetError(f"{file}: not a {FORMAT} dataset; prepare one with "
                           "`kosmoss data prepare`")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{file}: {FORMAT} v{metadata.get('format_version')}, this kosmoss "
                           f"reads v{FORMAT_VERSION}; {again(path)}")
    problem = _field_problem(metadata)
    if problem:
        raise DatasetError(f"{file}: {problem}, not what kosmoss writes; {again(path)}")
    return metadata


# The fields open_dataset reads, with their least value: an edited or damaged metadata.json
# is named here, not met as a ValueError or KeyError deep in the reading.
_COUNTS = {"n_samples": 0, "n_x": 1, "n_y": 1}
_SHARD_FIELDS = {field.name: field.type for field in dataclasses.fields(Shard)}  # "int", "str"


def _field_problem(metadata: dict) -> Optional[str]:
    for field, least in _COUNTS.items():
        value = metadata.get(field)
        if type(value) is not int or value < least:  # not bool, not 1.5, not "2048"
            return f"{field} {value!r} is not a whole number >= {least}"
    if not _is_dtype(metadata.get("dtype")):
        return f"dtype {metadata.get('dtype')!r} is not a numpy dtype"
    shards = metadata.get("shards")
    if not isinstance(shards, list) or not all(_is_shard(entry) for entry in shards):
        return "its shards are not a list of " + ", ".join(_SHARD_FIELDS)
    return None


def _is_dtype(name) -> bool:
    if not isinstance(name, str) or not name.isprintable() or name != name.strip():
        return False  # numpy reads "\n" as uint64; an error must stay one line
    try:
        return np.dtype(name) is not None
    except (TypeError, ValueError, SyntaxError):  # numpy parses "0:" and "01" as formats
        return False


def _is_shard(entry) -> bool:
    return isinstance(entry, dict) and set(entry) == set(_SHARD_FIELDS) and all(
        type(entry[name]).__name__ == kind for name, kind in _SHARD_FIELDS.items()) \
        and entry["rows"] >= 0 and _is_file_name(entry["x_file"]) and \
        _is_file_name(entry["y_file"])


def _is_file_name(name: str) -> bool:
    """A file of the dataset's own folder, printable: no path, no newline in an error."""
    return name.isprintable() and name not in ("", ".", "..") and "/" not in name


def _check_array_file(file: Path, shape: tuple, dtype: str) -> None:
    if not file.is_file():
        raise DatasetError(f"{file}: shard {why_not_a_file(file)}; {again(file.parent)}")
    try:
        array = np.load(file, mmap_mode="r")
    except (ValueError, OSError) as err:
        raise DatasetError(f"{file}: corrupted shard ({err}); {again(file.parent)}") from None
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise DatasetError(f"{file}: shape {array.shape} {array.dtype}, metadata says {shape} "
                           f"{dtype}; {again(file.parent)}")


def _check_stats_file(dataset: PreparedDataset) -> None:
    file = dataset.path / STATS_FILE
    if not file.is_file():
        raise DatasetError(f"{file}: {why_not_a_file(file)}; {again(dataset.path)}")
    expected = {"x_mean": dataset.n_x, "x_std": dataset.n_x,
                "y_mean": dataset.n_y, "y_std": dataset.n_y}
    try:
        with np.load(file) as data:
            shapes = {key: data[key].shape for key in expected}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{file}: unreadable ({err}); {again(dataset.path)}") from None
    for key, features in expected.items():
        if shapes[key] != (features,):
            raise DatasetError(f"{file}: {key} has shape {shapes[key]}, the data has {features} "
                               f"features; {again(dataset.path)}")


def verify_checksums(dataset: PreparedDataset, *, trust_unchanged: bool = False) -> None:
    """Hash every file against metadata.json. With ``trust_unchanged``, a file whose size and
    modification time are those recorded when it last matched is not hashed again (the
    quick check rsync and make use; `kosmoss data info --verify` hashes everything)."""
    expected = {name: digest for shard in dataset.shards
                for name, digest in ((shard.x_file, shard.x_sha256),
                                     (shard.y_file, shard.y_sha256))}
    stats = dataset.metadata["stats"]
    expected[stats["file"]] = stats["sha256"]
    matched = _read_verified(dataset.path) if trust_unchanged else {}
    for name, digest in expected.items():
        file = dataset.path / name
        if matched.get(name) != _stamp(file) and sha256_of(file) != digest:
            raise DatasetError(f"{file}: checksum does not match metadata.json "
                               f"(corrupted or modified); {again(dataset.path)}")
    _write_verified(dataset.path, {name: _stamp(dataset.path / name) for name in expected})


def _stamp(file: Path) -> list:
    info = file.stat()
    return [info.st_size, info.st_mtime_ns]


def _read_verified(folder: Path) -> dict:
    try:
        stamps = json.loads((folder / VERIFIED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}  # damaged: every file is checked again


def _write_verified(folder: Path, stamps: dict) -> None:
    try:
        atomic_write_json(folder / VERIFIED_FILE, stamps)
    except OSError:  # a read-only shared dataset: it is simply hashed again next time
        pass
