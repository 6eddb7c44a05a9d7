"""``kosmoss ghosts`` on real training runs. Two 2-rank runs start side by side: SIGKILL the
launcher of one and its ranks are listed with the right reason, then ``--kill`` ends them
within 5 s and frees the port. Decoys are never listed as ghosts nor ended: a healthy run,
a look-alike command line without the marks, and another user's process that carries a
run's marks in its environment."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import pytest
from ghost_helpers import alive, end_all, processes_of, start, wait_until
from helpers import STARTUP_TIMEOUT_S, RandomSource

from kosmoss import cli, ghosts
from kosmoss.data.store import prepare
from kosmoss.launch import records
from kosmoss.launch.ports import port_is_free

pytestmark = pytest.mark.slow
# A long collective timeout: at load 10+ on 2 cores a rank took over 120 s (the default) to
# import torch and reach the rendezvous, and the scene's runs failed before the tests began.
LONG_RUN = ["--dataset", "random5", "--max-epochs", "100000", "--batch-size", "64",
            "--num-workers", "0", "--no-progress", "--collective-timeout", "900"]
KILL_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """Run "sim": trainup_gpu.py with 2 simulated nodes (a parent starts the node processes);
    run "lit": trainup_cpu.py with 2 processes (rank 0 starts rank 1); and the decoys."""
    home = tmp_path_factory.mktemp("ghosts-home")
    prepare(RandomSource(1024, levels=5), home / "data" / "random5", shard_size=256)
    log = home / "log.txt"
    started = []
    try:
        sim = start([sys.executable, "trainup_gpu.py", "--gpus", "1", "--num-nodes", "2",
                     *LONG_RUN], home, log)
        lit = start([sys.executable, "trainup_cpu.py", "--num-processes", "2", *LONG_RUN],
                    home, log)
        lookalike = start([sys.executable, "-c", "import time; time.sleep(3600)", "trainup_cpu.py",
                           "--num-processes", "2", *LONG_RUN], home, log)
        started += [sim, lit, lookalike]
        scene = {"home": home, "log": log, "sim": sim, "lit": lit, "lookalike": lookalike}
        scene.update(_wait_for_ranks(home, sim, lit, log))
        scene["nobody"] = _start_nobody(home, scene["sim_run"], sim, started, log)
        yield scene
    finally:
        end_all(home, started)


def _wait_for_ranks(home, sim, lit, log):
    def ranks(launcher_pid, n):
        for run_dir in (home / "runs").glob("*"):
            found = [r for r in records.read_processes(run_dir) if r["role"] == "rank"
                     and r["launcher"]["pid"] == launcher_pid]
            if len(found) == n:
                return run_dir.name, sorted(found, key=lambda r: r["pid"])
        return None

    began = time.monotonic()

    def within():  # one start-up budget for the whole scene: both runs start at once
        return max(1.0, STARTUP_TIMEOUT_S - (time.monotonic() - began))

    sim_run, nodes = wait_until(lambda: ranks(sim.pid, 2), within(), "two node processes", log)
    lit_run, lit_ranks = wait_until(lambda: ranks(lit.pid, 2), within(), "two Lightning ranks",
                                    log)
    port = next(r["master_port"] for r in nodes)
    # Node 0's rank 0 listens on MASTER_PORT once the process group is up: training started.
    wait_until(lambda: not port_is_free(port), within(), f"MASTER_PORT {port} to be listened on",
               log)
    return {"sim_run": sim_run, "nodes": [r["pid"] for r in nodes], "master_port": port,
            "lit_run": lit_run, "lit_rank1": next(r["pid"] for r in lit_ranks if r["spawned"])}


def _start_nobody(home, run_id, sim, started, log):
    """A process of user nobody carrying run sim's marks (None where runuser is missing)."""
    if os.getuid() != 0 or not shutil.which("runuser"):
        return None
    mark = records.LauncherMark(run_id, records.ProcessId.of(sim.pid)).encode()
    started.append(start(["runuser", "-u", "nobody", "--", "env", f"KOSMOSS_HOME={home}",
                          f"{records.RUN_ID_ENV}={run_id}", f"{records.LAUNCHER_ENV}={mark}",
                          "sleep", "3600"], home, log))
    # The sleep itself: runuser's own processes carry the same command line (and home) on
    # their way to it, and one was once picked and found to be root's (CI, 2026-11-26).
    found = wait_until(lambda: [p for p in processes_of(home)
                                if p.username() == "nobody" and p.name() == "sleep"],
                       10, "nobody's sleep")
    return found[0].pid


