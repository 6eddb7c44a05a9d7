"""Signals from outside, as Slurm and a user send them, timed by the heartbeat (never a fixed
sleep): the run is set up so that wherever the signal lands, the stop is on an epoch's end
(one loop step an epoch), the boundary Lightning resumed one epoch late. One process with
K = 8 (a SIGTERM, then a SIGKILL of the resumed attempt), and 3 DDP ranks.
Each ends with the straight run's weights, metrics.csv rows and validation curve."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from fault_helpers import LEAKED, end_all, exit_code, heartbeat_steps, trained, wait_for
from helpers import REPO
from stops import Finished, batches_per_epoch, compare, run_script

from kosmoss.data.loading import split_indices
from kosmoss.data.splits import SPLITS
from kosmoss.data.store import open_dataset

pytestmark = pytest.mark.slow


def _straight(home, args):
    done = run_script(home, args)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    return Finished.of(run_dir)


def _signal_when(home, args, sig, ranks, step, resume=None):
    """trainup_cpu.py (or a --resume of it); ``sig`` once every rank's heartbeat says
    ``step``; its exit code."""
    launcher = _launch(home, args + (["--resume", resume] if resume else []))
    try:
        wait_for(lambda: trained(home, ranks, step), f"step {step} on {ranks} rank(s)")
        launcher.send_signal(sig)
        return exit_code(home, launcher, timeout=300)
    finally:
        end_all(home, launcher)


def _launch(home, args):
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for name in LEAKED:
        env.pop(name, None)
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "trainup_cpu.py", "--no-progress", *args],
                            cwd=REPO, env=env, stdout=open(home.parent / f"{home.name}.out", "a"),
                            stderr=open(home.parent / f"{home.name}.err", "a"))


def test_sigterm_on_an_epochs_end_then_sigkill_resume_exactly_with_k8(shared_home, tmp_path):
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 256)  # 7 batches: one chunk of K = 8 an epoch
    args = ["--dataset", str(tiny), "--batch-size", "256", "--hidden", "16", "--max-epochs",
            "100000", "--max-steps", str(250 * epoch), "--steps-per-execution", "8"]
    straight = _straight(tmp_path / "straight", args)
    home = tmp_path / "home"
    assert _signal_when(home, args, signal.SIGTERM, 1, 2 * epoch) == 0
    (run_dir,) = (home / "runs").iterdir()
    stopped = json.loads((run_dir / "result.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM", stopped
    stop = stopped["global_step"]
    assert stop % epoch == 0  # the boundary that resumed one epoch late
    code = _signal_when(home, [], signal.SIGKILL, 1, stop + 2 * epoch, resume=run_dir.name)
    assert code == -signal.SIGKILL
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["resumed_from_step"] >= stop
    assert compare(finished, straight) is None, compare(finished, straight)


def test_three_ranks_stopped_on_an_epochs_end_resume_exactly(shared_home, tmp_path):
    tiny = shared_home / "data" / "tiny"
    train = len(split_indices(open_dataset(tiny, verify=False).n_samples, SPLITS, 42)[0])
    batch = train - train % 3  # one step an epoch: every stop lands on an epoch's end
    assert batches_per_epoch(tiny, batch, world_size=3) == 1
    args = ["--dataset", str(tiny), "--num-processes", "3", "--batch-size", str(batch),
            "--hidden", "16", "--max-epochs", "100000", "--max-steps", "100"]
    straight = _straight(tmp_path / "straight", args)
    home = tmp_path / "home"
    assert _signal_when(home, args, signal.SIGTERM, 3, 3) == 0
    (run_dir,) = (home / "runs").iterdir()
    stopped = json.loads((run_dir / "result.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["replicas_identical"]
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["resumed_from_step"] == stopped["global_step"]
    assert compare(finished, straight) is None, compare(finished, straight)
    assert np.isfinite(finished.result["val_loss"]) and max(heartbeat_steps(home).values()) \
        == 100
