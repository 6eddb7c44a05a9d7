"""Where every process of a run is right now: py-spy dumps, identical stacks grouped, and the
odd one out named.

    kosmoss stacks                     # the newest live run
    kosmoss stacks RUN --native        # with C/C++ frames (gloo, NCCL, the DDP reducer)
    kosmoss stacks RUN --json --out stacks.json

A hang in data-parallel training is nearly always one rank somewhere else while the
others wait for it in a collective: "rank 0: all_reduce of the gradients (DDP) ← backward;
rank 1: `time.sleep(5)` in training_step". py-spy reads another process's stack with
ptrace (the process pauses for a moment, nothing else changes); this process's own stack
is read in-process.
"""
from __future__ import annotations

import functools
import json
import linecache
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..core.errors import UsageError
from .runs import RUNNING_STATE, STOPPED, STOPPED_WHY, LiveRun, RunProcess, read_heartbeats

_HERE = Path(__file__).parent
FRESH_S = 5.0  # a heartbeat this recent: the run is still making steps
ATTACH_TRIES, ATTACH_BACKOFF_S = 6, 0.1  # about 4 s at most for another reader to finish
DUMP_TIMEOUT_S = 60.0  # py-spy takes ~1 s per process; far more on a loaded machine
PARALLEL_DUMPS = 8
# torch.distributed's collectives, as their Python function names.
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv",
               "batch_isend_irecv", "init_process_group", "new_group", "wait"}
# DDP's own collectives, by the Python function that calls into C.
DDP_COLLECTIVES = {"_distributed_broadcast_coalesced": "broadcast of the buffers (DDP)",
                   "_sync_params_and_buffers": "broadcast of the parameters (DDP start-up)",
                   "_verify_param_shape_across_processes": "check of the parameter shapes "
                                                           "(DDP start-up)"}
# A rank whose own collective timed out, caught writing its stacks as this one reads them.
TIMED_OUT_TOO = "_stacks_on_timeout"  # kosmoss.run.train
TIMED_OUT_SUMMARY = "timed out in a collective too, writing its stacks"
# A main thread with no Python frame: the interpreter is finalising (or not started yet).
NO_PYTHON_FRAME = "no Python frame: exiting, or not started yet"
# A main thread whose outermost frame is not the program's: the main module has returned
# or raised, and atexit or weakref finalisers run (torch's `_del_library`).
PROGRAM_FRAMES = ("<module>", "_run_module_as_main", "_run_code", "run_path", "spawn_main")
EXITING = "exiting: "
# Native frames of a collective: c10d (process groups, DDP's reducer), gloo, NCCL.
NATIVE_COLLECTIVE = ("c10d::", "gloo::", "nccl", "ProcessGroup")
# Frames worth naming on the way out of a stack: where in Lightning's loop a rank is.
LANDMARKS = ("training_step", "validation_step", "test_step", "predict_step", "backward",
             "optimizer_step", "setup", "prepare_data", "teardown", "_next_data", "fit",
             "validate", "test", "init_process_group", "setup_environment")


class PtraceDenied(UsageError):
    """py-spy may not attach: say why and what to do."""


