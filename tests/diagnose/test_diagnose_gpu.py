"""On a CUDA GPU (the GPU check; skipped elsewhere): ``watch`` shows a rank's GPU memory
through nvitop; a ghost rank says it still holds a CUDA context and how much; NCCL's flight
recorder, set up by ``flight_recorder_env``, dumps into the run directory. One GPU is
enough: the dump is asked for through the recorder's pipe (a timeout needs two GPUs, as
NCCL refuses two ranks on one)."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from diagnose_helpers import end_all, environment, wait_until
from helpers import REPO

from kosmoss import cli, ghosts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MARKED = REPO / "tests" / "ghosts" / "marked_process.py"
HOLD_MIB = 256


@pytest.fixture
def gpu_run(kosmoss_home, tmp_path):
    """A launcher and its spawned rank, the rank holding HOLD_MIB on the GPU."""
    run_dir = kosmoss_home / "runs" / "20260101-000000-gpu001"
    launcher = subprocess.Popen([sys.executable, str(MARKED), str(run_dir), "--spawn",
                                 "--child-cuda-mib", str(HOLD_MIB)], cwd=REPO,
                                env=environment(kosmoss_home),
                                stdout=(tmp_path / "log").open("ab"), stderr=subprocess.STDOUT)
    try:
        held = wait_until(lambda: list(run_dir.glob("cuda-*")), 120, "the rank's CUDA memory",
                          tmp_path / "log")
        yield run_dir, launcher, int(held[0].name.split("-")[1])
    finally:
        end_all(kosmoss_home, [launcher])


def _visible(pid: int) -> None:
    from kosmoss.diagnose.watch import gpu_processes

    listed = gpu_processes()
    if listed and pid not in listed:
        pytest.skip("NVML reports the host's pids, not this container's")


def test_watch_shows_the_gpu_memory_of_each_rank(gpu_run, capsys):
    run_dir, launcher, rank = gpu_run
    _visible(rank)
    assert cli.main(["watch", run_dir.name, "--once", "--json"]) == 0
    views = {v["pid"]: v for v in json.loads(capsys.readouterr().out)["ranks"]}
    assert views[rank]["gpu_memory_bytes"] >= HOLD_MIB * 2**20
    assert views[launcher.pid]["gpu_memory_bytes"] is None  # holds nothing on the GPU


def test_an_orphaned_rank_says_it_holds_a_cuda_context(gpu_run):
    run_dir, launcher, rank = gpu_run
    _visible(rank)
    launcher.kill()
    launcher.wait()
    (ghost,) = [g for g in ghosts.find_ghosts() if g.pid == rank]
    assert ghost.kind == "launcher-gone" and ghost.gpu_memory_bytes >= HOLD_MIB * 2**20
    (cause,) = [c for c in ghost.causes if "CUDA context" in c]
    assert cause.startswith(f"orphaned rank (its parent, pid {launcher.pid}, is gone) still "
                            "holding a CUDA context") and "on GPU" in cause


NCCL_RANK = textwrap.dedent("""
    import os, sys, time, datetime
    import torch, torch.distributed as dist
    from pathlib import Path
    from kosmoss.diagnose.hang import flight_recorder_env

    run_dir = Path(sys.argv[1])
    os.environ.update(flight_recorder_env(run_dir), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=sys.argv[2])
    dist.init_process_group("nccl", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    x = torch.ones(4, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    (run_dir / "reduced").touch()
    time.sleep(120)
""")


def test_nccl_flight_recorder_dumps_into_the_run_directory(tmp_path, kosmoss_home):
    from kosmoss.launch.ports import free_port

    run_dir = kosmoss_home / "runs" / "20260101-000000-nccl01"
    run_dir.mkdir(parents=True)
    log = tmp_path / "log"
    rank = subprocess.Popen([sys.executable, "-c", NCCL_RANK, str(run_dir), str(free_port())],
                            cwd=REPO, env=environment(kosmoss_home), stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)
    try:
        wait_until((run_dir / "reduced").exists, 120, "three all_reduce on NCCL", log)
        pipe = run_dir / "flight-recorder" / "dump-now-0.pipe"
        wait_until(pipe.exists, 30, "the recorder's pipe", log)
        with open(pipe, "w") as trigger:  # what a user does to dump a hanging run
            trigger.write("1")
        dump = run_dir / "flight-recorder" / "rank-0"
        wait_until(lambda: dump.exists() and dump.stat().st_size > 0, 60, "the dump", log)
        entries = pickle.loads(dump.read_bytes())["entries"]
        assert sum("all_reduce" in e["profiling_name"] for e in entries) >= 3
    finally:
        rank.kill()
        rank.wait()
