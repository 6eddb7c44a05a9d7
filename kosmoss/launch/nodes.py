"""Simulated nodes: ``--num-nodes K`` with no cluster around us runs this same command
once per node on this host (NODE_RANK 0..K-1, one MASTER_ADDR/MASTER_PORT), because
Lightning started once with ``num_nodes=2`` waits forever for node 1."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..devices.cpus import cores_per_process
from .lifetime import die_with, end_groups
from .ports import free_port
from .records import Stopped
from .topology import SIMULATED_NODE_ENV, Topology

STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class NodeFailure:
    """The first node process of a simulated run that ended badly."""
    node_rank: int
    pid: int
    code: int

    def __str__(self) -> str:
        if self.code < 0:
            how = f"was killed by {_signal_name(-self.code)}"
        else:
            how = f"exited with code {self.code}"
        return f"node {self.node_rank} (pid {self.pid}) {how}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def simulate_nodes(topology: Topology, extra_env: Dict[str, str],
                   echo: Callable[[str], None]) -> Optional[NodeFailure]:
    """Run this same command once per node, as if on K hosts; returns the first node that
    failed, or None. If one node process fails, the others are ended too; if this process
    dies, the nodes get SIGKILL (the parent-death signal): nothing is left running."""
    port = int(os.environ.get("MASTER_PORT") or free_port())
    echo(f"simulating {topology.num_nodes} nodes on this host: node processes with NODE_RANK "
         f"0..{topology.num_nodes - 1}, MASTER_ADDR 127.0.0.1, MASTER_PORT {port}, "
         f"{topology.devices_per_node} rank(s) each")
    base = {**os.environ, **extra_env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            SIMULATED_NODE_ENV: str(topology.num_nodes)}
    # Lightning sizes torch threads by the ranks *it* starts (1 per node here): all the
    # nodes share this host's cores, so each rank gets its share (as torchrun does).
    base.setdefault("OMP_NUM_THREADS", str(cores_per_process(topology.world_size)))
    preexec = die_with(os.getpid())
    nodes = [subprocess.Popen(_own_command(), env={**base, "NODE_RANK": str(rank)},
                              start_new_session=True, preexec_fn=preexec)
             for rank in range(topology.num_nodes)]
    asked_to_stop: List[int] = []

    def stop(signum, frame) -> None:  # the nodes stop at one step with a checkpoint
        asked_to_stop.append(signum)
        _stop(nodes)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        failure = _wait(nodes)
    finally:
        _stop(nodes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None and asked_to_stop:  # stopped before they could checkpoint
        raise Stopped(asked_to_stop[0])
    return failure


def _own_command() -> List[str]:
    # The way Lightning re-runs a script for its extra ranks: same interpreter and argv.
    main = sys.modules["__main__"]
    if getattr(main, "__spec__", None) is not None:
        return [sys.executable, "-m", main.__spec__.name, *sys.argv[1:]]
    return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def _wait(nodes: List[subprocess.Popen]) -> Optional[NodeFailure]:
    while True:
        codes = [node.poll() for node in nodes]
        failed = [NodeFailure(rank, node.pid, code) for rank, (node, code)
                  in enumerate(zip(nodes, codes)) if code not in (None, 0)]
        if failed:  # a node killed by a signal is the cause; the others fail because of it
            return min(failed, key=lambda failure: failure.code >= 0)
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.2)


def _stop(nodes: List[subprocess.Popen]) -> None:
    end_groups(nodes, STOP_GRACE_S)
