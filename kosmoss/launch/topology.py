"""Who started this process, and the world that makes: one process, N local ranks started
by Lightning's launcher, simulated nodes, or an external launcher (torchrun, srun,
horovodrun) whose counts a flag may not contradict. Who is who comes from Lightning's
ClusterEnvironments (kosmoss's HorovodEnvironment for horovodrun)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from ..core.errors import ConfigError, UsageError
from ..devices.environment import detect_launcher

SIMULATED_NODE_ENV = "KOSMOSS_SIMULATED_NODES"  # set in node processes: never spawn again


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

    @property
    def first_rank_on_host(self) -> int:
        """The host's ranks before this node's: a simulated node's GPUs follow the nodes
        before it on the same host."""
        return self.node_rank * self.devices_per_node if self.launcher.simulated else 0


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
        from ..engines.horovod import HorovodEnvironment

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
