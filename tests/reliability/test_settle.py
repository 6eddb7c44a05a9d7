"""A run.json left ``running`` by a launcher killed with ``kill -9`` is settled ``killed``
once its processes are gone, and only then (kosmoss.launch.records.settle_if_gone)."""
import json
import os
import subprocess
import sys

from kosmoss.launch import records


def _run(tmp_path, launcher, host=None):
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "processes").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": "r1", "host": host or records.hostname(), "state": "running",
        "launcher": launcher.as_dict()}))
    return run_dir


def _gone_process():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid = records.ProcessId.of(child.pid)
    child.wait()
    return pid


def test_a_run_whose_launcher_is_gone_is_settled_killed(tmp_path):
    run_dir = _run(tmp_path, _gone_process())
    assert records.settle_if_gone(run_dir) == records.KILLED
    assert records.read_run(run_dir)["state"] == records.KILLED
    assert records.settle_if_gone(run_dir) is None  # once


def test_a_live_run_and_another_hosts_run_stay_running(tmp_path):
    live = _run(tmp_path / "a", records.ProcessId.of(os.getpid()))
    elsewhere = _run(tmp_path / "b", _gone_process(), host="another-host")
    assert records.settle_if_gone(live) is None and records.settle_if_gone(elsewhere) is None
    assert {records.read_run(live)["state"], records.read_run(elsewhere)["state"]} == {"running"}
