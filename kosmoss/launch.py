"""Layer 5: who starts the processes of a run.

- one process, or N local ranks started by Lightning's own launcher;
- *simulated nodes*: ``--num-nodes K`` with no cluster around us starts K node processes
  on this host (NODE_RANK 0..K-1, one MASTER_ADDR/MASTER_PORT), because Lightning started
  once with ``num_nodes=2`` waits forever for node 1;
- torchrun or srun already started us: never spawn again; the topology comes from their
  variables (Lightning's TorchElasticEnvironment and SLURMEnvironment do the rest);
- horovodrun started us (``--strategy horovod``): the same, from its HOROVOD_* variables.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import psutil

from .cpus import cores_per_process
from .environment import detect_launcher
from .errors import UsageError

SIMULATED_NODE_ENV = "KOSMOSS_SIMULATED_NODES"  # set in node processes: never spawn again
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    devices_per_node: int
    launcher: str  # single | lightning | simulate | simulated-node | torchrun | slurm | horovodrun
    node_rank: int = 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    def global_rank_hint(self) -> int:
        """This process's rank before Lightning has set up (for rank-zero printing)."""
        if self.launcher == "torchrun":
            return int(os.environ.get("RANK", 0))
        if self.launcher == "slurm":
            return int(os.environ.get("SLURM_PROCID", 0))
        if self.launcher == "horovodrun":
            return int(os.environ.get("HOROVOD_RANK", 0))
        return self.node_rank * self.devices_per_node + int(os.environ.get("LOCAL_RANK", 0))


def resolve(num_processes: Optional[int], num_nodes: Optional[int],
            process_flag: str = "--num-processes", strategy: str = "ddp") -> Topology:
    """The topology from the flags (None: not given) and the environment we run in."""
    if strategy == "horovod" or detect_launcher() == "horovodrun":
        return _from_horovod(num_processes, num_nodes, process_flag, strategy)
    if os.environ.get(SIMULATED_NODE_ENV):
        return Topology(int(os.environ[SIMULATED_NODE_ENV]), num_processes or 1,
                        "simulated-node", node_rank=int(os.environ["NODE_RANK"]))
    launcher = detect_launcher()
    if launcher == "torchrun":
        return _from_torchrun(num_processes, num_nodes, process_flag)
    if launcher == "slurm":
        return _from_slurm(num_processes, num_nodes, process_flag)
    devices, nodes = num_processes or 1, num_nodes or 1
    if nodes > 1:
        return Topology(nodes, devices, "simulate")
    return Topology(1, devices, "lightning" if devices > 1 else "single")


def _from_torchrun(num_processes, num_nodes, process_flag) -> Topology:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    nodes = int(os.environ["WORLD_SIZE"]) // local
    if num_processes is not None and num_processes != local:
        raise UsageError(f"{process_flag} {num_processes} contradicts torchrun's "
                         f"--nproc_per_node {local}: drop the flag, torchrun decides")
    if num_nodes is not None and num_nodes != nodes:
        raise UsageError(f"--num-nodes {num_nodes} contradicts torchrun's --nnodes {nodes}: "
                         "drop the flag, torchrun decides")
    return Topology(nodes, local, "torchrun", node_rank=int(os.environ.get("GROUP_RANK", 0)))


def _from_horovod(num_processes, num_nodes, process_flag, strategy) -> Topology:
    """horovodrun starts every rank itself; without it, Horovod runs one process."""
    if detect_launcher() != "horovodrun":
        ranks = (num_processes or 1) * (num_nodes or 1)
        if ranks > 1:
            raise UsageError(f"--strategy horovod with {ranks} processes: horovodrun starts "
                             f"Horovod's ranks, so drop {process_flag}/--num-nodes and run "
                             f"`horovodrun -np {ranks} --gloo python trainup_gpu.py --strategy "
                             "horovod ...`")
        return Topology(1, 1, "single")
    if strategy != "horovod":
        raise UsageError(f"horovodrun started this process but the strategy is {strategy}: "
                         "run `trainup_gpu.py --strategy horovod` (DDP would train each rank "
                         "alone)")
    local = int(os.environ["HOROVOD_LOCAL_SIZE"])
    nodes = int(os.environ["HOROVOD_CROSS_SIZE"])
    if local * nodes != int(os.environ["HOROVOD_SIZE"]):  # the batch split assumes it
        raise UsageError(f"horovodrun started {os.environ['HOROVOD_SIZE']} ranks unevenly over "
                         f"{nodes} host(s): give every host the same slots (-H host1:N,host2:N)")
    if num_processes is not None and num_processes != local:
        raise UsageError(f"{process_flag} {num_processes} contradicts horovodrun's {local} "
                         "rank(s) on this host: drop the flag, horovodrun -np/-H decide")
    if num_nodes is not None and num_nodes != nodes:
        raise UsageError(f"--num-nodes {num_nodes} contradicts horovodrun's {nodes} host(s): "
                         "drop the flag, horovodrun -H decides")
    return Topology(nodes, local, "horovodrun",
                    node_rank=int(os.environ.get("HOROVOD_CROSS_RANK", 0)))


