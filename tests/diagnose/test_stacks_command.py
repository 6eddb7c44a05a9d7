"""``kosmoss stacks`` and ``kosmoss watch`` as commands, on a run of two marked processes
(tests/ghosts/marked_process.py: recorded as kosmoss records its ranks, no torch), and
their bad input: one line, exit 2, for a run that does not exist or is over, no ptrace
permission, py-spy missing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from diagnose_helpers import end_all, environment, wait_until
from helpers import REPO

from kosmoss import cli
from kosmoss.launch import records

MARKED = REPO / "tests" / "ghosts" / "marked_process.py"
RUN_ID = "20260101-000000-marked"


@pytest.fixture
def marked_run(kosmoss_home, tmp_path):
    """A launcher and the rank it spawned, both sleeping in marked_process.py's main()."""
    run_dir = kosmoss_home / "runs" / RUN_ID
    launcher = subprocess.Popen([sys.executable, str(MARKED), str(run_dir), "--spawn"],
                                cwd=REPO, env=environment(kosmoss_home),
                                stdout=(tmp_path / "log").open("ab"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: len(records.read_processes(run_dir)) == 2, 30, "both records")
        yield run_dir, launcher
    finally:
        end_all(kosmoss_home, [launcher])


def _bad(capsys, *args) -> str:
    try:
        code = cli.main(list(args))
    except SystemExit as stop:  # what argparse itself refuses
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_identical_stacks_are_one_group(marked_run, capsys):
    run_dir, launcher = marked_run

    def grouped():
        assert cli.main(["stacks", "--json"]) == 0
        dump = json.loads(capsys.readouterr().out)
        return dump if len(dump["groups"]) == 1 else None

    dump = wait_until(grouped, 30, "both processes to sleep")  # the spawned one starts last
    (group,) = dump["groups"]
    assert dump["run_id"] == RUN_ID and not group["odd_one_out"]
    assert [m["label"] for m in group["members"]] == ["rank 0", "a rank"]
    assert group["members"][0]["pid"] == launcher.pid
    assert "`time.sleep(120)` in main (marked_process.py:" in group["summary"]
    assert cli.main(["stacks", str(run_dir)]) == 0  # a run directory names the run too
    out = capsys.readouterr().out
    assert f"rank 0 (pid {launcher.pid}), a rank (pid" in out and "(identical stacks)" in out


def test_watch_without_heartbeats_lists_the_ranks_and_says_why(marked_run, capsys):
    run_dir, launcher = marked_run
    assert cli.main(["watch", RUN_ID, "--once", "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in snap["ranks"]] == ["no heartbeat", "no heartbeat"]
    assert snap["ranks"][0]["pid"] == launcher.pid and snap["stragglers"] == []
    assert any("no heartbeat file" in note for note in snap["notes"])
    assert not (run_dir / "heartbeats").exists()  # watch never writes into the run


def test_a_run_that_is_over_is_refused(marked_run, capsys):
    run_dir, launcher = marked_run
    end_all(run_dir.parents[1], [launcher])
    for command in ("stacks", "watch"):
        err = _bad(capsys, command, RUN_ID)
        assert f"run {RUN_ID} is not alive" in err
    assert "no live kosmoss run" in _bad(capsys, "stacks")


@pytest.mark.parametrize("args, says", [
    (["stacks", "nope"], "run nope: no such run"),
    (["watch", "nope"], "run nope: no such run"),
    (["watch", "--threshold", "1.5"], "--threshold 1.5"),
    (["watch", "--interval", "0"], "--interval 0"),
    (["stacks", "--out", "/no/such/folder/stacks.txt"], "folder /no/such/folder does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, kosmoss_home, capsys):
    assert says in _bad(capsys, *args)


def test_ambiguous_run_prefix(kosmoss_home, capsys):
    for run_id in ("20260101-000000-aaaaaa", "20260101-000000-bbbbbb"):
        (kosmoss_home / "runs" / run_id).mkdir(parents=True)
    assert "2 runs start with it" in _bad(capsys, "stacks", "20260101")


def test_py_spy_missing(kosmoss_home, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no py-spy beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "py-spy is missing: `pip install py-spy`" in _bad(capsys, "stacks")
    assert "py-spy is missing" in _bad(capsys, "ghosts", "--stacks")


def test_no_permission_to_ptrace(marked_run, tmp_path, monkeypatch, capsys):
    """py-spy run as user nobody, as a user without the right to trace would."""
    real = shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if os.getuid() != 0 or not shutil.which("runuser") or not real:
        pytest.skip("running py-spy as another user needs root, runuser and py-spy")
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(f'#!/bin/sh\nexec runuser -u nobody -- {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # finds the wrapper
    err = _bad(capsys, "stacks", RUN_ID)
    assert "no permission to attach with ptrace" in err
    assert "sudo" in err or "SYS_PTRACE" in err


def test_readers_of_one_process_at_once_each_read_it(marked_run):
    """Ranks that time out together read each other's stacks at once; ptrace lets one
    tracer attach at a time, and the kernel refuses the next with the EPERM of a missing
    right: it was reported as "no permission to attach with ptrace", with advice about
    sudo. Each reader now waits for the one before it."""
    from concurrent.futures import ThreadPoolExecutor

    from kosmoss.diagnose.stacks import dump

    _, launcher = marked_run
    with ThreadPoolExecutor(max_workers=4) as pool:
        read = list(pool.map(lambda _: dump(launcher.pid), range(4)))
    assert all(any(t.os_thread_id == launcher.pid for t in threads) for threads in read)
