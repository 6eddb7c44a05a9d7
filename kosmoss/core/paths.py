"""Where kosmoss keeps data and runs: ``$KOSMOSS_HOME`` (default ``~/.kosmoss``).

Functions, not constants: the environment is read when asked, never at import, and
nothing is created here.
"""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    # Absolute: a relative KOSMOSS_HOME printed in a run's paths, and in run.json, named
    # another folder once read from elsewhere (`kosmoss watch` in another shell).
    chosen = os.environ.get("KOSMOSS_HOME") or Path.home() / ".kosmoss"
    return Path(chosen).expanduser().absolute()


def data_root() -> Path:
    return home() / "data"


def runs_root() -> Path:
    return home() / "runs"