def _from_slurm(num_processes, num_nodes, process_flag) -> Topology:
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    tasks = int(os.environ["SLURM_NTASKS"])
    if tasks > 1 and "SLURM_NTASKS_PER_NODE" not in os.environ:  # Lightning would refuse it
        raise UsageError(f"srun --ntasks {tasks}: ask for --ntasks-per-node instead (Lightning's "
                         "SLURMEnvironment needs the same number of tasks on every node)")
    per_node = tasks // nodes
    if num_processes is not None and num_processes != per_node:
        raise UsageError(f"{process_flag} {num_processes} contradicts Slurm's {per_node} tasks "
                         "per node: drop the flag, or ask sbatch/srun for --ntasks-per-node "
                         f"{num_processes}")
    if num_nodes is not None and num_nodes != nodes:
        raise UsageError(f"--num-nodes {num_nodes} contradicts Slurm's {nodes} node(s): drop "
                         f"the flag, or ask sbatch for --nodes {num_nodes}")
    return Topology(nodes, per_node, "slurm", node_rank=int(os.environ.get("SLURM_NODEID", 0)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_master_port(topology: Topology) -> None:
    """A MASTER_PORT the user set must be free before we start ranks on it, or they would
    fail with "Address already in use" one by one; name who holds it."""
    port = os.environ.get("MASTER_PORT")
    starts_ranks = topology.launcher in ("simulate", "lightning") and "LOCAL_RANK" not in os.environ
    if not port or not starts_ranks:
        return
    if not port_is_free(int(port)):
        raise UsageError(f"MASTER_PORT {port} is busy, {port_holder(int(port))}: end that "
                         "process, or unset MASTER_PORT and kosmoss picks a free one")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # SO_REUSEADDR: a port in TIME_WAIT is free for us; one being listened on is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    pid = next(iter(port_holders(port)), None)
    if pid is None:
        return "held by a process this user cannot see"
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        command = "?"
    return f"held by pid {pid} ({command[:80]})"


def port_holders(port: int) -> List[Optional[int]]:
    """Every process listening on this TCP port (a socket forked into data workers is held
    by each); None for one this user cannot see."""
    return [conn.pid for conn in psutil.net_connections(kind="inet")
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN]


def simulate_nodes(topology: Topology, extra_env: Dict[str, str],
                   echo: Callable[[str], None]) -> int:
    """Run this same command once per node, as if on K hosts; returns the exit code.
    If one node process fails, the others are ended too: nothing is left running."""
    port = int(os.environ.get("MASTER_PORT") or free_port())
    echo(f"simulating {topology.num_nodes} nodes on this host: node processes with NODE_RANK "
         f"0..{topology.num_nodes - 1}, MASTER_ADDR 127.0.0.1, MASTER_PORT {port}, "
         f"{topology.devices_per_node} rank(s) each")
    base = {**os.environ, **extra_env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            SIMULATED_NODE_ENV: str(topology.num_nodes)}
    # Lightning sizes torch threads by the ranks *it* starts (1 per node here): all the
    # nodes share this host's cores, so each rank gets its share (as torchrun does).
    base.setdefault("OMP_NUM_THREADS", str(cores_per_process(topology.world_size)))
    nodes = [subprocess.Popen(_own_command(), env={**base, "NODE_RANK": str(rank)},
                              start_new_session=True)
             for rank in range(topology.num_nodes)]
    previous = {sig: signal.signal(sig, lambda *_: _stop(nodes)) for sig in
                (signal.SIGINT, signal.SIGTERM)}
    try:
        return _wait(nodes)
    finally:
        _stop(nodes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _own_command() -> List[str]:
    # The way Lightning re-runs a script for its extra ranks: same interpreter and argv.
    main = sys.modules["__main__"]
    if getattr(main, "__spec__", None) is not None:
        return [sys.executable, "-m", main.__spec__.name, *sys.argv[1:]]
    return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def _wait(nodes: List[subprocess.Popen]) -> int:
    while True:
        codes = [node.poll() for node in nodes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            return failed[0] if failed[0] > 0 else 1
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)


def _stop(nodes: List[subprocess.Popen]) -> None:
    """SIGTERM each node's whole process group (its local ranks too), then SIGKILL."""
    for node in nodes:
        _signal_group(node, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for node in nodes:
        try:
            node.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(node, signal.SIGKILL)


def _signal_group(node: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(node.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
