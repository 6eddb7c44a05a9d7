"""A host lost under elastic torchrun, and back, played on hosts in network namespaces: the
test and lesson 12 run the same scenario (docs/hosts.md).

    scenario = lost_host(home, Path("trainup_cpu.py"), dataset="tiny", max_steps=60)

Two hosts, one torchrun agent each (``--nnodes 1:2 --max-restarts 2``, the c10d
rendezvous on host 0). Once the run has saved a checkpoint, every process of host 1 is
SIGKILLed (the host is lost); the survivor's worker fails in its next all-reduce and its
agent restarts it alone, from the run's furthest checkpoint. Then host 1's agent is started
again (the host is back): the survivor's agent sees it waiting, stops its worker, and both
agents start workers in a world of 2 again, which continue from the furthest checkpoint
to ``max_steps``.

Two things make the return work here. Every agent runs with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch's default (the agent's store shared with
the workers) an agent that joins a later round waits forever for the round's MASTER_ADDR,
which the rank-0 agent publishes only in the round it first built it (docs/hosts.md quotes
the source). And the survivor's new worker is paused (SIGSTOP) until its agent has seen
host 1 waiting: the steps left take seconds here, less than an agent's start-up, while on a
cluster the run outlasts a host's reboot.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import psutil

from . import hosts, records

RDZV_PORT = 29400
# The survivor's agent waits this long for more nodes after the minimum has joined
# (torchrun's default last_call is 30 s): short, so a lost host costs seconds here.
RDZV_CONF = "last_call_timeout=3,join_timeout=600"
# An agent that joins a later round reads MASTER_ADDR from that round's store, where only a
# rank-0 agent that had no bootstrap info yet writes it (docs/hosts.md).
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
REJOIN_TIMEOUT_S = 300.0  # the survivor's agent sees a waiting node within a monitor interval


def agent_command(made: hosts.HostSet, index: int, script: Path, args: List[str]) -> List[str]:
    host = made.hosts[index]
    return host.command(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node",
         "1", "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"{made.master_addr}:{RDZV_PORT}", "--rdzv-id", made.set_id, "--rdzv-conf", RDZV_CONF,
         "--local-addr", host.address, str(script), *args],
        {**host.socket_env, **AGENT_ENV, **made.threads_env})


def lost_host(home: Path, script: Path, dataset: str, max_steps: int,
              timeout_s: float = 600.0) -> Dict:
    """Run the scenario; returns the run's result.json, the world size of each phase, what
    happened when, the agents' exit codes and their logs."""
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for leaked in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK"):
        env.pop(leaked, None)
    args = ["--dataset", dataset, "--no-progress", "--max-steps", str(max_steps),
            "--max-epochs", "100000", "--batch-size", "128"]
    logs = home / "agents"
    logs.mkdir(parents=True, exist_ok=True)
    with hosts.host_set(2, None, purpose="lost-host scenario") as made:
        run_dir = home / "runs" / f"torchrun-{made.set_id}"
        play = _Play(made, script, args, env, logs, time.monotonic() + timeout_s)
        sizes = play.run(run_dir)
    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    sizes["after host 1 came back"] = result["world_size"] if result else None
    return {"codes": play.codes, "events": play.events, "world_sizes": sizes,
            "run_dir": str(run_dir), "result": result,
            "run": json.loads((run_dir / "run.json").read_text()),
            "logs": {p.name: p.read_text() for p in sorted(logs.glob("*.log"))}}


class _Play:
    """The scenario's steps, in order, each one waiting for what the previous one caused."""

    def __init__(self, made: hosts.HostSet, script: Path, args: List[str], env: dict,
                 logs: Path, deadline: float):
        self.made, self.script, self.args, self.env = made, script, args, env
        self.logs, self.deadline = logs, deadline
        self.events: Dict[str, float] = {"start": time.time()}
        self.codes: List[Optional[int]] = []

    def run(self, run_dir: Path) -> Dict[str, Optional[int]]:
        agents = [self._start(i, f"host{i}.log") for i in (0, 1)]
        self._wait(lambda: (run_dir / "checkpoints" / "last.ckpt").is_file(),
                   "the first checkpoint", agents)
        before = _world_size_of(_workers(agents[0].pid, restart=0))
        _lose(self.made.hosts[1])
        self.events["host 1 lost"] = time.time()
        agents[1].wait()
        survivor = self._wait(lambda: _training(run_dir, _workers(agents[0].pid, restart=1)),
                              "the survivor's restart", agents[:1])
        alone = _world_size_of(survivor)
        for pid in survivor:
            _signal(pid, signal.SIGSTOP)
        if not _alive(survivor[0]):
            raise RuntimeError("lost-host scenario: the survivor finished alone before host 1 "
                               "could come back; give it more steps")
        self.events["survivor restarted alone"] = time.time()
        agents[1] = self._start(1, "host1-back.log")
        self.events["host 1 back"] = time.time()
        try:
            self._wait(lambda: all(_asked_to_stop(pid) for pid in survivor),
                       "new rendezvous round with host 1", agents[:1], REJOIN_TIMEOUT_S)
            self.events["host 1 joined"] = time.time()
        finally:
            for pid in survivor:
                _signal(pid, signal.SIGCONT)
        self.codes = [_finish(agent, self.deadline) for agent in agents]
        self.events["end"] = time.time()
        return {"before": before, "survivor alone": alone}

    def _start(self, index: int, log_name: str) -> subprocess.Popen:
        return subprocess.Popen(agent_command(self.made, index, self.script, self.args),
                                cwd=self.script.parent, env=self.env,
                                stdout=open(self.logs / log_name, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, condition: Callable, what: str, agents: List[subprocess.Popen],
              within_s: Optional[float] = None):
        deadline = self.deadline if within_s is None else min(self.deadline,
                                                              time.monotonic() + within_s)
        while not (found := condition()):
            if time.monotonic() > deadline or all(a.poll() is not None for a in agents):
                raise RuntimeError(f"lost-host scenario: no {what} "
                                   f"(agents: {[a.poll() for a in agents]})")
            time.sleep(0.05)
        return found


def _lose(host: hosts.Host) -> None:
    """Every process of the host, SIGKILLed at once: a host that lost its power."""
    for pid in hosts.processes_in([host.namespace]):
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _workers(agent_pid: int, restart: int) -> List[int]:
    """The agent's workers (its children) of its ``restart``-th start
    (TORCHELASTIC_RESTART_COUNT: a restart after a failure counts, a host joining does not)."""
    try:
        children = psutil.Process(agent_pid).children()
    except psutil.Error:
        return []
    return [child.pid for child in children
            if _environ(child.pid).get("TORCHELASTIC_RESTART_COUNT") == str(restart)]


def _training(run_dir: Path, workers: List[int]) -> List[int]:
    """The workers, once they have joined the run's records: planned from its checkpoint,
    about to train."""
    ready = all(records.process_record_path(run_dir, pid).is_file() for pid in workers)
    return workers if workers and ready else []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _world_size_of(workers: List[int]) -> Optional[int]:
    """The world size torchrun gave the first of these workers (None: none is left)."""
    size = _environ(workers[0]).get("WORLD_SIZE") if workers else None
    return int(size) if size else None


def _asked_to_stop(pid: int) -> bool:
    """Its agent sent the paused worker SIGTERM (pending until SIGCONT), or it is gone: the
    agent is restarting the workers."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def _finish(agent: subprocess.Popen, deadline: float) -> int:
    try:
        return agent.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        return agent.wait()
