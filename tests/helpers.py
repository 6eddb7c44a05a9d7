"""Helpers the tests import (conftest.py only holds fixtures: its module name is shared)."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest

from kosmoss.data.schema import ColumnSchema

REPO = Path(__file__).resolve().parents[1]


class RandomSource:
    """Blocks of random numbers in the schema: for loader and storage tests that must not
    depend on the physics of the synthetic generator."""

    def __init__(self, n_columns: int, levels: int = 5, seed: int = 0):
        self.schema, self.n_columns, self.seed = ColumnSchema(levels), n_columns, seed

    def iter_chunks(self, chunk_size):
        rng = np.random.default_rng(self.seed)
        for start in range(0, self.n_columns, chunk_size):
            n = min(chunk_size, self.n_columns - start)
            blocks = {name: rng.normal(size=(n,) + shape).astype(np.float32)
                      for name, shape in self.schema.block_shapes().items()}
            blocks["sca_inputs"][:, 0] = 7.0  # a constant feature: zero variance
            yield blocks

    def describe(self):
        return {"name": "random", "seed": self.seed}


# How long multi-process tests wait for processes to start (import torch and Lightning, meet
# in a group). Quiet, it takes seconds; at load 10-14 on 2 cores a rank took over 2 minutes
# (2026-11-25), and the tests must still pass there.
STARTUP_TIMEOUT_S = 600
# pytest-timeout's limit for slow tests (tests/conftest.py): past the start-up wait, so
# a slow start-up fails with the test's own message and log tail, not a bare timeout.
SLOW_TEST_TIMEOUT_S = STARTUP_TIMEOUT_S + 300


# Tests that list or end processes and network namespaces of any KOSMOSS_HOME (`kosmoss
# ghosts --kill`, lessons 6, 10 and 12, the host sets) or build on what such tests saved (the
# site on the executed lessons): they run alone, never beside another pytest-xdist worker.
WHOLE_MACHINE = ("ghosts", "hosts", "lessons", "site")


def run_script(args, home: Path, timeout: float = 300, env_extra=None):
    """Run a kosmoss entry point as a user would, in its own KOSMOSS_HOME."""
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    for leaked in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK"):
        env.pop(leaked, None)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def wait_until(condition: Callable[[], object], timeout: float, what: str,
               log: Optional[Path] = None):
    """Poll ``condition`` until it is truthy (its value is returned): tests wait on markers,
    never on fixed sleeps. On timeout, the log's tail says why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


@contextlib.contextmanager
def small_tmpfs(folder: Path, size_kib: int = 64, *, read_only: bool = False,
                full: bool = False):
    """A tmpfs of ``size_kib`` at ``folder``, read-only or filled up if asked, unmounted
    after: a real EROFS or ENOSPC from the kernel. Mounting needs root: the test skips
    elsewhere."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if read_only else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                                            str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        if full:
            fill_up(folder)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill_up(folder: Path) -> None:
    """Write zeros into ``folder`` until its file system says it is full."""
    with open(folder / "filler", "ab", buffering=0) as filler:  # nothing left to flush at close
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err


def one_device_run(folder: Path, batch: int, step_s: float = 0.011) -> Path:
    """The result.json of a finished 1-GPU run (``batch`` samples a ``step_s`` step) in
    ``folder``: what ``kosmoss project --from`` starts from."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps({
        "world_size": 1, "per_device_batch_size": batch, "train_samples_per_s": batch / step_s,
        "accelerator": "gpu"}))
    return folder


def resize_tmpfs(folder: Path, size_kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kib}k", str(folder)], check=True)