@dataclass(frozen=True)
class Frame:
    name: str  # qualified function name (py-spy's), or a native symbol
    filename: str
    line: int
    native: bool = False

    @property
    def function(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def short(self) -> str:
        return self.name if self.native and not self.line else \
            f"{self.name} ({_short_path(self.filename)}:{self.line})"

    def as_dict(self) -> dict:
        return {"name": self.name, "filename": self.filename, "line": self.line,
                "native": self.native}


@dataclass
class Thread:
    name: str
    os_thread_id: int
    frames: List[Frame]  # innermost first, as py-spy prints them

    def as_dict(self) -> dict:
        return {"name": self.name, "os_thread_id": self.os_thread_id,
                "frames": [f.as_dict() for f in self.frames]}


@dataclass
class ProcessStacks:
    process: RunProcess
    threads: List[Thread] = field(default_factory=list)
    error: Optional[str] = None
    state: str = RUNNING_STATE  # running | sleeping | stopped | gone (/proc)

    @property
    def stopped(self) -> bool:
        return self.state == STOPPED

    @property
    def main(self) -> Optional[Thread]:
        """The thread that runs the training loop: the one whose id is the pid."""
        mains = [t for t in self.threads if t.os_thread_id == self.process.pid]
        return (mains or self.threads or [None])[0]


@dataclass
class Group:
    members: List[ProcessStacks]
    summary: str  # one line: where they are
    waits: bool  # in a collective: waiting for the other ranks
    odd: bool = False
    why_odd: str = ""

    @property
    def labels(self) -> str:
        return ", ".join(f"{m.process.label} (pid {m.process.pid})" for m in self.members)


@dataclass
class RunStacks:
    run: LiveRun
    processes: List[ProcessStacks]
    groups: List[Group]
    native: bool
    tool: str  # "py-spy 0.4.3"
    moving_s: Optional[float] = None  # age of the newest training heartbeat, when fresh


def find_py_spy() -> str:
    """py-spy of this environment (beside the interpreter: a venv's bin need not be on
    PATH), else the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if not found:
        raise UsageError("py-spy is missing: `pip install py-spy` (a kosmoss dependency) in "
                         f"the environment of {sys.executable}")
    return found


def collect(run: LiveRun, native: bool = False, strict: bool = False) -> RunStacks:
    """Every live process's stack (in parallel: each py-spy waits on its own process).
    ``strict``: a missing permission or py-spy raises :class:`UsageError`; otherwise the
    failure is kept as the process's ``error`` (for :func:`~.hang.write_stacks`)."""
    try:
        py_spy = find_py_spy()
    except UsageError as err:
        if strict:
            raise
        py_spy, tool = None, str(err)
    else:
        tool = _version(py_spy)

    mine = own_threads()  # in the calling thread: it may be handling the error to explain

    def one(member: RunProcess) -> ProcessStacks:
        state = member.state()
        try:
            if member.pid == os.getpid():
                return ProcessStacks(member, mine, state=state)
            if py_spy is None:
                return ProcessStacks(member, error=tool, state=state)
            # A stopped process cannot be paused to be read: read it as it stands.
            threads = dump(member.pid, native, py_spy, nonblocking=state == STOPPED)
            return ProcessStacks(member, threads, state=state)
        except PtraceDenied as err:
            if strict:
                raise
            return ProcessStacks(member, error=str(err), state=state)
        except StackError as err:
            return ProcessStacks(member, error=str(err), state=state)

    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_DUMPS, len(run.processes)))) as pool:
        dumped = list(pool.map(one, run.processes))
    return RunStacks(run, dumped, group(dumped), native, tool, _moving(run))


def _moving(run: LiveRun) -> Optional[float]:
    """How long ago a rank last reported a step, when that is recent: the run is not stuck,
    and an odd one out is only a moment's difference."""
    ages = [time.time() - float(beat.get("time") or 0) for beat in
            read_heartbeats(run.run_dir).values() if beat.get("state") == "train"]
    return min(ages) if ages and min(ages) < FRESH_S else None


class StackError(Exception):
    """One process's stack could not be read (it ended meanwhile, py-spy failed)."""


def dump(pid: int, native: bool = False, py_spy: Optional[str] = None,
         nonblocking: bool = False) -> List[Thread]:
    """py-spy's dump of ``pid``. ``nonblocking``: read it without pausing it (py-spy's
    pause fails on a stopped process; a moving one may then read torn)."""
    command = [py_spy or find_py_spy(), "dump", "--pid", str(pid), "--json"]
    if native:
        command.append("--native")
    if nonblocking:
        command.append("--nonblocking")
    for attempt in range(ATTACH_TRIES):
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise StackError(f"pid {pid}: py-spy did not answer within {DUMP_TIMEOUT_S:g} s"
                             ) from None
        if done.returncode == 0:
            break
        failure = _failure(pid, (done.stderr or done.stdout).strip())
        if not isinstance(failure, PtraceDenied):
            raise failure
        tracer = _tracer_of(pid)
        if attempt == ATTACH_TRIES - 1:
            raise failure if not tracer else StackError(
                f"pid {pid}: another process ({tracer}) is attached to it, and ptrace lets "
                "one at a time; run it again once that one is done")
        # Ranks that time out together read each other at once: the kernel refuses the
        # second tracer with the EPERM of a missing right. Wait for the first to detach.
        time.sleep(ATTACH_BACKOFF_S * (attempt + 1) * (1 + random.random()))
    try:
        return [_thread(raw) for raw in json.loads(done.stdout)]
    except (ValueError, KeyError, TypeError) as err:
        raise StackError(f"pid {pid}: py-spy's answer is not the JSON expected ({err})") from None


def stacks_text(pids: Iterable[int], native: bool = False) -> str:
    """Every thread's stack of each process, as text for a failure message (a hang that
    must explain itself); a process that cannot be read says why."""
    lines = []
    for pid in pids:
        try:
            threads = dump(pid, native=native)
        except (StackError, UsageError, OSError) as err:
            lines.append(f"pid {pid}: {err}")
            continue
        for thread in threads:
            frames = "\n    ".join(frame.short() for frame in thread.frames[:25])
            lines.append(f"pid {pid}, thread {thread.name}:\n    {frames}")
    return "\n".join(lines)


