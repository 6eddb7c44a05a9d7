"""Signals before training can checkpoint stop the run cleanly: one line, exit 128 + the
signal's number, run.json ``stopped``, nothing left running. (Signals during training:
tests/test_trainup_cpu.py, they checkpoint and resume bit for bit.)"""
import os
import signal
import time

import psutil
import pytest
from fault_helpers import (end_all, exit_code, processes_of, rank_1_started, records, run_dir,
                           start, stderr_of, trained, wait_for)

from kosmoss.launch import records as run_records


def _one_line(home, expected):
    err = stderr_of(home)
    lines = [line for line in err.splitlines() if line.startswith("trainup_cpu.py:")]
    assert len(lines) == 1 and expected in lines[0], err[-3000:]
    assert "Traceback" not in err, err[-3000:]


def _resume(process: psutil.Process) -> None:
    try:
        process.resume()
    except psutil.NoSuchProcess:
        pass  # it died with the launcher (PR_SET_PDEATHSIG), stopped or not


@pytest.mark.slow
def test_sigterm_while_the_ranks_meet_stops_the_run(shared_home, tmp_path):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-processes", "2")
    try:
        # Rank 1 held while the signal goes out: rank 0 cannot have met it, let alone
        # trained (on a quiet machine the meeting took less than this test's polling).
        rank_1 = wait_for(lambda: rank_1_started(launcher), "rank 1's process")
        rank_1.suspend()
        launcher.send_signal(signal.SIGTERM)
        _resume(rank_1)  # rank 0 may be waiting for it, with the signal not yet handled
        assert exit_code(home, launcher) == 128 + signal.SIGTERM, stderr_of(home)[-3000:]
        _one_line(home, "stopped by SIGTERM before a checkpoint could be saved")
        assert run_records.read_run(run_dir(home))["state"] == run_records.STOPPED
        assert {r["state"] for r in records(home)} == {run_records.STOPPED}  # rank 1 too
        wait_for(lambda: not processes_of(home), "the ranks to end", timeout=10)
    finally:
        end_all(home, launcher)


@pytest.mark.slow
def test_ctrl_c_is_recorded_stopped_with_exit_code_130(shared_home, tmp_path):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", new_session=True)
    try:
        wait_for(lambda: trained(home, ranks=1, step=1), "a trained step")
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        # (landing in a checkpoint's write too: tests/reliability/test_checkpoint_io.py)
        assert exit_code(home, launcher) == 128 + signal.SIGINT, stderr_of(home)[-3000:]
        _one_line(home, "stopped by SIGINT")
        record = run_records.read_run(run_dir(home))
        assert record["state"] == run_records.STOPPED, record
        wait_for(lambda: not processes_of(home), "the data workers to end", timeout=10)
    finally:
        end_all(home, launcher)


@pytest.mark.slow
@pytest.mark.parametrize("gap_s", [0.005, 0.05])
def test_ctrl_c_pressed_again_while_the_run_ends_changes_nothing(shared_home, tmp_path, gap_s):
    """A user presses Ctrl-C three times: the presses after the first came as a traceback
    from an exit handler, or cut the records short and killed the launcher by SIGINT."""
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", new_session=True)
    try:
        wait_for(lambda: trained(home, ranks=1, step=1), "a trained step")
        for _ in range(3):
            os.killpg(launcher.pid, signal.SIGINT)
            time.sleep(gap_s)
        assert exit_code(home, launcher) == 128 + signal.SIGINT, stderr_of(home)[-3000:]
        _one_line(home, "stopped by SIGINT")
        assert len(stderr_of(home).strip().splitlines()) == 1, stderr_of(home)[-3000:]
        assert run_records.read_run(run_dir(home))["state"] == run_records.STOPPED
        assert {r["state"] for r in records(home)} == {run_records.STOPPED}
    finally:
        end_all(home, launcher)
