"""Layer 5: who starts the processes of a run.

- one process, or N local ranks started by Lightning's own launcher;
- *simulated nodes*: ``--num-nodes K`` with no cluster around us starts K node processes
  on this host (NODE_RANK 0..K-1, one MASTER_ADDR/MASTER_PORT), because Lightning started
  once with ``num_nodes=2`` waits forever for node 1;
- torchrun, srun or horovodrun already started us: never spawn again.

Nothing kosmoss starts outlives its starter (docs/reliability.md): simulated nodes and the
local ranks Lightning starts for kosmoss get the parent-death signal (Linux's
``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a launcher killed with ``kill -9`` takes its
ranks with it; an external launcher's ranks are left to that launcher.

Who is who comes from Lightning's ClusterEnvironments (TorchElasticEnvironment,
SLURMEnvironment, LightningEnvironment) and kosmoss's HorovodEnvironment; kosmoss adds only
what they lack: the number of nodes, and the simulated nodes.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Dict, Iterator, List, Optional

import psutil

from .cpus import cores_per_process
from .environment import detect_launcher
from .errors import ConfigError, RunFailed, UsageError
from .records import Stopped

SIMULATED_NODE_ENV = "KOSMOSS_SIMULATED_NODES"  # set in node processes: never spawn again
# Set while a kosmoss process lets Lightning start its other local ranks: their parent's pid.
SPAWNER_ENV = "KOSMOSS_SPAWNER_PID"
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# What an external launcher sets in each rank (checked without importing Lightning).
EXTERNAL_RANK_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "HOROVOD_RANK",
                           "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class Launcher(str, Enum):
    """Who started this process (a ``str``: records and result.json keep the value)."""

    SINGLE = "single"  # one process, nobody else
    LIGHTNING = "lightning"  # Lightning starts the other local ranks
    SIMULATE = "simulate"  # this process starts one node process per simulated node
    SIMULATED_NODE = "simulated-node"  # one of those node processes
    TORCHRUN = "torchrun"
    SLURM = "slurm"
    HOROVODRUN = "horovodrun"

    @property
    def external(self) -> bool:
        return self in (Launcher.TORCHRUN, Launcher.SLURM, Launcher.HOROVODRUN)

    @property
    def simulated(self) -> bool:
        return self in (Launcher.SIMULATE, Launcher.SIMULATED_NODE)

    @property
    def starts_ranks(self) -> bool:
        """kosmoss or Lightning starts processes from this one (so it needs a free port)."""
        return self in (Launcher.SIMULATE, Launcher.LIGHTNING) and "LOCAL_RANK" not in os.environ


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    devices_per_node: int
    launcher: Launcher
    node_rank: int = 0
    global_rank: int = 0  # this process's, as its launcher says (0 before Lightning spawns)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def ranks_on_host(self) -> int:
        # Simulated nodes all run on this host: their ranks share its cores and its GPUs.
        return self.devices_per_node * (self.num_nodes if self.launcher.simulated else 1)


# How each external launcher says how many processes per node and how many nodes, for the
# one contradiction check: (its word for the per-node count, its word for the nodes).
LAUNCHER_TERMS = {
    Launcher.TORCHRUN: ("--nproc_per_node", "--nnodes", "drop the flag, torchrun decides"),
    Launcher.SLURM: ("tasks per node", "node(s)", "drop the flag, or ask sbatch/srun for it"),
    Launcher.HOROVODRUN: ("rank(s) on this host", "host(s)",
                          "drop the flag, horovodrun -np/-H decide"),
}


def resolve(num_processes: Optional[int], num_nodes: Optional[int], engine) -> Topology:
    """The topology from the requested counts (None: not given), the engine and the
    environment we run in."""
    found = detect_launcher()
    launcher = Launcher(found) if found in Launcher._value2member_map_ else None
    if launcher is None and os.environ.get(SIMULATED_NODE_ENV):
        launcher = Launcher.SIMULATED_NODE
    ranks = (num_processes or 1) * (num_nodes or 1)
    engine.check_launch(launcher.value if launcher else "none", ranks)
    if launcher is not None and launcher.external:
        return _from_cluster(launcher, num_processes, num_nodes)
    if launcher is Launcher.SIMULATED_NODE:
        return _simulated_node(num_processes or 1)
    devices, nodes = num_processes or 1, num_nodes or 1
    if nodes > 1:
        return Topology(nodes, devices, Launcher.SIMULATE)
    local = _lightning_environment().local_rank()
    return Topology(1, devices, Launcher.LIGHTNING if devices > 1 else Launcher.SINGLE,
                    global_rank=local)


def _from_cluster(launcher: Launcher, num_processes, num_nodes) -> Topology:
    if launcher is Launcher.SLURM:
        _check_slurm_tasks()  # before Lightning's SLURMEnvironment refuses with a traceback
    environment = cluster_environment(launcher)
    world = environment.world_size()
    nodes, local = _counts(launcher, world)
    if local * nodes != world:  # the batch split assumes the same ranks on every node
        raise UsageError(f"{launcher.value} started {world} ranks unevenly over {nodes} "
                         "node(s): give every node the same number (for horovodrun the same "
                         "slots, -H host1:N,host2:N)")
    per_node, node_word, advice = LAUNCHER_TERMS[launcher]
    torchrun = launcher is Launcher.TORCHRUN  # its words are flags: "--nnodes 2"
    _agree("num_processes", num_processes, local, f"{launcher.value}'s {per_node} {local}"
           if torchrun else f"{launcher.value}'s {local} {per_node}", advice)
    _agree("num_nodes", num_nodes, nodes, f"{launcher.value}'s {node_word} {nodes}"
           if torchrun else f"{launcher.value}'s {nodes} {node_word}", advice)
    return Topology(nodes, local, launcher, node_rank=environment.node_rank(),
                    global_rank=environment.global_rank())


def _agree(field: str, requested: Optional[int], actual: int, theirs: str, advice: str) -> None:
    """The one check that a flag agrees with what the launcher already decided."""
    if requested is not None and requested != actual:
        raise ConfigError(field, f"{{field}} {requested} contradicts {theirs}: {advice}")


def cluster_environment(launcher: Launcher):
    """Lightning's ClusterEnvironment for an external launcher (kosmoss's for Horovod)."""
    if launcher is Launcher.HOROVODRUN:
        from .engines.horovod import HorovodEnvironment

        return HorovodEnvironment(join=False)  # horovodrun's variables; hvd.init() comes later
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if launcher is Launcher.SLURM:
        # kosmoss handles SIGUSR1/SIGTERM itself (run/preemption.py), Lightning must not.
        return SLURMEnvironment(auto_requeue=False)
    return TorchElasticEnvironment()


def _counts(launcher: Launcher, world: int):
    """(nodes, ranks per node): what the ClusterEnvironments do not expose."""
    if launcher is Launcher.TORCHRUN:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return world // local, local
    if launcher is Launcher.HOROVODRUN:
        return int(os.environ["HOROVOD_CROSS_SIZE"]), int(os.environ["HOROVOD_LOCAL_SIZE"])
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    return nodes, world // nodes


def _check_slurm_tasks() -> None:
    tasks = int(os.environ.get("SLURM_NTASKS") or 1)
    if tasks > 1 and "SLURM_NTASKS_PER_NODE" not in os.environ:  # Lightning would refuse it
        raise UsageError(f"srun --ntasks {tasks}: ask for --ntasks-per-node instead (Lightning's "
                         "SLURMEnvironment needs the same number of tasks on every node)")


def _lightning_environment():
    from lightning_fabric.plugins.environments import LightningEnvironment

    return LightningEnvironment()


def _simulated_node(devices: int) -> Topology:
    environment = _lightning_environment()  # reads NODE_RANK and LOCAL_RANK, as Lightning will
    node = environment.node_rank()
    return Topology(int(os.environ[SIMULATED_NODE_ENV]), devices, Launcher.SIMULATED_NODE,
                    node_rank=node, global_rank=node * devices + environment.local_rank())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_master_port(topology: Topology) -> None:
    """A MASTER_PORT the user set must be free before we start ranks on it, or they would
    fail with "Address already in use" one by one; name who holds it."""
    port = os.environ.get("MASTER_PORT")
    if not port or not topology.launcher.starts_ranks:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"MASTER_PORT {port!r} is not a TCP port: unset it (kosmoss picks a "
                         "free one) or give a number from 1 to 65535")
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


# ---- nothing outlives its launcher


def _prctl():
    """libc's prctl, or None off Linux (no parent-death signal there: ranks then end when
    their collectives fail)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def die_with(parent_pid: int) -> Callable[[], None]:
    """``preexec_fn`` for a child of ``parent_pid``: SIGKILL when the parent dies; already
    dead (it died between fork and prctl): die now."""
    prctl = _prctl()  # looked up before the fork: the child only calls it

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGKILL)
    return preexec


