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

Modules: :mod:`.topology` (who started us, and the world it makes), :mod:`.nodes` (simulated
nodes on this host), :mod:`.lifetime` (nothing outlives its launcher), :mod:`.ports`
(MASTER_PORT: free, busy, held by whom), :mod:`.spawn` (ranks that measure something),
:mod:`.records` (which processes belong to which run, for ``kosmoss ghosts``), :mod:`.hosts`
(simulated nodes as hosts in network namespaces), :mod:`.host_slurm` (Slurm across them),
:mod:`.host_faults` (a host lost under elastic torchrun).
"""
from .lifetime import (SPAWNER_ENV, die_with, die_with_spawner, end_groups, local_ranks_die_with_me,
                       started_by_kosmoss)
from .nodes import NodeFailure, simulate_nodes
from .ports import (check_master_addr, check_master_port, free_port, port_holder, port_holders,
                    port_is_free)
from .spawn import leave_rank, spawn_for_result, write_result
from .topology import SIMULATED_NODE_ENV, Launcher, Topology, cluster_environment, resolve

__all__ = ["SIMULATED_NODE_ENV", "SPAWNER_ENV", "Launcher", "NodeFailure", "Topology",
           "check_master_addr", "check_master_port", "cluster_environment", "die_with",
           "die_with_spawner", "end_groups", "free_port", "leave_rank", "local_ranks_die_with_me",
           "port_holder", "port_holders", "port_is_free", "resolve", "simulate_nodes", "spawn_for_result",
           "started_by_kosmoss", "write_result"]
