"""Ghost jobs: processes of kosmoss runs that outlived their run, and who holds the GPU or
a port.

A *ghost* is a live process of the current user that belongs to a kosmoss run, whatever its
``KOSMOSS_HOME`` (found by the mark in its environment, or by the records of the current
home or of the home its mark names: :mod:`kosmoss.launch.records`), and has no run left to serve:

- ``launcher-gone``: the process that launched the run (the script the user started,
  torchrun's agent, the simulated-node parent, slurmstepd) is gone and the run never ended;
- ``run-ended``: the run is recorded finished, failed or stopped, yet this process lives on;
- ``peer-died``: another rank of the same run died without finishing; this one waits for it
  in a collective or a rendezvous that never completes;
- ``worker-orphaned``: a data worker whose rank is gone;
- ``not-exited``: a started process that finished its part but never exited.

Listed beside them, and ended only when named with ``--pid``: processes holding GPU memory
(through nvitop's API), marked as kosmoss or foreign; the holders of ``--port N``; processes
named with ``--pid``. Another user's process is listed where it holds a GPU or the port,
never ended, whatever mark it carries.

Each entry says in ``causes`` why it matters to the next run: it holds the MASTER_PORT a new
run wants (EADDRINUSE, "address already in use"), it is an orphaned rank still holding a CUDA
context (and how much), a data worker of a dead rank, the RAM it frees when it ends.

Modules: :mod:`.members` (which live processes belong to which run, whatever their home),
:mod:`.find` (the verdicts and why each ghost matters), :mod:`.gpu` (who holds GPU memory,
through nvitop), :mod:`.end` (ending them, and what that freed).
"""
from ..launch.ports import port_is_free
from .end import DEFAULT_GRACE_S, KillReport, check_grace, end_ghosts
from .find import (GPU_MEMORY, KOSMOSS_GHOSTS, LAUNCHER_GONE, NAMED, NOT_EXITED, PEER_DIED, PORT,
                   RUN_ENDED, WORKER_ORPHANED, Ghost, find_ghosts, human_bytes)

__all__ = ["DEFAULT_GRACE_S", "GPU_MEMORY", "KOSMOSS_GHOSTS", "LAUNCHER_GONE", "NAMED",
           "NOT_EXITED", "PEER_DIED", "PORT", "RUN_ENDED", "WORKER_ORPHANED", "Ghost",
           "KillReport", "check_grace", "end_ghosts", "find_ghosts", "human_bytes",
           "port_is_free"]
