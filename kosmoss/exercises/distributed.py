"""Run learners' cells in fresh processes: the distributed exercises at 2, 3 and 4 gloo
ranks, the others in one process; every exercise within :data:`EXERCISE_TIMEOUT_S`.

``run_checks([(exercise, source), ...])`` starts one launch of as many ``python -m
kosmoss.exercises.distributed`` processes as the largest world size asked for (4), and
runs every check in it: a check at 2 or 3 ranks uses the first processes and the others
wait (importing torch costs seconds per process; one launch of 4 is cheaper than one per
world size). The exercises judged in one process run last, in process 0.

Not torch.multiprocessing's spawn: it re-runs the parent's main script in every child (a
learner's script without a ``__main__`` guard would run again) and asks the kernel for
SIGINT, which a rank stuck in gloo does not act on, when the parent dies. Here each
process asks for SIGKILL (PR_SET_PDEATHSIG) and leaves if its parent is already gone.

What a cell can do to the checker, and what the learner is told (one line each, and the
next exercises are still checked, in a new launch):

- loop forever, or wait for a rank that never comes: stopped after
  :data:`EXERCISE_TIMEOUT_S` for the exercise (all its world sizes together); a rank left
  alone in a collective gives up after :data:`COLLECTIVE_TIMEOUT_S` and says so;
- end its own process (``os._exit``, a signal): the exercise it was running is named;
- print megabytes: past :data:`PRINT_LIMIT_BYTES` in one exercise the check is stopped
  (what the processes print is never shown: a checker answers in one line; the last
  :data:`TAIL_BYTES` of stderr are kept to explain a crash).

Each check at one world size gets its own process group (a prefix of one TCPStore, whose
port rank 0 gets from the kernel and writes down for the others), destroyed afterwards;
all processes meet at a barrier after it, so a rank that waits for the next check never
waits on a slow one. Every process writes its outcomes to a file after each check, so what
finished comes back when a later check is stopped.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

EXERCISE_TIMEOUT_S = 120.0  # one exercise, all its world sizes: many times what a checker takes
COLLECTIVE_TIMEOUT_S = 60.0  # a rank left waiting in a collective by the others gives up
START_ALLOWANCE_S = 180.0  # fresh interpreters importing torch on a busy laptop
PRINT_LIMIT_BYTES = 2 ** 20  # what one exercise's processes may print (a debug print is fine)
TAIL_BYTES = 4096
POLL_S = 0.1
END_MARK_START, END_MARK_END = b"\x1ekosmoss-task-done:", b"\x1e\n"  # never typed by a learner
END_MARK = re.compile(re.escape(END_MARK_START) + rb"(\d+)" + re.escape(END_MARK_END))
END_MARK_MAX = len(END_MARK_START) + 8 + len(END_MARK_END)
PARTIAL_MARK = re.compile(  # what a chunk may end with while its mark is not complete
    b"|".join(re.escape(END_MARK_START[:n]) for n in range(1, len(END_MARK_START)))
    + b"|" + re.escape(END_MARK_START) + rb"\d*\x1e?")
RANK_PREFIX = re.compile(r"^(\s*\[rank\d+\]:)+")  # torch.distributed's excepthook
PR_SET_PDEATHSIG = 1
STOPPED = ("raised", "not-answered", "used-reference")  # no point in a larger world size
LEFT_ALONE = "was left alone in a collective"


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | raised | not-answered | used-reference | skipped
    value: Any = None


@dataclass(frozen=True)
class Task:
    item: int  # index into the caller's items
    exercise_id: str
    source: str
    world_size: int  # 0: judged in one process


@dataclass
class Checked:
    """What came back for one (exercise, source): per world size (0 for an exercise
    judged in one process), every rank's outcome; or why the exercise could not finish."""

    outcomes: Dict[int, List[Outcome]] = field(default_factory=dict)
    failure: Optional[str] = None


