"""The run records and each ghost rule, on real processes marked the way kosmoss marks
its ranks (tests/ghosts/marked_process.py): no torch, a second or two each."""
from __future__ import annotations

import json
import os
import signal

import pytest
from ghost_helpers import alive, end_all, start_marked, wait_until

from kosmoss import ghosts
from kosmoss.launch import records


@pytest.fixture
def run_dir(kosmoss_home):
    return kosmoss_home / "runs" / "20260101-000000-abcdef"


@pytest.fixture
def started(kosmoss_home):
    processes = []
    yield processes
    end_all(kosmoss_home, processes)


def _records(run_dir, n):
    found = records.read_processes(run_dir)
    return found if len(found) >= n else None


def _by_pid(pid):
    return {ghost.pid: ghost for ghost in ghosts.find_ghosts()}.get(pid)


def test_start_and_finish_write_the_records_and_give_the_environment_back(run_dir, monkeypatch):
    monkeypatch.delenv(records.RUN_ID_ENV, raising=False)
    monkeypatch.delenv(records.LAUNCHER_ENV, raising=False)
    membership = records.start(run_dir, kind="single")
    run = records.read_run(run_dir)
    assert run["state"] == "running" and run["launcher"]["pid"] == os.getpid()
    assert os.environ[records.RUN_ID_ENV] == run_dir.name
    assert records.LauncherMark.decode(os.environ[records.LAUNCHER_ENV]).launcher == membership.me
    records.finish("finished")
    (mine,) = records.read_processes(run_dir)
    assert (mine["pid"], mine["state"], mine["spawned"]) == (os.getpid(), "finished", False)
    assert records.read_run(run_dir)["state"] == "finished"
    assert records.RUN_ID_ENV not in os.environ and records.LAUNCHER_ENV not in os.environ
    assert not [p for p in run_dir.rglob("*") if ".tmp-" in p.name]  # written atomically
    # The user's own process outlives its run: no ghost.
    assert not [g for g in ghosts.find_ghosts() if g.kind in ghosts.KOSMOSS_GHOSTS]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("state", [records.STOPPED, records.FINISHED])
def test_ctrl_c_pressed_while_the_records_are_written_waits_for_them(run_dir, monkeypatch,
                                                                     state, stop_signal):
    """Ctrl-C pressed again (or a second SIGTERM), landing between the process's record and
    run.json (CI saw it once: run.json left ``running`` after a run stopped by Ctrl-C): both
    are written first; then the signal is dropped when the run is already recorded stopped,
    else delivered."""
    monkeypatch.delenv(records.RUN_ID_ENV, raising=False)
    monkeypatch.delenv(records.LAUNCHER_ENV, raising=False)
    records.start(run_dir, kind="single")
    written, update = [], records._update_json

    def update_then_ctrl_c(path, **changes):
        update(path, **changes)
        written.append(path.name)
        if len(written) == 1:
            signal.raise_signal(stop_signal)  # its handler runs at once, in this thread

    def stop(signum, frame):  # as kosmoss.run.pipeline's: a stop signal raises
        raise records.Stopped(signum)

    monkeypatch.setattr(records, "_update_json", update_then_ctrl_c)
    previous = signal.signal(stop_signal, stop)
    try:
        if state == records.STOPPED:
            records.finish(state, "stopped by a signal", stop_signal.name)
        else:
            with pytest.raises(records.Stopped) as stopped:  # a run that finished, then this
                records.finish(state)
            assert stopped.value.signum == stop_signal
    finally:
        signal.signal(stop_signal, previous)
    assert len(written) == 2 and written[-1] == records.RUN_FILE
    assert records.read_run(run_dir)["state"] == state
    assert [r["state"] for r in records.read_processes(run_dir)] == [state]
    assert signal.getsignal(stop_signal) is previous
    assert records.RUN_ID_ENV not in os.environ  # the environment given back, then the stop


def test_a_run_that_raises_is_recorded_failed(run_dir):
    with pytest.raises(RuntimeError):
        with records.recorded(run_dir, kind="single"):
            raise RuntimeError("out of memory")
    run = records.read_run(run_dir)
    assert run["state"] == "failed" and "out of memory" in run["error"]
    assert records.current() is None


