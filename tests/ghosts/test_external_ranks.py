"""Ranks started by torchrun, srun, horovodrun or mpirun carry the run's mark in their
environment (they exec themselves once with it, kosmoss.launch.records.mark_external_rank),
so ``kosmoss ghosts`` finds them from any KOSMOSS_HOME, and once their home is deleted;
decoys stay untouched. The torchrun case for real: its agent SIGKILLed, two ranks left."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest
from ghost_helpers import REPO, end_all, start, start_marked, wait_until

from kosmoss import cli, ghosts
from kosmoss.diagnose.runs import read_heartbeats
from kosmoss.launch import records

# A kosmoss entry point (the mark is only set for one) that prints its pid and its mark as
# /proc has them: the environment other processes read.
PROBE = """
import json, os, sys
sys.argv[0] = "trainup_cpu.py"
from kosmoss.launch.records import mark_external_rank
mark_external_rank()
env = dict(p.split("=", 1) for p in open("/proc/self/environ").read().split("\\0") if "=" in p)
print(json.dumps([os.getpid(), env.get("KOSMOSS_RUN_ID"), env.get("KOSMOSS_RUN_LAUNCHER")]))
"""


def _probe(env: dict, script: str = PROBE):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("KOSMOSS_RUN_ID", "KOSMOSS_RUN_LAUNCHER", "TORCHELASTIC_RUN_ID",
                            "SLURM_PROCID", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    done = subprocess.run([sys.executable, "-c", script], env={**environ, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done


@pytest.mark.parametrize("env, run_id", [
    ({"SLURM_PROCID": "1", "SLURM_JOB_ID": "4242"}, "slurm-4242"),
    ({"SLURM_PROCID": "0", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}, "slurm-7_3"),
    ({"TORCHELASTIC_RUN_ID": "0123456789abcdef", "LOCAL_RANK": "1"}, "torchrun-0123456789ab"),
    ({"HOROVOD_RANK": "1"}, "horovodrun-"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "mpirun-"),
])
def test_an_external_launchers_rank_marks_itself_and_keeps_its_pid(env, run_id):
    (pid, mark_id, mark), done = _probe(env)
    assert mark_id.startswith(run_id), mark_id
    decoded = records.LauncherMark.decode(mark)
    assert decoded.run_id == mark_id and decoded.launcher.pid == os.getpid()  # its parent
    assert done.stdout.count("[") == 1  # the command ran once, to the end, after the exec


def test_nothing_is_marked_without_an_external_launcher_or_outside_an_entry_point():
    (_, mark_id, _), _ = _probe({})
    assert mark_id is None
    (_, mark_id, _), _ = _probe({"SLURM_PROCID": "0", "SLURM_JOB_ID": "1"},
                                PROBE.replace('sys.argv[0] = "trainup_cpu.py"', ""))
    assert mark_id is None  # main(argv) called from a test or a notebook: never exec'd again
    (_, mark_id, _), _ = _probe({"SLURM_PROCID": "0", "SLURM_JOB_ID": "1",
                                 "KOSMOSS_RUN_ID": "already-marked"})
    assert mark_id == "already-marked"


def _both_ranks_train(home):
    folder = next((home / "runs").glob("*/"), None) if (home / "runs").is_dir() else None
    beats = read_heartbeats(folder) if folder else {}
    return folder if sorted(beats) == [0, 1] and all(b["step"] > 0 for b in beats.values()) \
        else None


@pytest.mark.slow
def test_torchrun_ranks_of_a_killed_agent_are_ghosts_from_any_home_and_are_ended(
        shared_home, tmp_path, monkeypatch, capsys):
    theirs, decoy_home, log = tmp_path / "their-home", tmp_path / "decoy-home", tmp_path / "log"
    agent = start([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", "trainup_cpu.py", "--dataset",
                   str(shared_home / "data" / "tiny"), "--no-progress", "--batch-size", "64",
                   "--hidden", "16", "--max-epochs", "100000", "--collective-timeout", "900"],
                  theirs, log)
    decoy = start_marked(decoy_home / "runs" / "20260101-000000-decoy1", decoy_home, log,
                         "--spawn")  # a marked run whose launcher lives: no ghost
    bystander = start([sys.executable, "-c", "import time; time.sleep(3600)"], theirs, log)
    try:
        folder = wait_until(lambda: _both_ranks_train(theirs), 600, "both ranks to train", log)
        ranks = sorted(beat["pid"] for beat in read_heartbeats(folder).values())
        agent.kill()
        agent.wait()
        for pid in ranks:  # frozen: nothing writes into the home deleted below
            psutil.Process(pid).suspend()
        shutil.rmtree(theirs)
        monkeypatch.setenv("KOSMOSS_HOME", str(tmp_path / "my-home"))

        found = [g for g in ghosts.find_ghosts() if g.kind in ghosts.KOSMOSS_GHOSTS]
        assert sorted(g.pid for g in found) == ranks, [g.as_dict() for g in found]
        for ghost in found:
            assert ghost.kind == "launcher-gone" and ghost.run_id.startswith("torchrun-")
            assert f"KOSMOSS_HOME {theirs} (deleted)" in ghost.reason and \
                f"pid {agent.pid}" in ghost.reason, ghost.reason
        assert cli.main(["ghosts", "--kill", "--grace", "2"]) == 0
        wait_until(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                                   != psutil.STATUS_ZOMBIE for pid in ranks), 30, "the ranks")
        assert decoy.poll() is None and bystander.poll() is None  # spared
        assert "ended" in capsys.readouterr().out.lower()
    finally:
        end_all(theirs, [agent, bystander])
        end_all(decoy_home, [decoy])