def _failure(pid: int, message: str) -> Exception:
    lowered = message.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return PtraceDenied(f"pid {pid}: no permission to attach with ptrace ({_ptrace_hint()})")
    first = next((line for line in message.splitlines() if line.strip()), "no output")
    if "no such file" in lowered or "check that the process is running" in lowered:
        return StackError(f"pid {pid}: ended before its stack was read")
    return StackError(f"pid {pid}: py-spy failed: {first}")


def _tracer_of(pid: int) -> str:
    """The process attached to ``pid`` with ptrace ("pid N, py-spy"), or "" for none."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        tracer = int(re.search(r"^TracerPid:\s*(\d+)", status, re.M).group(1))
    except (OSError, AttributeError, ValueError):
        return ""
    if not tracer:
        return ""
    try:
        name = Path(f"/proc/{tracer}/comm").read_text().strip()
    except OSError:
        name = "gone since"
    return f"pid {tracer}, {name}"


def _ptrace_hint() -> str:
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    try:
        value = scope.read_text().strip()
    except OSError:
        value = None
    if value not in (None, "0"):
        return (f"{scope} is {value}: run `sudo kosmoss stacks`, or allow it with "
                f"`echo 0 | sudo tee {scope}`")
    return ("run it as the user who owns the run or with sudo; in a container, start it with "
            "`--cap-add SYS_PTRACE` (docker) so it may trace")


def own_threads() -> List[Thread]:
    """This process's Python stacks, read without ptrace (a process cannot trace itself).
    Called while an exception is handled (a collective timed out), the calling thread's
    stack is where that exception was raised: the frames below the handler included."""
    names = {t.ident: (t.name, t.native_id) for t in threading.enumerate()}
    handled = sys.exc_info()[1]
    threads = []
    for ident, frame in sys._current_frames().items():
        name, native_id = names.get(ident, (f"thread {ident}", ident))
        summary = traceback.extract_stack(frame)
        if ident == threading.get_ident() and handled is not None:
            summary = _raised_at(handled)
            name += f" (handling {type(handled).__name__})"
        frames = [Frame(f.name, f.filename, f.lineno or 0) for f in reversed(summary)]
        if ident == threading.get_ident() and handled is None:  # reading it is no news
            while len(frames) > 1 and Path(frames[0].filename).parent == _HERE:
                frames.pop(0)
        threads.append(Thread(name, native_id or ident, frames))
    return threads


def _raised_at(error: BaseException) -> traceback.StackSummary:
    """The frames from the program's start down to where ``error`` was raised, and further
    down into the error it was raised from (``raise X from err``: where ``err`` happened)."""
    tb = error.__traceback__
    frames = list(traceback.extract_stack(tb.tb_frame.f_back)) if tb else []
    frames += traceback.extract_tb(tb)
    cause = error.__cause__ or error.__context__
    while cause is not None and cause.__traceback__ is not None:
        deeper = traceback.extract_tb(cause.__traceback__)
        if not (frames and deeper and (frames[-1].filename, frames[-1].name) ==
                (deeper[0].filename, deeper[0].name)):
            break  # raised elsewhere, not below the frame that handled it
        frames = frames[:-1] + list(deeper)
        cause = cause.__cause__ or cause.__context__
    return traceback.StackSummary.from_list(frames)


def _thread(raw: dict) -> Thread:
    frames = [Frame(f["name"], f.get("filename") or "", int(f.get("line") or 0),
                    native=f.get("module") is not None) for f in raw["frames"]]
    return Thread(raw.get("thread_name") or "", int(raw.get("os_thread_id") or 0), frames)


def _version(py_spy: str) -> str:
    try:
        return subprocess.run([py_spy, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "py-spy"
    except (OSError, subprocess.SubprocessError):
        return "py-spy"


# ---- grouping and naming


def group(dumped: Sequence[ProcessStacks]) -> List[Group]:
    """Processes whose main threads have the same frames, together; then the odd one out."""
    by_key: Dict[Tuple, List[ProcessStacks]] = {}
    for stacks in dumped:
        by_key.setdefault(_signature(stacks), []).append(stacks)
    groups = [Group(sorted(members, key=_rank_order), *describe(members[0]))
              for members in by_key.values()]
    _mark_odd(groups)
    return sorted(groups, key=lambda g: min(_rank_order(m) for m in g.members))


def describe(stacks: ProcessStacks) -> Tuple[str, bool]:
    """One line for a stack, innermost first, and whether it waits in a collective:
    "all_reduce of the gradients (DDP) ← backward ← optimizer_step". A stopped process
    says so first: it waits for nothing, nothing runs in it."""
    if stacks.stopped:
        where, _ = describe(ProcessStacks(stacks.process, stacks.threads, stacks.error))
        return f"stopped ({STOPPED_WHY.format(pid=stacks.process.pid)}), at {where}", False
    if stacks.error:
        return stacks.error, False
    thread = stacks.main
    if thread is None or not thread.frames:
        return NO_PYTHON_FRAME, False
    python = [f for f in thread.frames if not f.native]
    where, waits, start = _where(thread.frames, python)
    if not waits and python and python[-1].function not in PROGRAM_FRAMES:
        return f"{EXITING}{where} ← {python[-1].function}", False
    outer = _landmarks(python[start:], skip=where)
    return " ← ".join([where] + outer), waits


def _where(frames: List[Frame], python: List[Frame]) -> Tuple[str, bool, int]:
    """What the innermost frames do; the index in ``python`` where the caller chain begins."""
    native = [f for f in frames if f.native and any(k in f.name for k in NATIVE_COLLECTIVE)]
    for index, frame in enumerate(python):
        if _in_torch_distributed(frame) and frame.function in COLLECTIVES:
            caller = next((f for f in python[index + 1:] if not _in_torch_distributed(f)), None)
            by = f" from {caller.name}" if caller else ""
            return f"in {frame.function} (torch.distributed){by}", True, index + 1
        # torch 2.13 keeps DDP's start-up broadcasts in torch/distributed/utils.py.
        if frame.function in DDP_COLLECTIVES and ("torch/nn/parallel/" in frame.filename
                                                  or _in_torch_distributed(frame)):
            return DDP_COLLECTIVES[frame.function], True, index + 1
        if frame.function == TIMED_OUT_TOO and "kosmoss" in frame.filename:
            return TIMED_OUT_SUMMARY, True, index + 1
        if frame.function in ("_engine_run_backward", "run_backward") and \
                ("Reducer" in " ".join(f.name for f in native) or not native):
            # DDP's reducer all-reduces gradient buckets inside backward; without native
            # frames that is the best guess for a rank blocked there.
            return "all_reduce of the gradients (DDP)", True, index + 1
    if native:
        return f"in {native[0].name}", True, 0
    if not python:
        return f"in {frames[0].name}", False, 0
    # The innermost frame of the program or a library, not of Python's own modules: its line
    # says what it waits for (`index_queue.get(...)` in a data worker).
    index = next((i for i, f in enumerate(python) if not _in_stdlib(f)), 0)
    inner = python[index]
    code = linecache.getline(inner.filename, inner.line).strip() if inner.line else ""
    at = f"{inner.name} ({_short_path(inner.filename)}:{inner.line})"
    return (f"`{code}` in {at}" if code else f"in {at}"), False, index + 1


def _landmarks(frames: List[Frame], skip: str, most: int = 2) -> List[str]:
    named: List[str] = []
    for frame in frames:
        name = frame.function
        if name == "_bootstrap" and "multiprocessing" in frame.filename:
            break  # a forked process: the frames beyond are its parent's, copied at fork
        if name in LANDMARKS and name not in named and name not in skip:
            named.append(name)
        if len(named) == most:
            break
    return named


def _in_torch_distributed(frame: Frame) -> bool:
    return "torch/distributed/" in frame.filename.replace(os.sep, "/")


def _in_stdlib(frame: Frame) -> bool:
    """A frame of Python's own modules (there Python waits for what the caller asked)."""
    if frame.filename.startswith("<"):  # <frozen runpy>, <string>
        return frame.filename.startswith("<frozen")
    path = frame.filename.replace(os.sep, "/")
    return "/site-packages/" not in path and any(path.startswith(root + "/")
                                                 for root in _stdlib_roots())


