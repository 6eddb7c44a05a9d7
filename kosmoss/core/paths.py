"""Where kosmoss keeps data and runs: ``$KOSMOSS_HOME`` (default ``~/.kosmoss``).

Functions, not constants: the environment is read when asked, never at import, and
nothing is created here.
"""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("KOSMOSS_HOME") or Path.home() / ".kosmoss").expanduser()


def data_root() -> Path:
    return home() / "data"


def runs_root() -> Path:
    return home() / "runs"
