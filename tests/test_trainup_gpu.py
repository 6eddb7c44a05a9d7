"""trainup_gpu.py on this CPU-only machine: simulated nodes, torchrun, failures, bad input."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import torch

from helpers import REPO, run_script

TINY = ["--dataset", "tiny", "--no-progress"]


def _processes_of(home):
    """Every live process whose environment points at this test's KOSMOSS_HOME."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KOSMOSS_HOME") == str(home):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


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
    assert not _processes_of(shared_home)


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


@pytest.mark.slow
def test_a_dead_node_ends_the_whole_run(shared_home):
    env = {**os.environ, "KOSMOSS_HOME": str(shared_home), "PYTHONUNBUFFERED": "1"}
    parent = subprocess.Popen([sys.executable, "trainup_gpu.py", "--gpus", "1", "--num-nodes",
                               "2", *TINY, "--max-epochs", "100000"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        nodes = []
        while len(nodes) < 2 and time.monotonic() < deadline:
            time.sleep(1)
            nodes = [p for p in psutil.Process(parent.pid).children()
                     if p.environ().get("NODE_RANK") is not None]
        assert len(nodes) == 2, "node processes did not start"
        time.sleep(8)  # let them meet and train
        victim = next(p for p in nodes if p.environ()["NODE_RANK"] == "1")
        victim.send_signal(signal.SIGKILL)
        start = time.monotonic()
        code = parent.wait(timeout=60)
        assert code == 1 and time.monotonic() - start < 60
        assert "a node process exited with code" in parent.stderr.read()
        time.sleep(0.5)
        assert not _processes_of(shared_home)
    finally:
        if parent.poll() is None:
            parent.kill()


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
def test_a_dead_rank_ends_a_single_node_run(shared_home):
    env = {**os.environ, "KOSMOSS_HOME": str(shared_home)}
    parent = subprocess.Popen([sys.executable, "trainup_cpu.py", "--num-processes", "2", *TINY,
                               "--max-epochs", "100000"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, ranks = time.monotonic() + 120, []
        while not ranks and time.monotonic() < deadline:
            time.sleep(1)
            ranks = psutil.Process(parent.pid).children()
        assert ranks, "rank 1 did not start"
        time.sleep(8)
        ranks[0].send_signal(signal.SIGKILL)
        assert parent.wait(timeout=60) != 0
        time.sleep(0.5)
        assert not _processes_of(shared_home)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_bf16_mixed_runs_on_cpu_too(shared_home, tmp_path):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_gpu.py", *TINY, "--max-steps", "8", "--precision", "bf16-mixed",
                       "--result-json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["precision"], result["accelerator"]) == ("bf16-mixed", "cpu")
    assert result["gpu_memory_fraction"] is None and result["test_loss"] is not None
    # Autocast was really on: the first layer's output was bfloat16 (a forward hook saw it).
    assert result["activation_dtype"] == "bfloat16"