def test_killed_launcher_leaves_a_spawned_rank_that_is_listed_and_ended(run_dir, kosmoss_home,
                                                                        started, tmp_path):
    launcher = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--spawn")
    started.append(launcher)
    ranks = wait_until(lambda: _records(run_dir, 2), 30, "both ranks' records")
    (rank1,) = [r for r in ranks if r["pid"] != launcher.pid]
    assert rank1["spawned"] and rank1["launcher"]["pid"] == launcher.pid
    launcher.kill()
    launcher.wait()
    ghost = _by_pid(rank1["pid"])
    assert (ghost.kind, ghost.run_id, ghost.killable) == ("launcher-gone", run_dir.name, True)
    assert f"pid {launcher.pid}" in ghost.reason
    report = ghosts.end_ghosts([ghost], grace=1)
    assert report.ended == [rank1["pid"]] and not alive(rank1["pid"])


def test_a_dead_peer_makes_the_survivor_a_ghost(run_dir, kosmoss_home, started, tmp_path):
    launcher = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--spawn")
    started.append(launcher)
    ranks = wait_until(lambda: _records(run_dir, 2), 30, "both ranks' records")
    (rank1,) = [r for r in ranks if r["pid"] != launcher.pid]
    assert _by_pid(launcher.pid) is None  # a healthy run has no ghost
    os.kill(rank1["pid"], 9)
    wait_until(lambda: not alive(rank1["pid"]), 10, "rank 1 to die")
    ghost = _by_pid(launcher.pid)
    assert ghost.kind == "peer-died" and f"pid {rank1['pid']}" in ghost.reason


def test_a_forked_data_worker_outliving_its_rank_is_listed(run_dir, kosmoss_home, started,
                                                           tmp_path):
    rank = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--fork-worker", "--kind",
                        "single")
    started.append(rank)
    found = wait_until(lambda: _records(run_dir, 2), 30, "the worker's record")
    (worker,) = [r for r in found if r["role"] == "worker"]
    assert worker["parent"]["pid"] == rank.pid
    rank.kill()
    rank.wait()
    ghost = _by_pid(worker["pid"])
    assert ghost.kind == "worker-orphaned" and f"pid {rank.pid}" in ghost.reason


@pytest.fixture
def no_settle(monkeypatch):
    monkeypatch.setattr("kosmoss.ghosts.find.SETTLE_S", 0.0)  # the time a run's processes get to exit


def test_a_rank_outliving_its_ended_run(run_dir, kosmoss_home, started, tmp_path, no_settle):
    launcher = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--spawn", "--finish",
                            "failed")
    started.append(launcher)
    ranks = wait_until(lambda: _records(run_dir, 2), 30, "both ranks' records")
    (rank1,) = [r for r in ranks if r["pid"] != launcher.pid]
    wait_until(lambda: records.read_run(run_dir)["state"] == "failed", 10, "the failed state")
    assert _by_pid(launcher.pid) is None  # the user's own process lives on after its part
    ghost = _by_pid(rank1["pid"])
    assert ghost.kind == "run-ended" and "failed" in ghost.reason


def test_a_rank_that_finished_but_never_exited(run_dir, kosmoss_home, started, tmp_path,
                                              no_settle):
    launcher = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--spawn", "--child-finish",
                            "finished")
    started.append(launcher)
    ranks = wait_until(lambda: _records(run_dir, 2), 30, "both ranks' records")
    (rank1,) = [r for r in ranks if r["pid"] != launcher.pid]
    path = records.process_record_path(run_dir, rank1["pid"])
    wait_until(lambda: json.loads(path.read_text())["state"] == "finished", 10, "rank 1 finished")
    assert _by_pid(launcher.pid) is None  # a peer that finished is no reason
    assert _by_pid(rank1["pid"]).kind == "not-exited"


def test_a_reused_pid_is_not_the_recorded_process(run_dir):
    me = records.ProcessId.of(os.getpid())
    assert me.is_alive()
    assert not records.ProcessId(me.pid, me.create_time - 100).is_alive()