@contextlib.contextmanager
def local_ranks_die_with_me(topology: Topology) -> Iterator[None]:
    """While this process lets Lightning start its other local ranks, tell them who their
    parent is (:func:`die_with_spawner` in each). Lightning's launcher takes no
    ``preexec_fn``, so the ranks set the parent-death signal themselves."""
    spawns = (not topology.launcher.external and topology.devices_per_node > 1
              and "LOCAL_RANK" not in os.environ)
    previous = os.environ.get(SPAWNER_ENV)
    if spawns:
        os.environ[SPAWNER_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if spawns and previous is None:
            os.environ.pop(SPAWNER_ENV, None)
        elif spawns:
            os.environ[SPAWNER_ENV] = previous


def die_with_spawner() -> None:
    """In a local rank Lightning started for kosmoss: be SIGKILLed when the rank that started
    us dies, and leave at once if it is already gone. Called first thing by the launchers
    (torch takes seconds to import). Ranks of torchrun, srun, horovodrun and mpirun are left
    alone: their launchers decide what outlives them (docs/reliability.md)."""
    spawner = os.environ.get(SPAWNER_ENV)
    if not spawner or not spawner.isdigit() or "LOCAL_RANK" not in os.environ:
        return
    prctl = _prctl()
    if prctl is None or any(name in os.environ for name in EXTERNAL_RANK_VARIABLES):
        return
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(spawner):  # it died before the signal was armed
        raise RunFailed(f"rank {os.environ['LOCAL_RANK']}: the process that started it (pid "
                        f"{spawner}) has ended; nothing to train for")


def started_by_kosmoss() -> bool:
    """This process is a simulated node or a local rank Lightning started for kosmoss: the
    process that started it speaks for the run (one line, not one per rank)."""
    return SIMULATED_NODE_ENV in os.environ or (
        SPAWNER_ENV in os.environ and "LOCAL_RANK" in os.environ)


# ---- ranks that measure something: rank 0 writes the figures


def write_result(path: str, data: dict) -> None:
    """Rank 0's figures, whole or not at all (a SIGTERM from the spawner mid-write must not
    leave half a file that reads as a result)."""
    partial = f"{path}.partial"
    with open(partial, "w") as handle:
        json.dump(data, handle)
    os.replace(partial, path)


def leave_rank() -> None:
    """End a spawned rank whose work is done, skipping the interpreter's finalisation: there
    C++ static destructors run beside gloo's threads, and a comm rank aborted in them in 1
    of 34 runs here ("terminate called without an active exception", SIGABRT, no Python
    frame left; 0 of 124 after this). A forked multiprocessing child ends this way too."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_for_result(function: Callable, args: tuple, nprocs: int, result: str) -> dict:
    """Run ``function(rank, *args)`` in ``nprocs`` spawned processes (``spawn``: a fresh
    interpreter per rank, as a launcher starts it) and return what rank 0 wrote to ``result``
    with :func:`write_result` after its last collective.

    A rank that dies by a signal once that file exists died tearing down: every rank's
    collectives had completed, so the figures are kept, with a warning (ranks end with
    :func:`leave_rank`, which avoids the one such death seen). A rank that fails before, or
    raises, fails the measurement."""
    import torch.multiprocessing as mp

    try:
        mp.start_processes(function, args=args, nprocs=nprocs, join=True, start_method="spawn")
    except mp.ProcessExitedException as failure:
        if not failure.signal_name or not os.path.exists(result):
            raise
        print(f"kosmoss: rank {failure.error_index} ended with {failure.signal_name} after "
              "its collectives had completed (tearing down); the figures are kept",
              file=sys.stderr)
    with open(result) as handle:
        return json.load(handle)


# ---- simulated nodes


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


def end_groups(processes: List[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM each process's whole process group (its ranks and workers too), then SIGKILL
    what is left after ``grace_s``: the one way kosmoss ends what it started."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
