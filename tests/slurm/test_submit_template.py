"""slurm/submit.sbatch on a real one-node Slurm, 2 tasks on CPU."""
import csv
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from reliability.fault_helpers import wait_for


@pytest.mark.slow
def test_template_trains_with_two_srun_tasks(slurm, shared_home, tmp_path):
    env = {**slurm, "KOSMOSS_HOME": str(shared_home), "KOSMOSS_PYTHON": sys.executable}
    out = tmp_path / "result.json"
    proc = subprocess.run(
        ["sbatch", "--wait", "--parsable", "--chdir", str(REPO), "--output",
         str(tmp_path / "job-%j.out"), "slurm/submit.sbatch", "--dataset", "tiny",
         "--max-epochs", "1", "--no-progress", "--result-json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    job = proc.stdout.strip().split(";")[0]
    log = next(tmp_path.glob("job-*.out"), None)
    assert proc.returncode == 0, (proc.stderr, log.read_text()[-3000:] if log else "")
    result = json.loads(out.read_text())
    assert (result["launcher"], result["world_size"], result["devices_per_node"]) == ("slurm", 2, 2)
    assert result["run_id"] == f"slurm-{job}" and result["replicas_identical"]


@pytest.mark.slow
def test_srun_ntasks_without_per_node_is_a_one_line_error(slurm, shared_home):
    env = {**slurm, "KOSMOSS_HOME": str(shared_home)}
    proc = subprocess.run(["srun", "-n", "2", sys.executable, "trainup_cpu.py", "--dataset",
                           "tiny"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainup_cpu.py:")]
    # One line from each task that got to say it (srun may end the other task first).
    assert 1 <= len(errors) <= 2 and len(set(errors)) == 1, proc.stderr[-3000:]
    assert "ask for --ntasks-per-node" in errors[0] and "Traceback" not in proc.stderr


def _steps(run_dir):
    """The step of each rank's heartbeat (kosmoss.diagnose.heartbeat), once both write."""
    beats = sorted(run_dir.glob("heartbeats/rank-*.json"))
    try:
        return [json.loads(path.read_text())["step"] for path in beats] if len(beats) == 2 else []
    except ValueError:
        return []


def _job_state(job, env):
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                         text=True).stdout
    return next((w.split("=")[1] for w in out.split() if w.startswith("JobState=")), "")


def _node_state(env):
    return subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                          text=True).stdout.strip()


def _why(job, env, tmp_path):
    """What Slurm and the job said, for a failure message: the job's record, the end of its
    output and of slurmctld's log."""
    record = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                            text=True).stdout
    log = Path(env["SLURM_CONF"]).parent / "slurmctld.log"
    return "\n".join([record, (tmp_path / "job.out").read_text()[-3000:],
                      log.read_text()[-3000:] if log.is_file() else "no slurmctld.log"])


def _wait_for(job, env, states, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _job_state(job, env)
        if state in states:
            return state
        time.sleep(1)
    raise AssertionError(f"job {job} still {_job_state(job, env)}, expected {states}")


@pytest.mark.slow
def test_sigusr1_requeues_and_the_job_resumes_at_the_same_step(slurm, shared_home, tmp_path):
    env = {**slurm, "KOSMOSS_HOME": str(shared_home), "KOSMOSS_PYTHON": sys.executable}
    out = tmp_path / "result.json"
    job = subprocess.run(
        ["sbatch", "--parsable", "--chdir", str(REPO), "--output", str(tmp_path / "job.out"),
         "slurm/submit.sbatch", "--dataset", "tiny", "--batch-size", "64", "--max-epochs",
         "100000", "--max-steps", "2000", "--no-progress", "--result-json", str(out)],
        env=env, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    _wait_for(job, env, {"RUNNING"})
    run_dir = shared_home / "runs" / f"slurm-{job}"
    # Past the first epoch's end (26 steps): a validation before the stop.
    wait_for(lambda: _steps(run_dir) and min(_steps(run_dir)) >= 30, "30 steps on both tasks")
    subprocess.run(["scancel", "--signal", "USR1", job], env=env, check=True)
    _wait_for(job, env, {"PENDING"})  # requeued by kosmoss
    requeued_at = time.time()
    assert out.is_file(), (tmp_path / "job.out").read_text()[-3000:]
    stopped = json.loads(out.read_text())
    assert stopped["stopped_by"] == "SIGUSR1" and stopped["global_step"] > 0
    # Slurm holds a requeued job ~2 minutes before it is eligible; the test does not wait
    # that long, only until the node has ended the first attempt and a new second has
    # begun: slurmd revokes the first credential at the requeue and refuses any credential
    # of that job created in the same whole second (slurm_cred.c: `cred->ctime <= revoked`),
    # so a restart in that second is killed ("Job credential revoked") and ends FAILED.
    wait_for(lambda: _node_state(env) == "idle", "the node to end the first attempt")
    time.sleep(max(0.0, math.floor(requeued_at) + 1.5 - time.time()))
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True)
    assert _wait_for(job, env, {"COMPLETED", "FAILED"}) == "COMPLETED", _why(job, env, tmp_path)
    resumed = json.loads(out.read_text())
    assert resumed["run_id"] == f"slurm-{job}" and resumed["stopped_by"] is None
    assert resumed["resumed_from_step"] == resumed["trained_from_step"] == stopped["global_step"]
    assert resumed["global_step"] == 2000
    # The requeued job trained only the remaining steps: metrics.csv goes on, no step twice
    # (a job that started over would validate at step 26 again).
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row["val_loss"]]
    assert steps == sorted(set(steps)) and steps[0] <= stopped["global_step"] < steps[-1], steps
