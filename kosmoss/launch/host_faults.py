"""A host lost under elastic torchrun, played on hosts in network namespaces: the test and
lesson 12 run the same scenario (docs/hosts.md).

    result = lost_host(home, dataset="tiny", max_steps=40)

Two hosts, one torchrun agent each (``--nnodes 1:2 --max-restarts 2``, the c10d
rendezvous on host 0); once the run has saved a checkpoint, every process of host 1 is
SIGKILLed (the host is lost); the survivor's workers fail, its agent restarts them alone
from the run's furthest checkpoint; host 1's agent is started again (the host is back), the
survivor's agent sees it waiting and restarts its workers with it; the run reaches
``max_steps``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from . import hosts

RDZV_PORT = 29400
# The survivor's agent waits this long for more nodes after the minimum has joined
# (torchrun's default last_call is 30 s): short, so a lost host costs seconds here.
RDZV_CONF = "last_call_timeout=3,join_timeout=600"
REJOIN_AFTER_S = 10.0  # the host comes back once the survivor trains alone again


def agent_command(made: hosts.HostSet, index: int, script: Path, args: List[str]) -> List[str]:
    host = made.hosts[index]
    return host.command(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node",
         "1", "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"{made.master_addr}:{RDZV_PORT}", "--rdzv-id", made.set_id, "--rdzv-conf", RDZV_CONF,
         "--local-addr", host.address, str(script), *args], host.socket_env)


def lost_host(home: Path, script: Path, dataset: str, max_steps: int,
              timeout_s: float = 600.0) -> Dict:
    """Run the scenario; returns the run's result.json, what happened when, and the logs."""
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for leaked in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK"):
        env.pop(leaked, None)
    args = ["--dataset", dataset, "--no-progress", "--max-steps", str(max_steps),
            "--max-epochs", "100000", "--batch-size", "128"]
    logs = home / "agents"
    logs.mkdir(parents=True, exist_ok=True)
    with hosts.host_set(2, None, purpose="lost-host scenario") as made:
        run_dir = home / "runs" / f"torchrun-{made.set_id}"
        events: Dict[str, float] = {"start": time.time()}
        agents = [_start(made, i, script, args, env, logs / f"host{i}.log") for i in (0, 1)]
        deadline = time.monotonic() + timeout_s
        _wait(lambda: (run_dir / "checkpoints" / "last.ckpt").is_file(), deadline,
              "the first checkpoint", agents)
        _lose(made.hosts[1])
        events["host 1 lost"] = time.time()
        agents[1].wait()
        _wait(lambda: _restarted(run_dir), deadline, "the survivor's restart", agents[:1])
        events["survivor restarted"] = time.time()
        time.sleep(REJOIN_AFTER_S)
        agents[1] = _start(made, 1, script, args, env, logs / "host1-back.log")
        events["host 1 back"] = time.time()
        codes = [_finish(agents[0], deadline)]
        events["survivor ended"] = time.time()
        # A host back after the survivor's last rendezvous waits for a round that never
        # comes: it is given a little while, then ended (its code says which happened).
        codes.append(_finish(agents[1], time.monotonic() + REJOIN_AFTER_S))
        events["end"] = time.time()
    result_file = run_dir / "result.json"
    return {"codes": codes, "events": events, "run_dir": str(run_dir),
            "result": json.loads(result_file.read_text()) if result_file.is_file() else None,
            "run": json.loads((run_dir / "run.json").read_text()),
            "logs": {p.name: p.read_text() for p in sorted(logs.glob("*.log"))}}


def _start(made, index: int, script: Path, args: List[str], env: dict,
           log: Path) -> subprocess.Popen:
    return subprocess.Popen(agent_command(made, index, script, args), cwd=script.parent,
                            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _lose(host: hosts.Host) -> None:
    """Every process of the host, SIGKILLed at once: a host that lost its power."""
    for pid in hosts.processes_in([host.namespace]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _restarted(run_dir: Path) -> bool:
    """A worker of a later attempt has recorded itself (torchrun's restart count > 0)."""
    for path in (run_dir / "processes").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not str(record.get("attempt", "")).endswith("#0") and record.get("role") == "rank":
            return True
    return False


def _wait(condition, deadline: float, what: str, agents: List[subprocess.Popen]) -> None:
    while not condition():
        if time.monotonic() > deadline or all(a.poll() is not None for a in agents):
            raise RuntimeError(f"lost-host scenario: no {what} "
                               f"(agents: {[a.poll() for a in agents]})")
        time.sleep(0.2)


def _finish(agent: subprocess.Popen, deadline: float) -> int:
    try:
        return agent.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        return agent.wait()
