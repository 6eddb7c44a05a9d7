"""trainup_gpu.py on this CPU-only machine: simulated nodes, torchrun, failures, bad input."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from helpers import REPO, run_script
from reliability.fault_helpers import (end_all, processes_of, run_dir, start, stderr_of, trained,
                                       wait_for)

TINY = ["--dataset", "tiny", "--no-progress"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_used_by_command_on_cpu_simulates_two_nodes(shared_home, tmp_path):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_gpu.py", "--strategy", "ddp", "--gpus", "1", "--num-nodes", "2",
                       *TINY, "--max-epochs", "1", "--result-json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["world_size"], result["num_nodes"], result["devices_per_node"]) == (2, 2, 1)
    # The global batch counts every node's ranks: a mutant that forgets the nodes fails here.
    assert (result["global_batch_size"], result["per_device_batch_size"]) == (256, 128)
    assert result["split_sizes"]["train"] // 256 + 1 == result["global_step"]
    assert (result["accelerator"], result["backend"]) == ("cpu", "gloo")
    assert any("GPU" in warning for warning in result["warnings"])
    assert result["replicas_identical"] and len(result["replica_checksums"]) == 2
    assert proc.stdout.count("simulating 2 nodes on this host") == 1
    assert proc.stdout.count("per-device batch") == 1
    assert not processes_of(shared_home)


@pytest.mark.slow
def test_torchrun_sets_the_world_size(shared_home, tmp_path):
    out = tmp_path / "result.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2"]
    env = {**os.environ, "KOSMOSS_HOME": str(shared_home)}
    proc = subprocess.run([*torchrun, "trainup_cpu.py", *TINY, "--max-steps", "3",
                           "--result-json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["world_size"], result["launcher"], result["devices_per_node"]) == \
        (2, "torchrun", 2)
    assert result["replicas_identical"]
    clash = subprocess.run([*torchrun, "trainup_cpu.py", *TINY, "--num-processes", "3"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert clash.returncode != 0
    assert "--num-processes 3 contradicts torchrun's --nproc_per_node 2" in clash.stderr


def _kill_rank_1_while_training(home, tiny, *args, script="trainup_cpu.py"):
    """Start a 2-rank run, wait until both ranks trained (their heartbeats), SIGKILL the
    process of global rank 1; return the launcher's exit code and stderr, and the victim."""
    launcher = start(home, tiny, *args, script=script)
    try:
        wait_for(lambda: trained(home, ranks=2, step=1), "both ranks to train a step")
        victim = json.loads((run_dir(home) / "heartbeats" / "rank-1.json").read_text())["pid"]
        os.kill(victim, signal.SIGKILL)
        code = launcher.wait(timeout=60)
        wait_for(lambda: not processes_of(home), "every process of the run to end", timeout=10)
        return code, stderr_of(home), victim
    finally:
        end_all(home, launcher)


@pytest.mark.slow
def test_a_dead_node_ends_the_whole_run(shared_home, tmp_path):
    code, err, victim = _kill_rank_1_while_training(
        tmp_path / "home", shared_home / "data" / "tiny", "--gpus", "1", "--num-nodes", "2",
        script="trainup_gpu.py")
    lines = [line for line in err.splitlines() if line.startswith("trainup_gpu.py:")]
    assert code == 1 and len(lines) == 1, err[-3000:]
    # The node that died and how, not the exit code of the node that noticed.
    assert f"failed: node 1 (pid {victim}) was killed by SIGKILL; the other nodes were ended" \
        in lines[0]


@pytest.mark.parametrize("args, names", [
    (["--gpus", "0"], "--gpus 0"),
    (["--num-nodes", "0"], "--num-nodes 0"),
    (["--gpus", "2", "--gpu-ids", "0"], "--gpu-ids 0 names 1 GPU(s) but 2 processes per node"),
    (["--gpu-ids", "1,1"], "--gpu-ids 1,1"),
    (["--gpu-ids", "a,b"], "--gpu-ids"),
    (["--strategy", "fsdp"], "--strategy"),
    (["--precision", "16"], "--precision"),
    (["--batch-size", "255", "--gpus", "1", "--num-nodes", "2"], "--batch-size 255"),
])
def test_bad_input_is_one_line_exit_2(args, names, shared_home):
    proc = run_script(["trainup_gpu.py", *TINY, *args], shared_home, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and names in lines[0], proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_require_gpu_without_a_gpu(shared_home):
    proc = run_script(["trainup_gpu.py", *TINY, "--require-gpu"], shared_home, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--require-gpu" in lines[0], proc.stderr


@pytest.mark.parametrize("script, args", [
    ("trainup_gpu.py", ["--gpus", "1", "--num-nodes", "2"]),
    ("trainup_cpu.py", ["--num-processes", "2"]),
])
def test_busy_master_port_names_its_holder(script, args, shared_home):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = run_script([script, *TINY, *args], shared_home, timeout=120,
                          env_extra={"MASTER_PORT": str(port)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"MASTER_PORT {port} is busy, held by pid {os.getpid()}" in lines[0]


@pytest.mark.slow
def test_a_dead_rank_ends_a_single_node_run_with_one_line(shared_home, tmp_path):
    code, err, victim = _kill_rank_1_while_training(
        tmp_path / "home", shared_home / "data" / "tiny", "--num-processes", "2")
    lines = [line for line in err.splitlines() if line.startswith("trainup_cpu.py:")]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert f"failed: rank 1 (pid {victim}) was killed by SIGKILL" in lines[0]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_bf16_mixed_runs_on_cpu_too(shared_home, tmp_path):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_gpu.py", *TINY, "--max-steps", "8", "--precision", "bf16-mixed",
                       "--result-json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["precision"], result["accelerator"]) == ("bf16-mixed", "cpu")
    assert result["gpu_memory_fraction"] is None and result["test_loss"] is not None
    assert result["data_mode"] == "controlled"  # --mode auto on CPU: one tensor in RAM
    # Autocast was really on: the first layer's output was bfloat16 (a forward hook saw it).
    assert result["activation_dtype"] == "bfloat16"
