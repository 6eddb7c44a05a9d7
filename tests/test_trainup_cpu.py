"""trainup_cpu.py as a user runs it: real processes, real gloo DDP, real exit codes."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, run_script
from kosmoss.run.config import RunConfig, validate

CONTRACT = {"world_size", "num_nodes", "devices_per_node", "accelerator", "strategy", "backend",
            "global_batch_size", "per_device_batch_size", "base_lr", "lr", "lr_rule",
            "global_step", "train_samples_per_s", "val_loss", "test_loss", "params",
            "warnings", "run_dir", "seed"}


def _snapshot(home):
    return sorted((str(p.relative_to(home)), p.stat().st_mtime_ns)
                  for p in home.rglob("*")) if home.exists() else []


@pytest.mark.slow
def test_two_process_gloo_ddp(shared_home, tmp_path):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_cpu.py", "--num-processes", "2", "--dataset", "tiny",
                       "--max-epochs", "2", "--batch-size", "128", "--scale-lr", "linear",
                       "--no-progress", "--result-json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert CONTRACT <= set(result)
    assert (result["world_size"], result["strategy"], result["backend"]) == (2, "ddp", "gloo")
    assert (result["global_batch_size"], result["per_device_batch_size"]) == (128, 64)
    assert result["lr"] == pytest.approx(2 * result["base_lr"])
    assert len(result["replica_checksums"]) == 2 and result["replicas_identical"]
    assert result["global_step"] == 2 * (1638 // 128 + 1)
    assert result["train_samples_per_s"] > 0 and result["test_loss"] < result["mean_baseline_loss"]
    assert proc.stdout.count("per-device batch") == 1  # the arithmetic, printed once
    run_dir = shared_home / "runs" / result["run_id"]
    assert json.loads((run_dir / "result.json").read_text())["run_id"] == result["run_id"]
    assert (run_dir / "csv" / "metrics.csv").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_same_seed_same_test_loss(shared_home, tmp_path):
    losses = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "levels10"),
                           "--max-steps", "6", "--batch-size", "64", "--no-progress",
                           "--result-json", str(out)], shared_home)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses.append(json.loads(out.read_text())["test_loss"])
    assert losses[0] == losses[1]


@pytest.mark.slow
def test_module_cli_trains_too(shared_home, tmp_path):
    out = tmp_path / "r.json"
    proc = run_script(["-m", "kosmoss", "train", "--dataset", "tiny", "--max-steps", "2",
                       "--no-progress", "--result-json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["global_step"] == 2


def _corrupted_copy(shared_home, tmp_path):
    copy = tmp_path / "corrupt"
    shutil.copytree(shared_home / "data" / "levels10", copy)
    shard = copy / "x_00002.npy"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    return copy


def _half_written(shared_home, tmp_path):
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "x_00000.npy").write_bytes(b"\x93NUMPY")
    return folder


@pytest.mark.parametrize("args, names", [
    (["--batch-size", "255", "--num-processes", "2"], "--batch-size 255"),
    (["--batch-size", "1", "--num-processes", "2"], "--batch-size 1"),
    (["--lr", "0"], "--lr"),
    (["--lr", "-0.1"], "--lr"),
    (["--num-processes", "0"], "--num-processes 0"),
    (["--dataset", "nope"], "--dataset nope"),
    (["--scale-lr", "cubic"], "--scale-lr"),
    (["--max-epochs", "0"], "--max-epochs"),
    (["--warmup-steps", "-5"], "--warmup-steps -5"),
    (["--resume", "no-such-run", "--dataset", "tiny"], "--resume no-such-run: no such run"),
    (["--batch-size", "100000", "--dataset", "tiny"], "--batch-size 100000"),
    ([_half_written], "metadata.json"),
    ([_corrupted_copy], "checksum does not match"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, names, shared_home, tmp_path):
    args = [a for arg in args
            for a in (["--dataset", str(arg(shared_home, tmp_path))] if callable(arg) else [arg])]
    before = _snapshot(shared_home)
    proc = run_script(["trainup_cpu.py", *args], shared_home, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert _snapshot(shared_home) == before


def test_more_processes_than_cores_is_a_warning(monkeypatch):
    monkeypatch.setattr("kosmoss.run.config.available_cores", lambda: 2)
    warnings = validate(RunConfig(num_processes=3))
    assert len(warnings) == 1 and "more than the 2 CPU cores" in warnings[0]
    assert validate(RunConfig(num_processes=2)) == ()


def _start_and_signal(home, sig, args, wait_s=12):
    """Start trainup_cpu.py, let it train, send ``sig`` to the launching process."""
    env = {**os.environ, "KOSMOSS_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "trainup_cpu.py", "--dataset", "tiny",
                             "--no-progress", "--batch-size", "64", "--max-epochs", "100000",
                             *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(wait_s)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_and_resume_continues(shared_home, tmp_path):
    first = tmp_path / "first.json"
    code, out, err = _start_and_signal(shared_home, signal.SIGTERM, [
        "--num-processes", "2", "--max-steps", "100000", "--result-json", str(first)])
    assert code == 0, err[-3000:]
    stopped = json.loads(first.read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["global_step"] > 0
    assert stopped["replicas_identical"] and stopped["test_loss"] is None
    assert "continue with --resume" in out
    run_dir = Path(stopped["run_dir"])
    assert (run_dir / "checkpoints" / "preempted.ckpt").is_file()
    then = tmp_path / "then.json"
    target = stopped["global_step"] + 10
    proc = run_script(["trainup_cpu.py", "--dataset", "tiny", "--no-progress", "--num-processes",
                       "2", "--batch-size", "64", "--max-epochs", "100000", "--max-steps",
                       str(target), "--resume", stopped["run_id"], "--result-json", str(then)],
                      shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads(then.read_text())
    assert resumed["resumed_from_step"] == stopped["global_step"]
    assert resumed["global_step"] == target and resumed["run_dir"] == str(run_dir)
    assert resumed["stopped_by"] is None and resumed["test_loss"] is not None


@pytest.mark.slow
def test_sigusr1_stops_a_single_process_run(shared_home, tmp_path):
    out_file = tmp_path / "r.json"
    code, _, err = _start_and_signal(shared_home, signal.SIGUSR1, [
        "--max-steps", "100000", "--result-json", str(out_file)], wait_s=8)
    assert code == 0, err[-3000:]
    assert json.loads(out_file.read_text())["stopped_by"] == "SIGUSR1"