@functools.lru_cache(maxsize=1)
def _stdlib_roots() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({Path(paths[name]).as_posix() for name in ("stdlib", "platstdlib")})


def _signature(stacks: ProcessStacks) -> Tuple:
    if stacks.stopped or stacks.error or stacks.main is None:
        return (stacks.state, "error", stacks.process.pid)
    # Native addresses (0x7f...) differ between processes: leave them out.
    return tuple((f.name, f.filename, f.line) for f in stacks.main.frames
                 if not f.name.startswith("0x"))


def _mark_odd(groups: List[Group]) -> None:
    """The rank(s) the others wait for: stopped; else not in a collective while the rest
    are; else the one group smaller than all the others."""
    stopped = [g for g in groups if any(m.process.role == "rank" and m.stopped
                                        for m in g.members)]
    for g in stopped:
        g.odd, g.why_odd = True, "stopped: it makes no step, the other ranks wait for it"
    if stopped:
        return
    # An exiting rank may be one another's timeout ended: no sign of whom the rest wait for.
    ranked = [g for g in groups if any(m.process.role == "rank" and not m.error
                                       for m in g.members) and not exiting(g.summary)]
    if len(ranked) < 2:
        return
    waiting = [g for g in ranked if g.waits]
    working = [g for g in ranked if not g.waits]
    if waiting and working:
        for g in working:
            g.odd, g.why_odd = True, "not in a collective: the other ranks wait for it"
        return
    ranked = [g for g in ranked if g.summary != TIMED_OUT_SUMMARY]  # caught reading, not odd
    if len(ranked) < 2:
        return
    sizes = sorted(len(g.members) for g in ranked)
    if sizes[0] < sizes[1]:
        smallest = min(ranked, key=lambda g: len(g.members))
        smallest.odd, smallest.why_odd = True, "the only rank(s) with this stack"


