"""Run learners' cells in 2 real gloo processes, several checks per launch.

``run_in_ranks([(exercise, source), ...])`` starts one ``python -m
kosmoss.exercises.distributed`` per rank. Not torch.multiprocessing's spawn: it re-runs
the parent's main script in every child (a learner's script without a ``__main__``
guard would run again) and asks the kernel for SIGINT, which a rank stuck in gloo does
not act on, when the parent dies. Here each rank asks for SIGKILL (PR_SET_PDEATHSIG) and
leaves if its parent is already gone, so no rank outlives the checker.

The ranks share one TCPStore; each check gets its own process group (a PrefixStore on
it), destroyed afterwards, so a check that breaks its group or times out leaves the next
one a clean group. Every rank writes its outcomes to a file after each check, so what
finished comes back even when a later check hangs and the launch is stopped.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

WORLD_SIZE = 2
COLLECTIVE_TIMEOUT_S = 20.0  # a rank left waiting by the other gives up after this
START_ALLOWANCE_S = 60.0  # two fresh interpreters importing torch on a busy laptop
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | raised | not-answered
    value: Any = None


def run_in_ranks(items: Sequence[Tuple[Any, str]], *, timeout_s: Optional[float] = None,
                 world_size: int = WORLD_SIZE) -> List[List[Outcome]]:
    """For each (exercise, source): the outcome on every rank."""
    from ..launch.ports import free_port

    collective_s = timeout_s or COLLECTIVE_TIMEOUT_S
    job = {"world_size": world_size, "port": free_port(), "parent": os.getpid(),
           "timeout_s": collective_s,
           "tasks": [(exercise.id, source) for exercise, source in items]}
    with tempfile.TemporaryDirectory(prefix="kosmoss-check-") as scratch:
        (Path(scratch) / "job.pkl").write_bytes(pickle.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 ranks on a laptop's few cores
        ranks = []
        for rank in range(world_size):
            with open(Path(scratch) / f"rank{rank}.err", "wb") as stderr:
                ranks.append(subprocess.Popen(
                    [sys.executable, "-m", __name__, scratch, str(rank)], env=env,
                    stdout=subprocess.DEVNULL, stderr=stderr))
        failure = _wait(ranks, START_ALLOWANCE_S + collective_s * (len(items) + 1),
                        Path(scratch))
        per_rank = [_read(Path(scratch), rank) for rank in range(world_size)]
    return [[_outcome(per_rank[rank], index, failure) for rank in range(world_size)]
            for index in range(len(items))]


def _wait(ranks: List[subprocess.Popen], limit_s: float, scratch: Path) -> Optional[str]:
    """Wait for the ranks; kill them past ``limit_s`` or on an interrupt. Returns why
    they failed, if they did."""
    deadline = time.monotonic() + limit_s
    try:
        for rank in ranks:
            rank.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return f"the {len(ranks)} processes did not finish within {limit_s:.0f} s"
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
    for index, rank in enumerate(ranks):
        if rank.returncode != 0:
            text = (scratch / f"rank{index}.err").read_text(errors="replace")
            lines = [line for line in text.splitlines() if line.strip()]
            return f"a rank failed: {lines[-1] if lines else f'exit code {rank.returncode}'}"
    return None


def _read(scratch: Path, rank: int) -> list:
    try:
        return pickle.loads((scratch / f"rank{rank}.pkl").read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        return []


def _outcome(done: list, index: int, failure: Optional[str]) -> Outcome:
    if index < len(done):
        return done[index]
    return Outcome("raised", failure or "this rank stopped before the check ran")


# ---------------------------------------------------------------- in each rank


def main(scratch: str, rank: int) -> None:
    job = pickle.loads((Path(scratch) / "job.pkl").read_bytes())
    _die_with_parent(job["parent"])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    world_size, timeout = job["world_size"], timedelta(seconds=job["timeout_s"])
    store = dist.TCPStore("127.0.0.1", job["port"], world_size, is_master=rank == 0,
                          timeout=timedelta(seconds=START_ALLOWANCE_S))
    done = []
    for index, (exercise_id, source) in enumerate(job["tasks"]):
        dist.init_process_group("gloo", store=dist.PrefixStore(f"check{index}", store),
                                rank=rank, world_size=world_size, timeout=timeout)
        try:
            done.append(_run_task(exercise_id, source, rank, world_size, job["timeout_s"]))
        finally:
            dist.destroy_process_group()
        _write(Path(scratch), rank, done)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl: nobody is waiting for us
        sys.exit(1)


def _run_task(exercise_id: str, source: str, rank: int, world_size: int,
              timeout_s: float) -> Outcome:
    from .core import LearnerRaised, NotAnswered, find, run_cell

    exercise = find(exercise_id)
    try:
        namespace = run_cell(exercise, source)
        return Outcome("ok", exercise.rank_task(namespace, rank, world_size))
    except NotAnswered as err:
        return Outcome("not-answered", str(err))
    except LearnerRaised as err:
        message = str(err)
        if "gloo" in message or "Timed out" in message:  # the transport, not the learner's
            message = (f"was left alone in a collective (the other rank did not join it "
                       f"within {timeout_s:.0f} s): every rank must call the same "
                       "collectives, in the same order")
        return Outcome("raised", message)
    except Exception as err:  # the checker's own code: say so, and let the next check run
        return Outcome("raised", f"the checker failed ({type(err).__name__}: {err}); "
                                 "please report it")


def _write(scratch: Path, rank: int, done: list) -> None:
    partial = scratch / f"rank{rank}.tmp"
    partial.write_bytes(pickle.dumps(done))
    partial.replace(scratch / f"rank{rank}.pkl")  # the parent never reads half a file


if __name__ == "__main__":
    # Through the package, so that what the ranks pickle names kosmoss's classes.
    from .distributed import main as rank_main

    rank_main(sys.argv[1], int(sys.argv[2]))
