"""Shared fixtures: a private KOSMOSS_HOME, small datasets made by the tests themselves."""
from __future__ import annotations

import getpass
import os
import signal
import tempfile
import threading
import warnings
from pathlib import Path

import pytest

from helpers import SLOW_TEST_TIMEOUT_S, WHOLE_MACHINE, RandomSource
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare


def pytest_collection_modifyitems(items):
    for item in items:  # a test's own timeout mark (the lessons') wins
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
        if _test_folder(item.nodeid) in WHOLE_MACHINE:
            item.add_marker(pytest.mark.whole_machine)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the process that runs the workers
def pytest_xdist_node_collection_finished(node, ids):
    beside = [nodeid for nodeid in ids if _test_folder(nodeid) in WHOLE_MACHINE]
    if beside:
        pytest.exit(f"{beside[0]} (and {len(beside) - 1} more) look at the whole machine and "
                    'must run alone: add -m "not whole_machine" to this -n run, then run '
                    "python -m pytest -m whole_machine", returncode=pytest.ExitCode.USAGE_ERROR)


MUNGED_BEFORE = pytest.StashKey[set]()


def pytest_sessionstart(session):
    session.config.stash[MUNGED_BEFORE] = _munged()


def pytest_sessionfinish(session):
    """The munged the Slurm tests started (kosmoss starts it as a service would, to outlive
    a run) ends with the suite: the machine is left with the daemons it had."""
    if hasattr(session.config, "workerinput"):  # pytest-xdist: the controller ends it
        return
    for pid in _munged() - session.config.stash.get(MUNGED_BEFORE, set()):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def _munged() -> set:
    import psutil

    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "munged"}


def _test_folder(nodeid: str) -> str:
    """"lessons" for tests/lessons/test_lessons.py::..., "" for a test file in tests/."""
    path = nodeid.split("::")[0].split("/")
    return path[1] if len(path) > 2 else ""


@pytest.fixture(scope="session", autouse=True)
def temporary_files_under_pytests_own_folder(tmp_path_factory):
    """TMPDIR inside this session's pytest folder, for this process and every one it starts:
    what a killed torchrun agent (torchelastic_*), a multiprocessing listener (pymp-*) or a
    lesson's scratch folder leaves behind goes with the folder when pytest rotates it (it
    keeps the last three sessions), not into /tmp for good."""
    folder = tmp_path_factory.getbasetemp() / "tmp"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        # torch.compile's cache stays at torch's default place (its cache_dir_utils), warm
        # from one session to the next.
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                     or os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"))
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", None)  # tempfile caches its choice
        yield folder


def _user() -> str:
    """The user name as torch names its cache folder by, falling back the same way."""
    try:
        return getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no passwd entry, as in some containers
        return f"uid_{os.getuid()}"


@pytest.fixture(autouse=True)
def ctrl_c_given_back(request):
    """A test whose in-process Trainer met a KeyboardInterrupt leaves SIGINT ignored: Lightning
    ignores it for its shutdown and never restores it (pytorch_lightning/trainer/call.py). The
    processes later tests start would inherit that and ignore their Ctrl-C: it is given back."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if threading.current_thread() is threading.main_thread() and before is not signal.SIG_IGN \
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left SIGINT ignored (given back)")


@pytest.fixture(scope="session", autouse=True)
def a_kosmoss_home_per_xdist_worker(tmp_path_factory):
    """Under pytest-xdist each worker gets its own KOSMOSS_HOME for the tests that take the
    session's: two workers never prepare one dataset in one folder at once."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    home = tmp_path_factory.getbasetemp() / "kosmoss-home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KOSMOSS_HOME", str(home))
        yield home


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
