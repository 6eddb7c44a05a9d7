"""Shared fixtures: a private KOSMOSS_HOME, small datasets made by the tests themselves."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kosmoss.data.schema import ColumnSchema
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare

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


@pytest.fixture
def kosmoss_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "kosmoss-home"
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    return home


@pytest.fixture
def random_dataset(tmp_path):
    return prepare(RandomSource(1000, levels=5), tmp_path / "random", shard_size=128)


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory) -> Path:
    """A KOSMOSS_HOME whose ``tiny`` preset and a 10-level dataset are prepared once."""
    home = tmp_path_factory.mktemp("shared-home")
    prepare(SyntheticSource(2048, seed=42), home / "data" / "tiny", shard_size=512)
    prepare(SyntheticSource(4096, seed=1, levels=10), home / "data" / "levels10", shard_size=1024)
    return home


def run_script(args, home: Path, timeout: float = 300, env_extra=None):
    """Run a kosmoss entry point as a user would, in its own KOSMOSS_HOME."""
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    for leaked in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK"):
        env.pop(leaked, None)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