def run_checks(items: Sequence[Tuple[Any, str]], *, collective_timeout_s: Optional[float] = None,
               exercise_timeout_s: Optional[float] = None) -> List[Checked]:
    """Run every (exercise, source) in fresh processes; one :class:`Checked` each."""
    limits = (collective_timeout_s or COLLECTIVE_TIMEOUT_S,
              exercise_timeout_s or EXERCISE_TIMEOUT_S)
    checked = [Checked() for _ in items]
    pending = _tasks(items)
    while pending:
        finished, failure = _launch(pending, *limits)
        for task, outcomes in zip(pending, finished):
            checked[task.item].outcomes[task.world_size] = outcomes
        if failure is None:
            break
        item, why = failure
        checked[item].failure = why
        pending = [task for task in pending[len(finished):] if task.item != item]
    return checked


def _tasks(items: Sequence[Tuple[Any, str]]) -> List[Task]:
    spread = [Task(i, exercise.id, source, size) for i, (exercise, source) in enumerate(items)
              if exercise.distributed for size in exercise.world_sizes]
    here = [Task(i, exercise.id, source, 0) for i, (exercise, source) in enumerate(items)
            if not exercise.distributed]
    return spread + here  # process 0 judges the others once the ranks are done


# ---------------------------------------------------------------- in the checker


