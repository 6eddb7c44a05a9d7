"""A data worker killed under load: its pipe can reset (or end mid-message, EOFError) a
moment before the worker is seen dead. DeadRankNamed looks again for a while, so the run
still fails with the one line that names the worker (kosmoss.run.faults)."""
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from kosmoss.core.errors import RunFailed
from kosmoss.launch import records
from kosmoss.run import faults


@pytest.fixture
def worker(monkeypatch):
    """A live process standing for this rank's one data worker; SIGCHLD's handler kept."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(faults, "my_workers", lambda run_dir: [records.ProcessId.of(process.pid)])
    handler = signal.getsignal(signal.SIGCHLD)
    yield process
    signal.signal(signal.SIGCHLD, handler)
    process.kill()
    process.wait()


def _kill_later(process, after_s):
    def kill():
        time.sleep(after_s)
        process.kill()
        process.wait()
    threading.Thread(target=kill, daemon=True).start()


@pytest.mark.parametrize("error", [EOFError(), ConnectionResetError(104, "reset by peer"),
                                   RuntimeError("DataLoader worker exited unexpectedly")])
def test_a_worker_seen_dead_late_is_still_named(tmp_path, worker, error):
    trainer = SimpleNamespace(world_size=1, global_step=7)
    _kill_later(worker, 0.5)  # alive when the error arrives, dead within the wait
    with pytest.raises(RunFailed) as failed:
        faults.DeadRankNamed(tmp_path).on_exception(trainer, None, error)
    assert str(failed.value).startswith(f"a data worker (pid {worker.pid}) of this rank died; "
                                        "this rank stopped at step 7")


def test_an_error_of_the_rank_itself_goes_through_at_once(tmp_path, worker):
    trainer = SimpleNamespace(world_size=1, global_step=7)
    start = time.monotonic()
    faults.DeadRankNamed(tmp_path).on_exception(trainer, None, ValueError("a bug"))
    assert time.monotonic() - start < 0.5  # not waited for: no worker could explain it
    assert worker.poll() is None


def test_a_live_worker_is_not_blamed(tmp_path, worker):
    trainer = SimpleNamespace(world_size=1, global_step=7)
    faults.DeadRankNamed(tmp_path).on_exception(trainer, None, RuntimeError("this rank's own"))
    assert worker.poll() is None  # looked for WAIT_FOR_THE_DEAD_S, found alive, no line


@pytest.fixture
def spawned_rank():
    """A live process standing for local rank 1, which Lightning's launcher started."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def _line_when_it_dies(tmp_path, monkeypatch, child, dies) -> str:
    """DeadRankNamed's line when ``dies(child)`` runs as the run's records are read and
    returns the rank's record, still "running"."""
    record = {"state": records.RUNNING, "pid": child.pid, "spawned": True, "node_rank": 0,
              "local_rank": 1}
    monkeypatch.setattr(faults, "my_workers", lambda run_dir: [])
    monkeypatch.setattr(faults, "ended_peer", lambda run_dir: dies(child) or record)
    monkeypatch.setattr(faults.private, "spawned_ranks", lambda trainer: [child])
    trainer = SimpleNamespace(world_size=2, global_step=26, node_rank=0, num_devices=2)
    with pytest.raises(RunFailed) as failed:
        faults.DeadRankNamed(tmp_path).on_exception(trainer, None, RuntimeError("gloo"))
    return str(failed.value)


def test_a_local_rank_that_dies_between_the_two_looks_is_named_by_its_signal(
        tmp_path, monkeypatch, spawned_rank):
    """The spawned rank is alive when its exit status is polled and dead when the records
    are read (a race seen in CI, 2026-11-28): the line names the signal, not "died"."""
    def dies_while_read(child):
        child.kill()
        child.wait()  # reaped here: poll() then gives its status without a wait

    line = _line_when_it_dies(tmp_path, monkeypatch, spawned_rank, dies_while_read)
    assert line.startswith(f"rank 1 (pid {spawned_rank.pid}) was killed by SIGKILL; "
                           "this rank stopped at step 26")


def test_a_local_rank_polled_by_lightnings_observer_at_that_moment_is_named_by_its_signal(
        tmp_path, monkeypatch, spawned_rank):
    """Lightning's child-process observer polls the same Popen from its thread: while it holds
    the Popen's waitpid lock, ``poll()`` answers None for a dead child (a race seen when two
    test workers shared 2 cores). The exit status is waited for instead of read as "died"."""
    observer_polls = threading.Event()

    def hold_the_lock_a_moment(child):
        with child._waitpid_lock:  # CPython's lock that an observer's poll holds, stretched
            observer_polls.set()
            time.sleep(0.3)

    def dies_while_observed(child):
        child.kill()
        while records.ProcessId.of(child.pid).is_alive():  # a zombie now, not reaped
            time.sleep(0.01)
        threading.Thread(target=hold_the_lock_a_moment, args=(child,)).start()
        observer_polls.wait()

    line = _line_when_it_dies(tmp_path, monkeypatch, spawned_rank, dies_while_observed)
    assert line.startswith(f"rank 1 (pid {spawned_rank.pid}) was killed by SIGKILL; ")
