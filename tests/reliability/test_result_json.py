"""--result-json must be a regular file or a new path: a device, a FIFO, a directory is one
line and exit 2 before torch is imported (reading /dev/full never ends, a FIFO blocks). A
result that cannot be written once the run has trained (a full disk) leaves the run
recorded finished, its result.json in the run folder, and one line that says where."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import REPO, small_tmpfs

ARGS = ["--dataset", "tiny", "--no-progress", "--hidden", "16", "--batch-size", "64",
        "--max-steps", "3"]


def _trainup(home, *args, timeout=300):
    env = {**os.environ, "KOSMOSS_HOME": str(home)}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "trainup_cpu.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - began


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null", "fifo", "directory", "link"])
def test_a_result_json_that_is_no_regular_file_is_refused_before_anything_runs(
        target, shared_home, tmp_path):
    path = {"fifo": tmp_path / "pipe", "directory": tmp_path, "link": tmp_path / "link"}.get(
        target, target)
    if target == "fifo":
        os.mkfifo(path)
    if target == "link":
        os.symlink("/dev/full", path)
    done, seconds = _trainup(shared_home, *ARGS, "--result-json", str(path), timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    why = "is a directory" if target == "directory" else "is not a regular file"
    assert lines[0].startswith(f"trainup_cpu.py: error: --result-json {path}: {why}")
    assert seconds < 10  # refused before torch is imported (it hung or grew to 23 GB)


@pytest.mark.slow
def test_a_result_that_cannot_be_written_after_training_is_one_line_and_the_run_is_kept(
        shared_home, tmp_path):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    with small_tmpfs(tmp_path / "full", full=True) as full:
        done, _ = _trainup(home, *ARGS, "--result-json", str(full / "result.json"))
    lines = [line for line in done.stderr.splitlines() if line.startswith("trainup_cpu.py")]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, \
        done.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    assert f"run {run_dir.name} trained, but {full / 'result.json'} could not be written (No " \
           f"space left on device): the result is in {run_dir / 'result.json'}" in lines[0]
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    assert json.loads((run_dir / "result.json").read_text())["global_step"] == 3
