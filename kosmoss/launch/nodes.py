"""Simulated nodes: ``--num-nodes K`` with no cluster around us runs this same command
once per node on this host (NODE_RANK 0..K-1, one MASTER_ADDR/MASTER_PORT), because
Lightning started once with ``num_nodes=2`` waits forever for node 1. Over loopback, or
with ``--hosts netns`` each node in a host of its own (kosmoss.launch.hosts): its own
network namespace, address and link, node 0's address as MASTER_ADDR."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..core.signals import restore
from ..devices.cpus import cores_per_process
from . import hosts as host_sets
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
    unreachable: Tuple[str, ...] = ()  # hosts whose link was down when it failed

    def __str__(self) -> str:
        if self.code < 0:
            how = f"was killed by {_signal_name(-self.code)}"
        else:
            how = f"exited with code {self.code}"
        lost = f" ({'; '.join(self.unreachable)})" if self.unreachable else ""
        return f"node {self.node_rank} (pid {self.pid}) {how}{lost}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def simulate_nodes(topology: Topology, extra_env: Dict[str, str],
                   echo: Callable[[str], None], hosts: str = "loopback",
                   link_rate: Optional[str] = None,
                   run_id: Optional[str] = None) -> Optional[NodeFailure]:
    """Run this same command once per node, as if on K hosts (``hosts`` netns: each in a
    network namespace of its own, made here and removed after); returns the first node
    that failed, or None. If one node process fails, the others are ended too; if this
    process dies, the nodes get SIGKILL (the parent-death signal): nothing is left running."""
    port = int(os.environ.get("MASTER_PORT") or free_port())
    with _nodes_network(topology, hosts, link_rate, run_id) as made:
        where = made.describe() if made else "MASTER_ADDR 127.0.0.1"
        echo(f"simulating {topology.num_nodes} nodes on this host: node processes with "
             f"NODE_RANK 0..{topology.num_nodes - 1}, {where}, MASTER_PORT {port}, "
             f"{topology.devices_per_node} rank(s) each")
        base = {**os.environ, **extra_env, "MASTER_ADDR": made.master_addr if made else
                "127.0.0.1", "MASTER_PORT": str(port), SIMULATED_NODE_ENV: str(topology.num_nodes)}
        # Lightning sizes torch threads by the ranks *it* starts (1 per node here): all the
        # nodes share this host's cores, so each rank gets its share (as torchrun does).
        base.setdefault("OMP_NUM_THREADS", str(cores_per_process(topology.world_size)))
        commands = [_node_command(made, rank, echo) for rank in range(topology.num_nodes)]
        failure = _run_nodes(commands, base)
        if failure is not None and made is not None:  # named while the links are still there
            failure = NodeFailure(failure.node_rank, failure.pid, failure.code,
                                  tuple(host_sets.unreachable_hosts(made)))
        return failure


@contextlib.contextmanager
def _nodes_network(topology: Topology, hosts: str, link_rate: Optional[str],
                   run_id: Optional[str]):
    """None over loopback; with ``netns`` a host set for the nodes, removed at the end."""
    if hosts != "netns":
        yield None
        return
    rate = host_sets.parse_rate(link_rate, "--link-rate")
    with host_sets.host_set(topology.num_nodes, rate, purpose=f"run {run_id}",
                            set_id=run_id) as made:
        yield made


def _node_command(made, rank: int, echo: Callable[[str], None]) -> List[str]:
    if made is None:
        return _own_command()
    host = made.hosts[rank]
    command = host.command(_own_command(), host.socket_env)
    echo(f"node {rank}: {' '.join(command)}")
    return command


def _run_nodes(commands: List[List[str]], base: Dict[str, str]) -> Optional[NodeFailure]:
    preexec = die_with(os.getpid())
    nodes = [subprocess.Popen(command, env={**base, "NODE_RANK": str(rank)},
                              start_new_session=True, preexec_fn=preexec)
             for rank, command in enumerate(commands)]
    asked_to_stop: List[int] = []

    def stop(signum, frame) -> None:  # the nodes stop at one step with a checkpoint
        asked_to_stop.append(signum)
        _stop(nodes)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        failure = _wait(nodes)
    finally:
        _stop(nodes)
        restore(list(previous.items()))  # all of them, even when a late stop raises midway
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
