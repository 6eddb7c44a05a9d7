"""Shared fixtures: a private KOSMOSS_HOME, small datasets made by the tests themselves."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SLOW_TEST_TIMEOUT_S, RandomSource
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare


def pytest_collection_modifyitems(items):
    for item in items:  # a test's own timeout mark (the lessons') wins
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


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
