"""trainup_cpu.py as a user runs it: real processes, real gloo DDP, real exit codes."""
import csv
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from helpers import run_script
from reliability.fault_helpers import end_all, start, stderr_of, trained, wait_for
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
    # Lightning gives each rank cores / ranks threads, unless OMP_NUM_THREADS says how many
    cores_each = max(1, len(os.sched_getaffinity(0)) // 2)
    assert result["torch_threads"] == int(os.environ.get("OMP_NUM_THREADS", cores_each))
    assert result["global_step"] == 2 * (1638 // 128 + 1)
    assert result["train_samples_per_s"] > 0 and result["test_loss"] < result["mean_baseline_loss"]
    assert proc.stdout.count("per-device batch") == 1  # the arithmetic, printed once
    assert "deprecated" not in proc.stderr, proc.stderr[-3000:]  # e.g. DDP's broadcast_buffers
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
    result = json.loads(out.read_text())
    assert result["global_step"] == 2
    # Stopped before the first validation: last.ckpt, and no warning about a missing val_loss.
    assert (Path(result["run_dir"]) / "checkpoints" / "last.ckpt").is_file()
    assert "could not find the monitored key" not in proc.stderr


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
    (["--hidden", "100000000", "--dataset", "tiny"],
     "--hidden 100000000: 468,100,000,552 parameters need about"),
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
    warnings = validate(RunConfig(num_processes=3, batch_size=255))
    assert len(warnings) == 1 and "more than the 2 CPU cores" in warnings[0]
    assert validate(RunConfig(num_processes=2)) == ()


def _stop_while_training(home, tiny, sig, args, step):
    """Start trainup_cpu.py, wait until every rank trained ``step`` steps (its heartbeat
    says so: no fixed sleep, so a loaded machine only makes it slower), send ``sig`` to the
    launching process."""
    ranks = int(args[args.index("--num-processes") + 1]) if "--num-processes" in args else 1
    launcher = start(home, tiny, *args)
    try:
        wait_for(lambda: trained(home, ranks, step), f"{step} steps on {ranks} rank(s)")
        launcher.send_signal(sig)
        return launcher.wait(timeout=120), stderr_of(home)
    finally:
        end_all(home, launcher)


def _logged_steps(run_dir, metric):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle) if row[metric]]


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_and_resume_continues(shared_home, tmp_path):
    home, tiny = tmp_path / "home", shared_home / "data" / "tiny"
    first = tmp_path / "first.json"
    # Past step 26, the end of the first epoch: a validation point before the stop.
    code, err = _stop_while_training(home, tiny, signal.SIGTERM, [
        "--num-processes", "2", "--max-steps", "100000", "--result-json", str(first)], step=30)
    assert code == 0, err[-3000:]
    assert "weights_only" not in err, err[-3000:]  # Lightning's line when the save leaves it unset
    stopped = json.loads(first.read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["global_step"] >= 30
    assert stopped["replicas_identical"] and stopped["test_loss"] is None
    assert "continue with --resume" in (home.parent / "home.out").read_text()
    run_dir, stop = Path(stopped["run_dir"]), stopped["global_step"]
    assert (run_dir / "checkpoints" / "preempted.ckpt").is_file()
    then, target = tmp_path / "then.json", stop + 30  # past at least one more epoch's end
    # A bare --resume: world size, batch, epochs... come from the stopped run's record.
    proc = run_script(["trainup_cpu.py", "--resume", stopped["run_id"], "--max-steps",
                       str(target), "--result-json", str(then)], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads(then.read_text())
    assert (resumed["world_size"], resumed["global_batch_size"]) == (2, 64)
    assert resumed["resumed_from_step"] == stop and resumed["run_dir"] == str(run_dir)
    assert resumed["trained_from_step"] == stop  # the trainer began there, not at step 0
    assert resumed["global_step"] == target
    assert resumed["stopped_by"] is None and resumed["test_loss"] is not None
    # It trained only the remaining steps: what was logged before the stop is kept and no
    # step is logged twice (a resume that started over would validate at step 25 again).
    steps = _logged_steps(run_dir, "val_loss")
    assert steps == sorted(set(steps)) and steps[0] <= stop < steps[-1], steps
    curve = [point["step"] for point in resumed["val_curve"]]
    assert curve[0] <= stop < curve[-1] and curve == sorted(set(curve)), curve
    # ... and ends with the weights of a run never stopped.
    straight = tmp_path / "straight.json"
    proc = run_script(["trainup_cpu.py", "--dataset", str(tiny), "--no-progress",
                       "--num-processes", "2", "--batch-size", "64", "--max-epochs", "100000",
                       "--max-steps", str(target), "--result-json", str(straight)], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert resumed["replica_checksums"] == json.loads(straight.read_text())["replica_checksums"]


@pytest.mark.slow
def test_sigusr1_stops_a_single_process_run(shared_home, tmp_path):
    out_file = tmp_path / "r.json"
    code, err = _stop_while_training(tmp_path / "home", shared_home / "data" / "tiny",
                                     signal.SIGUSR1, ["--max-steps", "100000", "--result-json",
                                                      str(out_file)], step=1)
    assert code == 0, err[-3000:]
    assert json.loads(out_file.read_text())["stopped_by"] == "SIGUSR1"


def test_result_json_over_a_file_that_is_not_a_result_is_refused(shared_home, tmp_path):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("three years of work\n")
    proc = run_script(["trainup_cpu.py", "--dataset", "tiny", "--result-json", str(thesis)],
                      shared_home, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"--result-json {thesis}: exists and is not a kosmoss result.json" in lines[0]
    assert thesis.read_text() == "three years of work\n"