def _launch(tasks: List[Task], collective_s: float, exercise_s: float):
    """One launch for ``tasks``: (every rank's outcomes of each task finished, in order;
    (item, why) of the exercise that stopped the launch, or None)."""
    processes = max([task.world_size for task in tasks] + [1])
    job = {"processes": processes, "parent": os.getpid(),
           "collective_s": collective_s, "tasks": tasks}
    with tempfile.TemporaryDirectory(prefix="kosmoss-check-") as folder:
        scratch = Path(folder)
        (scratch / "job.pkl").write_bytes(pickle.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # several ranks on a laptop's few cores
        ranks = [subprocess.Popen([sys.executable, "-m", __name__, folder, str(rank)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for rank in range(processes)]
        tails = [(_Tail(rank.stdout), _Tail(rank.stderr)) for rank in ranks]
        try:
            failure = _watch(ranks, tails, tasks, scratch, exercise_s)
        finally:
            _end(ranks)
        per_rank = [_read(scratch, rank) for rank in range(processes)]
    finished = min(len(done) for done in per_rank)
    outcomes = [[per_rank[rank][t] for rank in range(tasks[t].world_size or 1)]
                for t in range(finished)]
    return outcomes, failure


def _watch(ranks, tails, tasks: List[Task], scratch: Path, exercise_s: float):
    """Follow the launch task by task; stop it when an exercise runs past its time or a
    process ends before the last task. Returns (item, why) of that exercise, or None."""
    started = time.monotonic()
    current, since = None, None
    while True:
        counts = [_count(scratch, rank) for rank in range(len(ranks))]
        ended = _ended(ranks, counts, len(tasks), tails)
        if ended is not None:  # counted before the poll: it may have finished since, and left
            counts = [_count(scratch, rank) for rank in range(len(ranks))]
            ended = _ended(ranks, counts, len(tasks), tails)
        if ended is not None:
            rank, code = ended
            said = tails[rank][1].last_line()
            if counts[rank] is None:  # it never started: no learner's code ran yet
                return tasks[0].item, (f"the checker's process {rank} could not start "
                                       f"(exit code {code}: {said or 'no message'})")
            return tasks[min(counts[rank], len(tasks) - 1)].item, _ended_why(rank, code, said)
        running = None if None in counts or min(counts) == len(tasks) else \
            tasks[min(counts)].item
        if running is not None and running != current:
            current, since = running, time.monotonic()
        flooded = _flooded(tails, len(tasks))
        if flooded is not None:
            return tasks[flooded].item, (f"printed more than {PRINT_LIMIT_BYTES // 2 ** 20} MiB:"
                                         " the checker shows none of it — take the prints out "
                                         "of the loops")
        if None in counts:  # still importing torch, meeting at the store
            if time.monotonic() - started > START_ALLOWANCE_S:
                return tasks[0].item, (f"the checker's processes did not start within "
                                       f"{START_ALLOWANCE_S:.0f} s (a very busy machine?)")
        elif min(counts) == len(tasks):
            return None
        elif time.monotonic() - since > exercise_s:
            return current, (f"did not finish within {exercise_s:.0f} s (the checker's time "
                             "for one exercise): does your code loop forever, or wait for a "
                             "rank that never calls the same collective?")
        time.sleep(POLL_S)


def _flooded(tails, tasks: int) -> Optional[int]:
    """The task whose processes printed more than PRINT_LIMIT_BYTES, if one did."""
    printed = collections.Counter()
    for pair in tails:
        for tail in pair:
            for task, count in list(tail.by_task.items()):  # one C call: its reader adds keys
                printed[task] += count
    over = [task for task, count in printed.items() if count > PRINT_LIMIT_BYTES]
    return min(min(over), tasks - 1) if over else None


# What gloo says in a rank whose peer had gone: that rank's end is the consequence, not the cause.
PEER_GONE = ("by peer", "caused by a remote worker")


def _ended(ranks, counts, total: int, tails=None):
    """(rank, exit code) of a process that ended before its last task, if one did. Of
    several, the likeliest cause: one killed by a signal, then one that gloo did not end
    for a peer that had gone, then the lowest rank."""
    ended = []
    for rank, (process, count) in enumerate(zip(ranks, counts)):
        code = process.poll()
        if code is not None and (count or 0) < total:  # its results are in: not a failure
            ended.append((rank, code))
    if not ended:
        return None

    def consequence(rank_code) -> tuple:
        said = tails[rank_code[0]][1].last_line() if tails else ""
        return rank_code[1] >= 0, any(text in said for text in PEER_GONE), rank_code[0]

    return min(ended, key=consequence)


def _ended_why(rank: int, code: int, last_line: str) -> str:
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"exited with code {code}")
    said = f" ({last_line})" if last_line else ""
    if "gloo" in last_line and "size" in last_line:  # gloo's own check on a message
        return (f"gloo ended the checker's process {rank}: a rank received a message of "
                "another size than the buffer it gave recv — the ranks disagree on which "
                f"chunk they exchange{said}")
    return (f"the checker's process {rank} {how} while running your code{said}: does your "
            "cell end its own process (os._exit, sys.exit in a thread, a signal)?")


def _end(ranks) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.kill()
    for rank in ranks:
        rank.wait()


def _count(scratch: Path, rank: int) -> Optional[int]:
    """Tasks rank ``rank`` has finished; None until it has started."""
    try:
        return int((scratch / f"rank{rank}.count").read_text())
    except (OSError, ValueError):
        return None


def _read(scratch: Path, rank: int) -> list:
    """The outcomes rank ``rank`` counted (one it was appending when it died is not)."""
    done = []
    with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
        with open(scratch / f"rank{rank}.pkl", "rb") as outcomes:
            for _ in range(_count(scratch, rank) or 0):
                done.append(pickle.load(outcomes))
    return done


class _Tail:
    """The last bytes a process writes to a pipe, and how many it wrote during each task
    (split at the marks :func:`_mark_end` writes), read as it writes: it never blocks on
    a full pipe, and megabytes of output cost no memory."""

    def __init__(self, pipe):
        self._kept = b""
        self._pending = b""  # the start of a mark the next chunk may complete
        self.task = 0
        self.by_task: Dict[int, int] = collections.Counter()
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            self._take(self._pending + chunk)
        self._take(self._pending, final=True)
        pipe.close()

    def _take(self, data: bytes, final: bool = False) -> None:
        start = 0
        for mark in END_MARK.finditer(data):
            self._count(data[start:mark.start()])
            self.task = int(mark.group(1)) + 1
            start = mark.end()
        data = data[start:]
        cut = len(data) if final else _mark_start(data)
        self._count(data[:cut])
        self._pending = data[cut:]

    def _count(self, data: bytes) -> None:
        self.by_task[self.task] += len(data)
        self._kept = (self._kept + data)[-TAIL_BYTES:]

    def last_line(self) -> str:
        self._thread.join(timeout=1)
        text = self._kept.decode(errors="replace")
        # torch's excepthook prefixes every line with "[rankN]: " (once per process group
        # the process made): the words after the prefixes are the message.
        lines = [RANK_PREFIX.sub("", line).strip() for line in text.splitlines()]
        lines = [line for line in lines if line]
        return lines[-1][:200] if lines else ""


def _mark_start(data: bytes) -> int:
    """Where an end mark the next chunk may complete starts in ``data`` (its length if
    none does)."""
    window = max(0, len(data) - END_MARK_MAX)
    for cut in range(window, len(data)):
        if data[cut] == END_MARK_START[0] and PARTIAL_MARK.fullmatch(data[cut:]):
            return cut
    return len(data)


def _mark_end(index: int) -> None:
    """After task ``index``: flush what it printed, then mark its end on both streams, so
    that the checker charges every byte before the mark to that task (polling the counts
    would charge a quick task's flood to the one before it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C code's buffered prints (printf) too
    mark = END_MARK_START + f"{index}".encode() + END_MARK_END
    for fd in (1, 2):
        os.write(fd, mark)


# ---------------------------------------------------------------- in each process


def main(scratch: str, rank: int) -> None:
    folder = Path(scratch)
    job = pickle.loads((folder / "job.pkl").read_bytes())
    _die_with_parent(job["parent"])
    import torch

    torch.set_num_threads(1)
    processes = job["processes"]
    store = _meet(folder, rank, processes) if processes > 1 else None
    done: List[Outcome] = []
    _write(folder, rank, done)
    gc.freeze()
    for index, task in enumerate(job["tasks"]):
        done.append(_run_task(task, index, rank, store, job["collective_s"]))
        _mark_end(index)
        _set_aside_what_came_before()
        if task.world_size:
            _barrier(store, index, processes)
        _write(folder, rank, done)


def _meet(folder: Path, rank: int, processes: int):
    """The launch's store: rank 0 listens on a port the kernel picks and writes it down,
    the others read it. A port picked free by the checker beforehand could be taken (by
    another launch, or as a connection's local port) before rank 0, seconds later, bound it."""
    import torch.distributed as dist

    allowance = timedelta(seconds=START_ALLOWANCE_S)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, processes, is_master=True,
                              wait_for_workers=False, timeout=allowance)
        partial = folder / "port.tmp"
        partial.write_text(str(store.port))
        partial.replace(folder / "port")
        return store
    deadline = time.monotonic() + START_ALLOWANCE_S
    while not (folder / "port").is_file():
        if time.monotonic() > deadline:
            sys.exit(f"rank 0 did not start its store within {START_ALLOWANCE_S:.0f} s")
        time.sleep(0.05)
    port = int((folder / "port").read_text())
    return dist.TCPStore("127.0.0.1", port, processes, is_master=False, timeout=allowance)


def _run_task(task: Task, index: int, rank: int, store, collective_s: float) -> Outcome:
    import torch.distributed as dist

    if task.world_size == 0:
        return _judge_here(task) if rank == 0 else Outcome("skipped")
    if rank >= task.world_size or store.check([f"stop{task.item}"]):
        return Outcome("skipped")
    hook = sys.excepthook  # init_process_group wraps it anew each time: one task, one wrap
    dist.init_process_group("gloo", store=dist.PrefixStore(f"task{index}", store), rank=rank,
                            world_size=task.world_size, timeout=timedelta(seconds=collective_s))
    try:
        with _torchrun_variables(rank, task.world_size):
            outcome = _rank_task(task, rank, collective_s)
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
    if outcome.kind in STOPPED:
        store.set(f"stop{task.item}", outcome.kind)
    return outcome


def ranks_per_node(world_size: int) -> int:
    """The ranks a node holds in the checkers' worlds: two nodes where the ranks split
    evenly (2 ranks: 2 nodes x 1; 4 ranks: 2 nodes x 2), one node of 3, so that an answer
    that reads LOCAL_RANK or LOCAL_WORLD_SIZE where the global ones are meant is wrong."""
    return world_size // 2 if world_size % 2 == 0 else world_size


@contextlib.contextmanager
def _torchrun_variables(rank: int, world_size: int):
    """The variables torchrun sets for a rank, for this task only: an answer that reads
    ``os.environ["WORLD_SIZE"]``, as code under torchrun or Lightning may, finds what
    ``dist.get_world_size()`` says."""
    per_node = ranks_per_node(world_size)
    names = {"RANK": rank, "LOCAL_RANK": rank % per_node, "WORLD_SIZE": world_size,
             "LOCAL_WORLD_SIZE": per_node}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(value) for name, value in names.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _set_aside_what_came_before() -> None:
    """What a task left in reference cycles (a learner's DDP, its process group's sockets)
    ends now, and the rest is frozen out of the collector's sight: a checker's
    ``gc.collect()`` (lesson 9b's, after each step, to tell a dropped handle from a kept
    one) then scans only its own task's objects, not torch's: 0.04 s a task instead of
    1.7 s, measured on 09b.buckets's reference."""
    gc.collect()
    gc.freeze()


def _barrier(store, index: int, processes: int) -> None:
    """Every process finishes check ``index`` before any starts the next (the checker
    stops a launch that waits too long)."""
    if store.add(f"end{index}", 1) == processes:
        store.set(f"go{index}", "1")
    store.wait([f"go{index}"], timedelta(days=1))


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl: nobody is waiting for us
        sys.exit(1)


def _guarded(task: Task, judge) -> Outcome:
    """Run ``judge`` on the cell; what the learner's code did becomes an Outcome."""
    from .core import LearnerRaised, NotAnswered, find
    from .guard import UsedReference, guarding

    exercise = find(task.exercise_id)
    try:
        with guarding(exercise.forbidden):
            return Outcome("ok", judge(exercise))
    except NotAnswered as err:
        return Outcome("not-answered", str(err))
    except UsedReference as err:
        return Outcome("used-reference", str(err))
    except LearnerRaised as err:
        return Outcome("raised", str(err))
    except Exception as err:  # the checker's own code: say so, and let the next check run
        return Outcome("raised", f"the checker failed ({type(err).__name__}: {err}); "
                                 "please report it")


def _judge_here(task: Task) -> Outcome:
    from .core import run_cell

    return _guarded(task, lambda exercise: exercise.judge(run_cell(exercise, task.source)))


def _rank_task(task: Task, rank: int, collective_s: float) -> Outcome:
    from .core import run_cell

    outcome = _guarded(task, lambda exercise: exercise.rank_task(
        run_cell(exercise, task.source), rank, task.world_size))
    if outcome.kind == "raised" and ("gloo" in outcome.value or "Timed out" in outcome.value):
        # The transport's words, not the learner's: say what happened.
        return Outcome("raised", f"{LEFT_ALONE} (the other ranks did not "
                                 f"join it within {collective_s:.0f} s): every rank must call "
                                 "the same collectives, in the same order")
    return outcome


def _write(scratch: Path, rank: int, done: list) -> None:
    """Append the outcomes of ``done`` not yet written, then the new count. Appending, not
    rewriting the whole list: re-pickling every earlier outcome after each task made the
    tests' launch of 255 tasks spend 64 of its 103 s here."""
    written = _count(scratch, rank) or 0
    with open(scratch / f"rank{rank}.pkl", "ab") as outcomes:
        for outcome in done[written:]:
            pickle.dump(outcome, outcomes)
    partial = scratch / f"rank{rank}.count.tmp"
    partial.write_text(str(len(done)))
    partial.replace(scratch / f"rank{rank}.count")  # counts only outcomes written whole


if __name__ == "__main__":
    # Through the package, so that what the ranks pickle names kosmoss's classes.
    from .distributed import main as rank_main

    rank_main(sys.argv[1], int(sys.argv[2]))
