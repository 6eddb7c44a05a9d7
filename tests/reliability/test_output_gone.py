"""Standard output that cannot take a run's lines. Before the run starts (``> /dev/full``,
``| head -3`` read out): bad input, one line, exit 2, nothing run. Once it trains, a reader
that goes away (a launcher that ended, as horovodrun's middlemen then send SIGTERM; a
pipe's reader that left) leaves the run to end as it would, recorded so: rich's answer to
a broken pipe, SystemExit(1), had ended a fit mid-epoch from the progress bar and recorded
a run that stopped cleanly, its checkpoint saved, as failed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from fault_helpers import LEAKED, trained, wait_for
from helpers import REPO

ARGS = ["--dataset", "tiny", "--batch-size", "64", "--hidden", "16", "--max-epochs", "100"]


def _env(home):
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for name in LEAKED:
        env.pop(name, None)
    return env


def test_standard_output_that_takes_nothing_is_one_line_and_exit_2(shared_home, tmp_path):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "trainup_cpu.py", *ARGS, "--max-steps", "3"],
                              cwd=REPO, env=_env(home), stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        "trainup_cpu.py: error: standard output cannot be written (No space left on device): "
        "send it to a terminal or a file that takes it"]
    assert not (home / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("processes, stop", [("1", None), ("2", signal.SIGTERM)],
                         ids=["1 process finishes, progress bar on", "2 processes stopped"])
def test_a_run_whose_reader_leaves_ends_as_it_would(processes, stop, shared_home, tmp_path):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    extra = ["--num-processes", processes] + (["--no-progress"] if stop else [])
    launcher = subprocess.Popen([sys.executable, "trainup_cpu.py", *ARGS, "--max-steps", "1500",
                                 *extra], cwd=REPO, env=_env(home), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: trained(home, int(processes), 60), "step 60")
        launcher.stdout.close()  # the reader goes away
        if stop:
            launcher.send_signal(stop)
        _, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    (run_dir,) = (home / "runs").iterdir()
    run = json.loads((run_dir / "run.json").read_text())
    result = json.loads((run_dir / "result.json").read_text())
    if stop:
        assert (launcher.returncode, run["state"], result["stopped_by"]) == \
            (0, "stopped", "SIGTERM"), err[-3000:]
        assert (run_dir / "checkpoints" / "preempted.ckpt").is_file()
    else:
        assert (launcher.returncode, run["state"], result["global_step"]) == \
            (0, "finished", 1500), err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("command", [["env"], ["ghosts"], ["check", "--list"], ["data", "info"],
                                     ["hosts", "status"]])
def test_any_command_whose_output_cannot_be_written_says_so_in_one_line(command, tmp_path):
    """Every command's output goes through sys.stdout; its failure is told from that of a
    file the command reads (which stays the command's own error)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "kosmoss", *command], cwd=REPO,
                              env=_env(tmp_path / "home"), stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"kosmoss {command[0]}: error: standard output cannot be written (No space left on "
        "device): send it to a terminal or a file that takes it"]


@pytest.mark.parametrize("command", [["-m", "kosmoss", "env"],
                                     ["trainup_cpu.py", *ARGS, "--max-steps", "3"]],
                         ids=["kosmoss env", "trainup_cpu.py, progress bar on"])
def test_a_closed_standard_output_is_no_error(command, shared_home, tmp_path):
    """Started with stdout closed (`>&-`): Python's sys.stdout is None and print() writes
    nothing; the watch and the progress bar's file must not turn that into a traceback."""
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    done = subprocess.run([sys.executable, *command], cwd=REPO, env=_env(home),
                          stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
