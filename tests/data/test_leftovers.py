"""Working folders that a killed preparation leaves behind: found, sized, removed only
when their writer is gone (the real ``kill -9`` is in tests/commands/test_data_command.py)."""
import os
import socket
import subprocess
import time

from helpers import RandomSource
from kosmoss.data.store import clean_leftovers, leftovers, prepare

HOST = socket.gethostname()


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _leftover(parent, name, pid, host=HOST, kind="tmp", megabytes=2):
    folder = parent / (f".{name}.{kind}-{pid}" + (f"@{host}" if host else "") + "-0123abcd")
    folder.mkdir()
    with open(folder / "x_00000.npy", "wb") as f:
        f.truncate(megabytes * 1_000_000)  # sparse: sized, not written
    return folder


def test_the_next_preparation_removes_a_dead_writers_folder_and_says_so(tmp_path):
    pid = _dead_pid()
    dead = _leftover(tmp_path, "d", pid)
    old_style = _leftover(tmp_path, "d", pid, host=None, kind="old")  # an earlier kosmoss's name
    other_name = _leftover(tmp_path, "e", pid)
    lines = []
    prepare(RandomSource(20), tmp_path / "d", 10, log=lines.append)
    assert not dead.exists() and not old_style.exists() and other_name.exists()
    assert len(lines) == 2
    assert all(f"2.0 MB left by an interrupted preparation (pid {pid}" in line and
               line.endswith("gone); removed") for line in lines)


def test_a_live_writers_folder_is_left_alone(tmp_path):
    mine = _leftover(tmp_path, "d", os.getpid())
    elsewhere = _leftover(tmp_path, "d", _dead_pid(), host="another-node.example")
    lines = clean_leftovers(tmp_path)
    assert mine.exists() and elsewhere.exists()
    assert [line.endswith("still running; left alone") for line in lines] == [True, True]
    assert any(f"pid {os.getpid()} on {HOST}," in line for line in lines)


def test_a_reused_pid_is_not_taken_for_the_writer(tmp_path):
    # The folder was last written before this process started: its writer was another one.
    folder = _leftover(tmp_path, "d", os.getpid())
    an_hour_ago = time.time() - 3600
    os.utime(folder, (an_hour_ago, an_hour_ago))
    (line,) = clean_leftovers(tmp_path, "d")
    assert line.endswith("gone); removed") and not folder.exists()


def test_folders_that_only_look_alike_are_not_leftovers(tmp_path):
    for name in (".d.tmp-notes", "d.tmp-123-0123abcd", ".d.tmp-123-xyz"):
        (tmp_path / name).mkdir()
    (tmp_path / ".d.tmp-1-0123abcd").write_text("a file, not a folder")
    assert leftovers(tmp_path) == [] and clean_leftovers(tmp_path) == []
    assert len(list(tmp_path.iterdir())) == 4
