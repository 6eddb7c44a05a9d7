"""Nothing kosmoss starts outlives its starter (docs/reliability.md): simulated nodes and
the local ranks Lightning starts for kosmoss get the parent-death signal (Linux's
``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a launcher killed with ``kill -9`` takes its
ranks with it; an external launcher's ranks are left to that launcher."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator, List

from ..core.errors import RunFailed
from .topology import EXTERNAL_RANK_VARIABLES, SIMULATED_NODE_ENV, Topology

# Set while a kosmoss process lets Lightning start its other local ranks: their parent's pid.
SPAWNER_ENV = "KOSMOSS_SPAWNER_PID"


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


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
