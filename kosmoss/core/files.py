"""Writing files so that a reader never sees half of one: a temporary file beside the
target, then ``os.replace`` (atomic on POSIX). The one helper every writer of kosmoss uses."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Union


def atomic_write_with(path: Union[str, Path], write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` fills a temporary path (e.g. matplotlib's ``savefig``), then it takes
    ``path``'s place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write failed (disk full, ...)
    return path


def atomic_write_bytes(path: Union[str, Path], data: bytes) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Union[str, Path], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Union[str, Path], data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")
