"""``horovodrun -np 2 --gloo python trainup_gpu.py --strategy horovod`` on CPU: world size 2,
the same training as DDP, checkpoints that move between the two engines.

Four runs on the tiny preset, shared by the tests: A (Horovod) and B (DDP) train one epoch
from the same seed; C continues A's checkpoint under DDP, D continues B's under Horovod.
"""
import json
import math
import subprocess
import sys

import pytest
import torch

from helpers import REPO, run_script
from hvdrun import clean_env, horovodrun

pytestmark = pytest.mark.slow
TINY = ["--dataset", "tiny", "--no-progress", "--seed", "7"]
# k = 256 / 128 = 2: an explicit linear rule, which Horovod must not scale a second time,
# reached by a warm-up (an LR scheduler, which must drive the wrapped optimizer).
LR_FLAGS = ["--lr", "0.001", "--scale-lr", "linear", "--base-batch-size", "128",
            "--warmup-steps", "3"]
STEPS_PER_EPOCH = 7  # tiny: 1,638 training samples in global batches of 256


def _checked(proc, out):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {**json.loads(out.read_text()), "stdout": proc.stdout, "stderr": proc.stderr}


def _optimizer_lr(run_dir) -> float:
    checkpoint = torch.load(f"{run_dir}/checkpoints/last.ckpt", map_location="cpu",
                            weights_only=False)
    return checkpoint["optimizer_states"][0]["param_groups"][0]["lr"]


@pytest.fixture(scope="module")
def runs(horovod_ready, shared_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("horovodrun")
    gpu = ["trainup_gpu.py", *TINY, *LR_FLAGS]
    a = _checked(horovodrun([*gpu, "--strategy", "horovod", "--max-epochs", "1",
                             "--result-json", out / "a.json"], shared_home), out / "a.json")
    a["optimizer_lr"] = _optimizer_lr(a["run_dir"])  # before C overwrites last.ckpt
    b = _checked(run_script([*gpu, "--strategy", "ddp", "--gpus", "2", "--max-epochs", "1",
                             "--result-json", str(out / "b.json")], shared_home), out / "b.json")
    c = _checked(run_script([*gpu, "--strategy", "ddp", "--gpus", "2", "--max-epochs", "2",
                             "--resume", a["run_id"], "--result-json", str(out / "c.json")],
                            shared_home), out / "c.json")
    d = _checked(horovodrun([*gpu, "--strategy", "horovod", "--max-epochs", "2", "--resume",
                             b["run_id"], "--result-json", out / "d.json"], shared_home),
                 out / "d.json")
    return {"a": a, "b": b, "c": c, "d": d}


def test_two_ranks_train_under_horovodrun(runs):
    a = runs["a"]
    assert (a["world_size"], a["num_nodes"], a["devices_per_node"]) == (2, 1, 2)
    assert (a["launcher"], a["strategy"], a["backend"]) == ("horovodrun", "horovod", "horovod")
    assert a["global_step"] == STEPS_PER_EPOCH and math.isfinite(a["test_loss"])
    assert a["replicas_identical"] and len(a["replica_checksums"]) == 2
    assert a["stdout"].count("per-device batch") == 1  # rank 0 alone prints
    assert "backend: horovod: gloo" in a["stdout"]


def test_learning_rate_follows_the_explicit_rule_only(runs):
    a = runs["a"]
    assert (a["lr_rule"], a["base_lr"], a["lr"]) == ("linear", 0.001, 0.002)
    assert "= 0.002" in a["stdout"]
    # Lightning 1.9's HorovodStrategy multiplied the rate by the world size again (0.004).
    assert a["optimizer_lr"] == pytest.approx(0.002)
    assert "optimizer.step()" not in a["stderr"]  # torch's scheduler-order warnings


def test_horovod_trains_like_ddp(runs):
    a, b = runs["a"], runs["b"]
    assert b["strategy"] == "ddp" and b["global_step"] == a["global_step"]
    # Same seed, same shards per rank, gradients averaged either way: equal up to rounding.
    for score in ("val_loss", "test_loss", "test_rmse_wm2"):
        assert a[score] == pytest.approx(b[score], rel=1e-4), score


def test_checkpoints_move_between_engines(runs):
    c, d = runs["c"], runs["d"]
    for resumed, engine in ((c, "ddp"), (d, "horovod")):
        assert resumed["strategy"] == engine and resumed["world_size"] == 2
        assert resumed["resumed_from"].endswith("last.ckpt")
        # The trainer began at the checkpoint's step, not at 0.
        assert resumed["resumed_from_step"] == resumed["trained_from_step"] == STEPS_PER_EPOCH
        assert resumed["global_step"] == 2 * STEPS_PER_EPOCH
        assert resumed["replicas_identical"]
    assert c["run_id"] == runs["a"]["run_id"] and d["run_id"] == runs["b"]["run_id"]
    # Horovod then DDP, or DDP then Horovod: the same second epoch from the same weights.
    assert c["test_loss"] == pytest.approx(d["test_loss"], rel=1e-4)
    assert c["test_loss"] < runs["a"]["test_loss"]


def test_one_process_runs_horovod_of_size_one(horovod_ready, shared_home, tmp_path):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_gpu.py", "--strategy", "horovod", *TINY, "--max-steps", "2",
                       "--result-json", str(out)], shared_home)
    result = _checked(proc, out)
    assert (result["world_size"], result["strategy"], result["backend"]) == (1, "horovod", "horovod")
    assert result["global_step"] == 2 and math.isfinite(result["test_loss"])


def test_many_processes_outside_horovodrun_is_one_line(horovod_ready, tmp_path):
    proc = run_script(["trainup_gpu.py", "--strategy", "horovod", "--gpus", "2", *TINY],
                      tmp_path / "home")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "horovodrun -np 2 --gloo python trainup_gpu.py --strategy horovod" in proc.stderr
    assert not (tmp_path / "home" / "runs").exists()


def test_env_reports_horovod(horovod_ready, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kosmoss", "env", "--json"], cwd=REPO,
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["backends"]["horovod"] is True


def test_a_run_that_diverges_under_horovodrun_ends_every_rank_in_one_line(
        horovod_ready, shared_home, tmp_path):
    """Horovod's averaged gradients make the weights alike on every rank, as DDP's do: both
    ranks find them NaN at the same step and exit 1; rank 0 says it once."""
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    proc = horovodrun(["trainup_cpu.py", "--strategy", "horovod", "--dataset", "tiny",
                       "--no-progress", "--lr", "1e30", "--batch-size", "64"], home)
    said = [line for line in proc.stderr.splitlines() if "diverged:" in line]
    assert proc.returncode == 1 and len(said) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = (home / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["diverged"]["step"] == result["global_step"] and result["replicas_identical"]
    states = [json.loads(p.read_text())["state"] for p in (run_dir / "processes").iterdir()]
    assert states == ["failed", "failed"], states