def exiting(summary: str) -> bool:
    """A process on its way out: a timeout of another rank may be what ended it."""
    return summary == NO_PYTHON_FRAME or summary.startswith(EXITING)


def _rank_order(stacks: ProcessStacks):
    member = stacks.process
    roles = {"launcher": 0, "rank": 1, "process": 2, "worker": 3}
    return roles.get(member.role, 2), member.rank if member.rank is not None else 1 << 30, \
        member.pid


def _short_path(filename: str) -> str:
    """``torch/autograd/graph.py`` for site-packages, the file name for the rest."""
    parts = filename.replace(os.sep, "/").split("/")
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1:])
    return parts[-1]


# ---- output


def render_text(result: RunStacks) -> str:
    run = result.run
    lines = [f"run {run.run_id} ({run.record.get('kind') or 'run'}, {run.state}): "
             f"{len(result.processes)} process(es), {len(result.groups)} different stack(s); "
             f"{result.tool}" + (", native frames" if result.native else "")]
    if result.moving_s is not None:
        lines.append(_moving_line(result))
    lines.append("")
    for g in result.groups:
        mark = f"   <-- odd one out: {g.why_odd}" if g.odd else ""
        lines.append(f"{g.labels}: {g.summary}{mark}")
    for g in result.groups:
        if g.members[0].threads:
            lines += ["", f"== {g.labels}" + (" (identical stacks)" if len(g.members) > 1
                                              else "")]
            lines += thread_lines(g.members[0])
    return "\n".join(lines) + "\n"


def _moving_line(result: RunStacks) -> str:
    """A fresh step says the run moves, unless a rank has stopped since: then it waits."""
    ago = f"a rank reported a step {result.moving_s:.1f} s ago"
    stopped = [m.process for m in result.processes if m.process.role == "rank" and m.stopped]
    if not stopped:
        return f"{ago}: the run moves, and these stacks are one moment of it"
    names = ", ".join(f"{p.label} (pid {p.pid})" for p in stopped)
    pids = " ".join(str(p.pid) for p in stopped)
    return (f"{ago}, but {names} {'is' if len(stopped) == 1 else 'are'} stopped: the other "
            f"ranks wait for {'it' if len(stopped) == 1 else 'them'} (`kill -CONT {pids}`)")


def thread_lines(stacks: ProcessStacks) -> List[str]:
    """Every thread of one process, the main thread first, innermost frame first."""
    lines = []
    for thread in sorted(stacks.threads, key=lambda t: t.os_thread_id != stacks.process.pid):
        lines.append(f"  thread {thread.os_thread_id} \"{thread.name or 'unnamed'}\"")
        lines += [f"      {frame.short()}" for frame in thread.frames
                  if not frame.name.startswith("0x")]
    return lines


def render_json(result: RunStacks) -> dict:
    run = result.run
    return {
        "run_id": run.run_id, "run_dir": str(run.run_dir), "state": run.state,
        "tool": result.tool, "native": result.native, "last_step_s_ago": result.moving_s,
        "groups": [{"members": [m.process.as_dict() for m in g.members], "summary": g.summary,
                    "waits_in_collective": g.waits, "odd_one_out": g.odd, "why": g.why_odd,
                    "state": g.members[0].state}
                   for g in result.groups],
        "processes": [{**s.process.as_dict(), "error": s.error, "state": s.state,
                       "threads": [t.as_dict() for t in s.threads]} for s in result.processes],
    }
