"""On a CUDA GPU (the GPU machine; skipped elsewhere): GPU memory holders are found through
nvitop, kosmoss ghosts and foreign processes alike; ending them gives the memory back; and
``kosmoss.release_memory()`` hands PyTorch's cache back to the driver."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch
from ghost_helpers import alive, end_all, start, wait_until
from helpers import RandomSource

import kosmoss
from kosmoss import cli, ghosts
from kosmoss.data.store import prepare
from kosmoss.launch import records
from kosmoss.launch.ports import port_is_free

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
HOLD = 512 * 2**20
HOLDER = (f"import time, torch; x = torch.empty({HOLD}, dtype=torch.uint8, device='cuda'); "
          "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(300)")


def _used() -> int:
    from nvitop import Device

    return sum(device.memory_used() for device in Device.all())


def _gpu_entry(pid):
    listed = ghosts.find_ghosts()
    if listed and all("not visible here" in g.reason for g in listed):
        pytest.skip("NVML reports the host's pids, not this container's")
    return {g.pid: g for g in listed}.get(pid)


def test_a_foreign_gpu_holder_is_listed_and_ended_only_when_named(kosmoss_home):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        found = wait_until(lambda: _gpu_entry(holder.pid), 10, "nvitop to list the holder")
        assert (found.kind, found.run_id, found.killable) == ("gpu-memory", None, False)
        assert found.gpu_memory_bytes >= HOLD and "--pid" in found.reason
        before = _used()
        assert cli.main(["ghosts", "--kill"]) == 0 and alive(holder.pid)
        report = ghosts.end_ghosts(ghosts.find_ghosts(pids=[holder.pid]), grace=2)
        assert report.ended == [holder.pid] and report.gpu_memory_freed_bytes >= HOLD
        wait_until(lambda: before - _used() >= HOLD, 10, "the GPU memory to come back")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_killed_launcher_takes_its_gpu_ranks_and_their_memory_along(kosmoss_home, tmp_path):
    """kosmoss's own launches are orphan-proof on a GPU too (PR_SET_PDEATHSIG): SIGKILL of
    the launcher ends both node processes, their CUDA contexts go back to the driver and
    nothing is left for `kosmoss ghosts`. (A torchrun rank does outlive its agent: the
    ghost step of scripts/gpu_check.sh lists and ends one.)"""
    prepare(RandomSource(1024, levels=5), kosmoss_home / "data" / "random5", shard_size=256)
    log, started = tmp_path / "log.txt", []
    try:
        parent = start([sys.executable, "trainup_gpu.py", "--gpus", "1", "--num-nodes", "2",
                        "--dataset", "random5", "--max-epochs", "100000", "--batch-size", "64",
                        "--no-progress"], kosmoss_home, log)
        started.append(parent)
        on_gpu = lambda: [g for g in ghosts.find_ghosts() if g.gpu_memory_bytes]  # noqa: E731
        nodes = wait_until(lambda: len(on_gpu()) == 2 and on_gpu(), 150,
                           "two node processes on the GPU", log)
        assert all(g.kind == "gpu-memory" and not g.killable for g in nodes)  # a live run
        pids = sorted(g.pid for g in nodes)
        held = sum(g.gpu_memory_bytes for g in nodes)
        run_dir = next((kosmoss_home / "runs").iterdir())
        port = next(r["master_port"] for r in records.read_processes(run_dir) if r["master_port"])
        before = _used()
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not any(alive(pid) for pid in pids), 10,
                   "the node processes to end with their launcher", log)
        # NVML lists a dead process's context until the driver has torn it down.
        wait_until(lambda: not [g for g in ghosts.find_ghosts() if g.pid in pids], 10,
                   "NVML to stop listing the dead ranks", log)
        wait_until(lambda: before - _used() >= held // 2, 10, "their GPU memory to come back")
        wait_until(lambda: port_is_free(port), 10, "the rendezvous port to be free")
    finally:
        end_all(kosmoss_home, started)


def test_release_memory_hands_the_cache_back():
    block = torch.empty(HOLD, dtype=torch.uint8, device="cuda")
    del block  # freed by PyTorch, still reserved by its caching allocator
    assert torch.cuda.memory_reserved() >= HOLD
    freed = kosmoss.release_memory()
    assert freed["cuda"] and freed["cuda_reserved_before"] >= HOLD
    assert freed["cuda_freed"] >= HOLD
    assert freed["cuda_reserved_after"] == torch.cuda.memory_reserved()
