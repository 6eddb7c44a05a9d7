"""slurm/submit.sbatch on a real one-node Slurm, 2 tasks on CPU."""
import json
import subprocess
import sys

import pytest

from helpers import REPO


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
    assert len(errors) == 2 and "ask for --ntasks-per-node" in errors[0]
