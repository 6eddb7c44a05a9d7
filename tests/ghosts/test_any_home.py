"""Ghosts found from their own marks, whatever their KOSMOSS_HOME, with the
causes that make them matter: a port a new run wants, an orphaned rank,
a data worker of a dead rank; and ``--stacks`` before ``--kill``. Processes marked as
kosmoss marks its ranks (marked_process.py): no torch, a few seconds in all."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest
from ghost_helpers import alive, end_all, start_marked, wait_until

from kosmoss import cli, ghosts
from kosmoss.launch import records
from kosmoss.launch.ports import free_port, port_is_free

RUN_ID = "20260101-000000-abcdef"


def _records(run_dir, n):
    found = records.read_processes(run_dir)
    return found if len(found) >= n else None


def _kosmoss_ghosts():
    return [g for g in ghosts.find_ghosts() if g.kind in ghosts.KOSMOSS_GHOSTS]


def _dead_launcher() -> records.ProcessId:
    with open("/proc/sys/kernel/pid_max") as limit:
        return records.ProcessId(int(limit.read()) + 1, 1.0)  # above pid_max: never alive


def _marked_env(home: str, run_id: str) -> dict:
    mark = records.LauncherMark(run_id, _dead_launcher()).encode()
    return {"KOSMOSS_HOME": home, records.RUN_ID_ENV: run_id, records.LAUNCHER_ENV: mark}


@pytest.fixture
def started():
    processes, homes = [], []
    yield processes, homes
    for home in homes:
        end_all(home, [])
    for popen in processes:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)


def test_orphans_of_a_deleted_home_are_found_and_why_they_matter(tmp_path, monkeypatch, started,
                                                                 capsys):
    procs, homes = started
    other = tmp_path / "test-home-since-deleted"
    run_dir, port = other / "runs" / RUN_ID, free_port()
    homes.append(other)
    launcher = start_marked(run_dir, other, tmp_path / "log", "--spawn", "--child-listen",
                            str(port))
    procs.append(launcher)
    (rank1,) = [r["pid"] for r in wait_until(lambda: _records(run_dir, 2), 30, "both records")
                if r["pid"] != launcher.pid]
    wait_until(lambda: not port_is_free(port), 30, f"rank 1 to listen on {port}")
    launcher.kill()
    launcher.wait()
    shutil.rmtree(other)  # its records go with it: only the marks are left
    monkeypatch.setenv("KOSMOSS_HOME", str(tmp_path / "my-home"))
    monkeypatch.setenv("MASTER_PORT", str(port))  # the port the next run in this shell wants

    (ghost,) = _kosmoss_ghosts()
    assert (ghost.pid, ghost.kind, ghost.run_id, ghost.killable) == \
        (rank1, "launcher-gone", RUN_ID, True)
    assert f"KOSMOSS_HOME {other} (deleted)" in ghost.reason and f"pid {launcher.pid}" in \
        ghost.reason
    held = [c for c in ghost.causes if f"port {port}" in c]
    assert held and "MASTER_PORT set in this shell" in held[0]
    assert 'EADDRINUSE ("address already in use")' in held[0]  # as torch's TCPStore says it
    assert any(c.startswith("orphaned rank") for c in ghost.causes)

    assert cli.main(["ghosts", "--stacks", "--json"]) == 0
    (listed,) = [g for g in json.loads(capsys.readouterr().out) if g["pid"] == rank1]
    assert "time.sleep(120)" in listed["stack"] and "marked_process.py" in listed["stack"]
    # The same causes; the RAM it frees is read again, and a live process's RAM moves.
    steady = lambda causes: [c for c in causes if not c.startswith("frees at least")]  # noqa: E731
    assert steady(listed["causes"]) == steady(ghost.causes) and len(listed["causes"]) == \
        len(ghost.causes)
    assert cli.main(["ghosts", "--kill", "--grace", "1"]) == 0
    assert f"ended 1 process(es) (pid {rank1})" in capsys.readouterr().out
    assert not alive(rank1) and port_is_free(port)


def test_a_forged_mark_on_another_users_process_is_never_a_ghost(tmp_path, kosmoss_home,
                                                                  started):
    """The same forged mark (a launcher that never existed, a home that does not exist) on a
    process of this user and on one of user nobody: only this user's is a ghost."""
    if os.getuid() != 0 or not shutil.which("runuser"):
        pytest.skip("starting another user's process needs root and runuser")
    procs, _ = started
    marks = _marked_env("/nonexistent/kosmoss-home", "20260101-000000-forged")
    mine = subprocess.Popen(["sleep", "120"], env={**os.environ, **marks})
    decoy = subprocess.Popen(["runuser", "-u", "nobody", "--", "env",
                              *[f"{k}={v}" for k, v in marks.items()], "sleep", "120"])
    procs += [mine, decoy]
    nobody = wait_until(lambda: [p.pid for p in psutil.Process(decoy.pid).children()
                                 if p.username() == "nobody" and p.name() == "sleep"],
                        10, "nobody's sleep")[0]
    listed = {g.pid: g for g in _kosmoss_ghosts()}
    assert listed[mine.pid].kind == "launcher-gone" and listed[mine.pid].killable
    assert nobody not in listed and decoy.pid not in listed
    assert cli.main(["ghosts", "--kill", "--grace", "1"]) == 0
    assert mine.wait(timeout=10) is not None
    assert alive(nobody)


def test_a_data_worker_of_a_dead_rank_says_what_it_holds(tmp_path, kosmoss_home, started):
    procs, homes = started
    homes.append(kosmoss_home)
    run_dir = kosmoss_home / "runs" / RUN_ID
    rank = start_marked(run_dir, kosmoss_home, tmp_path / "log", "--fork-worker", "--kind",
                        "single")
    procs.append(rank)
    found = wait_until(lambda: _records(run_dir, 2), 30, "the worker's record")
    (worker,) = [r["pid"] for r in found if r["role"] == "worker"]
    rank.kill()
    rank.wait()
    (ghost,) = [g for g in _kosmoss_ghosts() if g.pid == worker]
    assert ghost.kind == "worker-orphaned" and ghost.rss_bytes > 0
    assert any(c.startswith("data worker of a dead rank") and "of RAM" in c
               for c in ghost.causes)
    assert any(c.startswith(f"orphaned data worker (its parent, pid {rank.pid}, is gone)")
               for c in ghost.causes)


def test_stacks_of_a_process_that_is_not_python_say_why(kosmoss_home, started, capsys):
    procs, _ = started
    listener = subprocess.Popen([sys.executable, "-c", "import socket, time; "
                                 "s = socket.create_server(('127.0.0.1', 0)); "
                                 "print(s.getsockname()[1], flush=True); time.sleep(120)"],
                                stdout=subprocess.PIPE, text=True)
    sleeper = subprocess.Popen(["sleep", "120"])
    procs += [listener, sleeper]
    port = int(listener.stdout.readline())
    assert cli.main(["ghosts", "--port", str(port), "--pid", str(sleeper.pid), "--stacks"]) == 0
    out = capsys.readouterr().out
    assert f"pid {listener.pid} (port): in <module> (<string>:1)" in out
    assert f"pid {sleeper.pid} (named): pid {sleeper.pid}: py-spy failed" in out
