"""Ranks that measure something (``kosmoss comm``, the bench's DDP anatomy): spawned,
rank 0 writes the figures whole, and every rank leaves without the interpreter's
finalisation."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Callable

from ..core.signals import blocked, stops_held


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


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
    import multiprocessing
    from multiprocessing import resource_tracker

    import torch.multiprocessing as mp

    # A stop signal that lands while the ranks are spawned would cut a rank's start-up data
    # short (its EOFError traceback), or be raised before the parent holds the processes it
    # must end (they were left running, and the interpreter's exit waited for them). So it
    # is held until the ranks are started, then raised inside the try that ends them. The
    # mask holds the ranks too (they inherit it; _rank lifts it). The spawn starts
    # multiprocessing's resource tracker first, and that start unblocks both signals when it
    # ends (multiprocessing/resource_tracker.py): it is started before the hold.
    resource_tracker.ensure_running()
    earlier = set(multiprocessing.active_children())
    try:
        with stops_held(STOP_SIGNALS), blocked(STOP_SIGNALS):
            context = mp.start_processes(_rank, args=(function, *args), nprocs=nprocs,
                                         join=False, start_method="spawn")
        while not context.join():
            pass
    except mp.ProcessExitedException as failure:
        if not failure.signal_name or not os.path.exists(result):
            raise
        print(f"kosmoss: rank {failure.error_index} ended with {failure.signal_name} after "
              "its collectives had completed (tearing down); the figures are kept",
              file=sys.stderr)
    except BaseException:  # Ctrl-C, SIGTERM: torch's join ends the ranks only when one fails
        # Every child started since, not `context`'s: a spawn that fails at its third rank
        # returns no context and leaves two running.
        _end([child for child in multiprocessing.active_children() if child not in earlier])
        raise
    with open(result) as handle:
        return json.load(handle)


def _rank(rank: int, function: Callable, *args) -> None:
    # A Ctrl-C reaches the terminal's whole process group: the spawner says it once and ends
    # the ranks, instead of each rank printing its own KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held by the spawner until now
    function(rank, *args)


def _end(processes, grace_s: float = 5.0) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those left after ``grace_s``."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