def _listed(home, monkeypatch, *args):
    """The ghosts of kosmoss runs (on a GPU machine, the GPU's holders are listed too)."""
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    return [g for g in ghosts.find_ghosts(*args) if args or g.kind in ghosts.KOSMOSS_GHOSTS]


def _decoys(scene):
    pids = [scene["lookalike"].pid] + ([scene["nobody"]] if scene["nobody"] else [])
    return pids


def test_a_healthy_scene_has_no_ghost(scene, monkeypatch):
    assert _listed(scene["home"], monkeypatch) == []
    (holder,) = _listed(scene["home"], monkeypatch, scene["master_port"])
    assert (holder.pid, holder.kind, holder.killable) == (scene["nodes"][0], "port", False)
    assert holder.run_id == scene["sim_run"] and "running" in holder.reason


def test_killed_launcher_of_simulated_nodes_takes_its_nodes_along(scene, monkeypatch):
    """kosmoss's own launches are orphan-proof (PR_SET_PDEATHSIG, docs/reliability.md): the
    node processes end with their launcher, so nothing is left for `kosmoss ghosts`.
    (Ghosts of external launchers, e.g. torchrun's ranks: tests/ghosts/test_records.py,
    test_any_home.py, and scripts/gpu_check.sh on a GPU.)"""
    home, sim, nodes = scene["home"], scene["sim"], scene["nodes"]
    sim.send_signal(signal.SIGKILL)
    sim.wait()
    wait_until(lambda: not any(alive(pid) for pid in nodes), KILL_WITHIN_S,
               "the node processes to end with their launcher")
    assert not [g for g in _listed(home, monkeypatch) if g.run_id == scene["sim_run"]]
    wait_until(lambda: port_is_free(scene["master_port"]), KILL_WITHIN_S, "the port")
    for pid in [scene["lit"].pid, scene["lit_rank1"], *_decoys(scene)]:
        assert alive(pid), f"pid {pid} was not part of that run but is gone"


def test_killed_lightning_launcher_takes_rank_1_along(scene, monkeypatch):
    home, lit, rank1 = scene["home"], scene["lit"], scene["lit_rank1"]
    # Even a stopped rank 1 (one blocked in a collective) ends: the signal is SIGKILL.
    os.kill(rank1, signal.SIGSTOP)
    lit.send_signal(signal.SIGKILL)
    lit.wait()
    wait_until(lambda: not alive(rank1), KILL_WITHIN_S, "rank 1 to end with its launcher")
    assert not [g for g in _listed(home, monkeypatch) if g.run_id == scene["lit_run"]]
    assert all(alive(pid) for pid in _decoys(scene))


def test_a_foreign_process_is_ended_only_when_named(scene, monkeypatch, capsys):
    monkeypatch.setenv("KOSMOSS_HOME", str(scene["home"]))
    lookalike = scene["lookalike"].pid
    assert cli.main(["ghosts", "--kill"]) == 0
    assert alive(lookalike)
    if scene["nobody"]:
        assert cli.main(["ghosts", "--kill", "--pid", str(scene["nobody"])]) == 2
        assert "owned by user nobody" in capsys.readouterr().err
        assert alive(scene["nobody"])
    assert cli.main(["ghosts", "--kill", "--pid", str(lookalike), "--json"]) == 0
    (named,) = json.loads(capsys.readouterr().out)
    assert (named["pid"], named["run_id"], named["kind"], named["ended"]) == \
        (lookalike, None, "named", True)
    scene["lookalike"].wait(timeout=5)
    if scene["nobody"]:
        assert alive(scene["nobody"])
