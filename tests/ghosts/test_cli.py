"""``kosmoss ghosts`` as a command: bad input, ``--port``, ``--pid``, and
``kosmoss.release_memory()`` on CPU."""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest
from ghost_helpers import alive, end_all, processes_of, start, wait_until

import kosmoss
from kosmoss import cli
from kosmoss.launch.ports import port_is_free

LISTENER = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            "print(s.getsockname()[1], flush=True); time.sleep(120)")


@pytest.fixture
def started(kosmoss_home):
    processes = []
    yield processes
    end_all(kosmoss_home, processes)


@pytest.fixture
def nobody(kosmoss_home, started, tmp_path):
    """A process of another user: user nobody's sleep."""
    if os.getuid() != 0 or not shutil.which("runuser"):
        pytest.skip("creating another user's process needs root and runuser")
    started.append(start(["runuser", "-u", "nobody", "--", "sleep", "120"], kosmoss_home,
                         tmp_path / "log"))
    return wait_until(lambda: [p.pid for p in processes_of(kosmoss_home) if _nobodys_sleep(p)],
                      10, "nobody's sleep")[0]


def _nobodys_sleep(proc: psutil.Process) -> bool:
    # by its command too: runuser itself reads as user nobody for a moment (a PAM step), and
    # a fixture that took it once handed the test a root process to refuse
    try:
        return proc.username() == "nobody" and proc.cmdline()[:1] == ["sleep"]
    except psutil.Error:
        return False


def _no_such_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as limit:
        return int(limit.read()) + 1  # above pid_max: never a process


@pytest.mark.parametrize("args, names", [
    (["--grace", "-1"], "--grace -1"),
    (["--grace", "nan"], "--grace nan"),
    (["--kill", "--grace", "-0.5"], "--grace -0.5"),
    (["--port", "0"], "--port 0"),
    (["--port", "70000"], "--port 70000"),
    (["--pid", "0"], "--pid 0"),
    (["--pid", str(_no_such_pid())], "no such process"),
    (["--pid", "abc"], "--pid"),
])
def test_bad_input_is_one_line_and_exit_2(args, names, kosmoss_home, capsys):
    try:
        code = cli.main(["ghosts", *args])
    except SystemExit as stop:  # what argparse itself refuses
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert names in err and len(err.strip().splitlines()) == 1


def test_bad_input_from_the_command_line(kosmoss_home):
    proc = subprocess.run([sys.executable, "-m", "kosmoss.commands.ghosts", "--kill", "--grace",
                           "-1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "kosmoss ghosts: error: --grace -1: give 0 or more seconds to wait between SIGTERM and "
        "SIGKILL"]


def test_another_users_pid_is_refused_and_left_alone(nobody, capsys):
    assert cli.main(["ghosts", "--kill", "--pid", str(nobody)]) == 2
    err = capsys.readouterr().err
    assert f"--pid {nobody}: owned by user nobody" in err and len(err.splitlines()) == 1
    assert alive(nobody)


def test_nothing_to_report(kosmoss_home, capsys):
    assert cli.main(["ghosts", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert all(g["kind"] == "gpu-memory" and not g["killable"] for g in listed)
    assert cli.main(["ghosts"]) == 0
    if not listed:  # a GPU machine may have GPU holders to show
        assert "no ghost" in capsys.readouterr().out


def test_port_holder_is_listed_and_ended_only_when_named(kosmoss_home, started, tmp_path, capsys):
    listener = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    started.append(listener)
    port = int(listener.stdout.readline())
    assert cli.main(["ghosts", "--port", str(port), "--json"]) == 0
    (holder,) = json.loads(capsys.readouterr().out)
    assert (holder["pid"], holder["run_id"], holder["kind"], holder["killable"]) == \
        (listener.pid, None, "port", False)
    assert f"listens on port {port}" in holder["reason"]
    assert cli.main(["ghosts", "--kill", "--port", str(port)]) == 0
    assert "no ghost to end" in capsys.readouterr().out and alive(listener.pid)
    assert cli.main(["ghosts", "--kill", "--port", str(port), "--pid", str(listener.pid)]) == 0
    out = capsys.readouterr().out
    assert f"ended 1 process(es) (pid {listener.pid})" in out and f"port(s) {port}" in out
    assert listener.wait(timeout=5) is not None and port_is_free(port)
    assert cli.main(["ghosts", "--port", str(port)]) == 0
    assert f"port {port}: free" in capsys.readouterr().out


def test_this_command_and_its_parents_cannot_be_named(kosmoss_home, capsys):
    for pid in (os.getpid(), os.getppid()):
        assert cli.main(["ghosts", "--kill", "--pid", str(pid)]) == 2
        assert "this command or one of its parents" in capsys.readouterr().err
    assert psutil.Process().is_running()


def test_release_memory_on_cpu():
    class Node:
        def __init__(self):
            self.me = self  # a cycle: only the garbage collector frees it

    gc.collect()
    for _ in range(500):
        Node()
    freed = kosmoss.release_memory()
    assert freed["objects_collected"] >= 500
    assert freed["cuda"] is False and freed["cuda_freed"] is None
    assert kosmoss.release_memory()["objects_collected"] < 500  # nothing left to collect
