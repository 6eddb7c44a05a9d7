"""Writing files so that a reader never sees half of one: a temporary file beside the
target, then ``os.replace`` (atomic on POSIX). The one helper every writer of kosmoss uses.
And reading a JSON file a user named, so that a FIFO or a device cannot hang or fill memory."""
from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator, Union

from .errors import RunFailed, UsageError


def atomic_write_with(path: Union[str, Path], write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` fills a temporary path (e.g. matplotlib's ``savefig``), then it takes
    ``path``'s place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        if err.filename in (None, str(tmp)):  # a full disk's write names no file: name it
            err.filename = str(path)
        raise
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write failed (disk full, ...)
    return path


def atomic_write_bytes(path: Union[str, Path], data: bytes) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Union[str, Path], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Union[str, Path], data: Any) -> Path:
    return atomic_write_text(path, json_text(data))


def json_text(data: Any) -> str:
    """Indented JSON that every reader takes: Python writes NaN and inf bare, which is no
    JSON (jq, browsers and JSON.parse refuse the whole file); they are written null, as
    JavaScript's JSON.stringify writes them."""
    return json.dumps(_numbers_or_null(data), indent=2, allow_nan=False) + "\n"


def _numbers_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _numbers_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numbers_or_null(item) for item in value]
    return value


JSON_MAX_BYTES = 64 * 2**20  # a result.json with a validation curve of a million points

_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def why_not_a_file(path: Path) -> str:
    """What ``path``, which is no regular file, is instead: words after its name in an error
    ("missing", "is a FIFO, not a regular file")."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if path.is_symlink() else "missing"
    except OSError as err:  # ELOOP: a link that points to itself
        return f"cannot be read ({err.strerror})"
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
    return f"is {kind}, not a regular file"


def read_json(path: Union[str, Path], limit: int = JSON_MAX_BYTES) -> Any:
    """The JSON in ``path`` when it is a regular file of at most ``limit`` bytes; else OSError
    or ValueError (whose text says why)."""
    return json.loads(read_regular(path, limit))


def read_json_object(path: Union[str, Path], limit: int = JSON_MAX_BYTES) -> dict:
    """``read_json`` of a file that must hold one JSON object, as every file kosmoss writes
    does: a list, a string or null is a ValueError too."""
    data = read_json(path, limit)
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not an object")
    return data


def read_regular(path: Union[str, Path], limit: int) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes; else
    OSError or ValueError (whose text says why). A FIFO would wait for a writer forever and
    /dev/zero never ends, so neither is read."""
    # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
            raise ValueError(f"{kind}, not a regular file")
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"over {limit / 2**20:g} MiB, too large for what it should hold")
    return data


MIN_FREE_BYTES = 2**20  # a command's tables, figures and logs; below this the disk is full


def output_folder(out: Path, marker: str, whose: str, flag: str = "--out") -> Path:
    """``out``, checked before anything runs, as the folder a command writes into: new, empty,
    or an earlier output of the same command (it holds ``marker``, and is replaced); nothing
    else of the user's is overwritten. It must be on a file system that takes writes, with room."""
    out = out.expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: is a file; give a folder (new, empty, or an earlier "
                         f"{whose})")
    if out.is_dir() and any(out.iterdir()):
        if not (out / marker).exists():
            raise UsageError(f"{flag} {out}: not empty and holds no {marker}; give a new or "
                             f"empty folder, or an earlier {whose}")
        _check_earlier_output(out, marker, whose, flag)
    check_writable(out, flag)
    return out


def _check_earlier_output(out: Path, marker: str, whose: str, flag: str) -> None:
    """A ``marker`` of the user's own, or one that no longer reads, is not an earlier output:
    taken for one, it and its neighbours of the same names were written over. Each command
    stamps its JSON with ``kosmoss_<name>``."""
    stamp = f"kosmoss_{Path(marker).stem}"
    try:
        ours = stamp in read_json_object(out / marker)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {out}: its {marker} cannot be read ({error}), so it is not "
                         f"known to be an earlier {whose}; give a new or empty folder") from None
    if not ours:
        raise UsageError(f"{flag} {out}: its {marker} was not written by kosmoss (no "
                         f"{stamp}); give a new or empty folder")


def check_writable(folder: Path, flag: str, what_to_do: str = "give another folder") -> None:
    """``folder`` (or the nearest folder above it that exists) takes new files: not read-only,
    writable by this user, not full. A one-line UsageError naming ``flag`` otherwise."""
    existing = nearest_existing(folder)
    if not existing.is_dir():
        raise UsageError(f"{flag} {folder}: {existing} is a file, not a folder; {what_to_do}")
    disk = os.statvfs(existing)
    if disk.f_flag & os.ST_RDONLY:
        raise UsageError(f"{flag} {folder}: {existing} is on a read-only file system; "
                         f"{what_to_do}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {folder}: {existing} is not writable by you; {what_to_do}")
    if holds_no_files(existing):
        raise UsageError(f"{flag} {folder}: {existing} {KERNEL_FILE_SYSTEM}; {what_to_do}")
    free = free_bytes(existing)
    if free < MIN_FREE_BYTES:
        raise UsageError(f"{flag} {folder}: the disk holding {existing} is full ({free // 1024} "
                         f"KiB free); free some space or {what_to_do}")


def nearest_existing(path: Path) -> Path:
    """``path``, or the nearest folder above it that exists (what creating it would write into)."""
    return next(p for p in (path, *path.parents) if p.exists())


KERNEL_FILE_SYSTEM = "is on a kernel file system (like /proc or /sys) that holds no files"


def holds_no_files(folder: Path) -> bool:
    """/proc, /sys and their like have no blocks at all: root may pass os.access there, and
    their "0 B free" would read as a full disk."""
    return os.statvfs(folder).f_blocks == 0


def free_bytes(folder: Path) -> int:
    """What this user may still write on the file system holding ``folder``."""
    disk = os.statvfs(folder)
    return disk.f_bavail * disk.f_frsize


@contextlib.contextmanager
def writing_into(folder: Path, flag: str = "--out") -> Iterator[None]:
    """A file that cannot be written after the work is done (the disk filled meanwhile) ends
    the command with one line, exit 1, rather than a traceback; the results were printed."""
    try:
        yield
    except OSError as err:
        name = Path(err.filename).name if err.filename else "its files"
        raise RunFailed(f"{flag} {folder}: could not write {name} ({err.strerror or err}); the "
                        f"results are printed above: free some space or give another {flag}, "
                        "then run again") from None
