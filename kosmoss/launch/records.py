"""Run records: which processes belong to which run, so ``kosmoss ghosts`` can tell a
ghost from a live run. (Outside ``kosmoss.run``, which imports torch: ghosts must answer
at once.)

psutil reads a process's environment as it was at exec (``/proc/<pid>/environ``), never a
later ``os.environ`` change, so a run marks its processes twice:

- *before exec*, wherever kosmoss or Lightning starts a process (Lightning's extra ranks,
  simulated nodes, subprocesses of a rank): ``KOSMOSS_RUN_ID`` and ``KOSMOSS_RUN_LAUNCHER``
  (``<run id>:<pid>:<create time>`` of the process that started the run) in its environment.
  A rank that torchrun, srun, horovodrun or mpirun started has no such mark: it execs itself
  once with it (:func:`mark_external_rank`, before torch is imported), so that it is known
  for a kosmoss rank from any KOSMOSS_HOME, and once its home is deleted;
- *after start*, by every process that runs kosmoss training, whoever launched it (the
  process the user started, torchrun's and srun's ranks, forked data workers): a record
  ``processes/<host>-<pid>.json`` in the run directory, with its create time (a reused pid
  is another process), its launcher, its parent and its state.

``run.json`` in the run directory says who launched the run, its MASTER_PORT when known,
when it started, the run's settings (a resume takes them from here), the attempts before
this one, and its state: running | finished | failed | stopped | killed. A run ends
``killed`` when its processes died without saying so (``kill -9``, out of memory): whoever
finds it so later (``kosmoss ghosts``, a ``--resume``) records it with
:func:`settle_if_gone`. Every file is written atomically (a temporary file, then
``os.replace``).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import psutil

from ..core.files import atomic_write_json
from ..core.signals import stops_held

RUN_ID_ENV = "KOSMOSS_RUN_ID"
LAUNCHER_ENV = "KOSMOSS_RUN_LAUNCHER"
RUN_FILE = "run.json"
PROCESS_DIR = "processes"
# A failure's reason as recorded: room for a hang's diagnosis and its stacks file, not for a
# whole NCCL or gloo error text.
REASON_CHARS = 1000
RUNNING, FINISHED, FAILED, STOPPED, KILLED = "running", "finished", "failed", "stopped", "killed"
ENDED = (FINISHED, FAILED, STOPPED, KILLED)
# Launchers outside kosmoss, as their program shows in a rank's ancestry (horovodrun's
# ranks sit under a shell): the process whose death orphans the ranks.
LAUNCHER_PROGRAMS = {
    "torchrun": ("torchrun", "torch.distributed.run", "torch.distributed.launch"),
    "slurm": ("slurmstepd",),
    "horovodrun": ("horovodrun",),
    "mpirun": ("mpirun", "mpiexec", "orterun", "prterun"),
}
EXTERNAL_LAUNCHERS = tuple(LAUNCHER_PROGRAMS)
# psutil's create time has a 10 ms tick; a pid reused within this is not a real case.
SAME_PROCESS_S = 0.05


class Stopped(BaseException):
    """The run was stopped by a signal (SIGTERM, SIGINT, SIGUSR1) where it could not save a
    checkpoint: it is recorded ``stopped`` and the command exits 128 + the signal's number,
    as a shell reports a process ended by that signal. (A BaseException: ``except
    Exception`` must not swallow it, and Lightning re-raises it unchanged.)"""

    def __init__(self, signum: int, message: str = ""):
        self.signum = int(signum)
        super().__init__(message or f"stopped by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass(frozen=True)
class ProcessId:
    """A process that outlives its pid's reuse: the pid plus the time it started."""
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> "ProcessId":
        return cls(pid, psutil.Process(pid).create_time())

    @classmethod
    def from_dict(cls, data: Optional[dict]) -> Optional["ProcessId"]:
        return cls(int(data["pid"]), float(data["create_time"])) if data else None

    def as_dict(self) -> dict:
        return {"pid": self.pid, "create_time": self.create_time}

    def process(self) -> Optional[psutil.Process]:
        """The live process, or None when it is gone, a zombie, or its pid was reused."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > SAME_PROCESS_S:
                return None
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except psutil.Error:
            return None

    def is_alive(self) -> bool:
        return self.process() is not None


@dataclass(frozen=True)
class LauncherMark:
    """What ``KOSMOSS_RUN_LAUNCHER`` carries into every process started for a run."""
    run_id: str
    launcher: ProcessId

    def encode(self) -> str:
        return f"{self.run_id}:{self.launcher.pid}:{self.launcher.create_time!r}"

    @classmethod
    def decode(cls, text: Optional[str]) -> Optional["LauncherMark"]:
        try:
            run_id, pid, create_time = (text or "").rsplit(":", 2)
            return cls(run_id, ProcessId(int(pid), float(create_time)))
        except ValueError:
            return None


@dataclass(frozen=True)
class Membership:
    """This process's part in a run: what :func:`finish` updates."""
    run_dir: Path
    me: ProcessId
    launcher: ProcessId
    owns_run_file: bool
    role: str
    previous_env: Dict[str, Optional[str]]
    ending: List[str] = field(default_factory=lambda: [FINISHED], compare=False)

    def stopped(self) -> None:
        """The run stopped on a signal with a checkpoint: it ends ``stopped``."""
        self.ending[0] = STOPPED

    @property
    def record_path(self) -> Path:
        return process_record_path(self.run_dir, self.me.pid)


_current: Optional[Membership] = None
_fork_hook_installed = False


def hostname() -> str:
    return socket.gethostname()


def process_record_path(run_dir: Path, pid: int, host: Optional[str] = None) -> Path:
    # The host in the name: on a shared file system two nodes may reuse the same pid.
    return Path(run_dir) / PROCESS_DIR / f"{host or hostname()}-{pid}.json"


def start(run_dir: Path, *, kind: str, global_rank: int = 0,
          details: Optional[dict] = None) -> Membership:
    """Record this process as part of the run in ``run_dir`` (called once per process, by
    :func:`recorded`, around a run's training). ``kind`` is the topology's launcher (single,
    lightning, simulate, simulated-node, torchrun, slurm, ...); ``details`` (the run's
    settings) go into ``run.json``, where an earlier attempt's state is kept too."""
    global _current
    run_dir = Path(run_dir)
    me = ProcessId.of(os.getpid())
    inherited = LauncherMark.decode(os.environ.get(LAUNCHER_ENV))
    if inherited and inherited.run_id == run_dir.name:  # kosmoss or Lightning started us
        launcher, owner = inherited.launcher, False
    elif kind in EXTERNAL_LAUNCHERS:
        launcher, owner = _external_launcher(kind), False
    else:  # the process the user started: it launches the run
        launcher, owner = me, True
    previous = {name: os.environ.get(name) for name in (RUN_ID_ENV, LAUNCHER_ENV)}
    if owner:
        os.environ[RUN_ID_ENV] = run_dir.name
        os.environ[LAUNCHER_ENV] = LauncherMark(run_dir.name, me).encode()
    writes_run_file = global_rank == 0 and (owner or kind in EXTERNAL_LAUNCHERS)
    membership = Membership(run_dir, me, launcher, owns_run_file=writes_run_file,
                            role="launcher" if kind == "simulate" else "rank",
                            previous_env=previous)
    atomic_write_json(membership.record_path, _process_record(membership, parent=_parent()))
    if membership.owns_run_file:
        atomic_write_json(run_dir / RUN_FILE, {
            "run_id": run_dir.name, "host": hostname(), "kind": kind,
            "launcher": launcher.as_dict(), "master_port": _master_port(),
            "started_at": time.time(), "updated_at": time.time(), "ended_at": None,
            "state": RUNNING, "error": None, **(details or {}),
            "attempts": _earlier_attempts(run_dir),
        })
    _current = membership
    _install_fork_hook()
    return membership


def finish(state: str, error: Optional[str] = None, stop_signal: Optional[str] = None) -> None:
    """This process's part of the run is over: update its record (and ``run.json`` where it
    wrote it), and give the user's own process its environment back, so that what it starts
    later is not taken for part of this run. ``stop_signal``: the signal that stopped it (its
    peers stop with the same)."""
    global _current
    if _current is None:
        return
    with stops_held(DEFERRED_SIGNALS, drop=state == STOPPED):
        membership, _current = _current, None
        now = time.time()
        _update_json(membership.record_path, state=state, ended_at=now, error=error,
                     signal=stop_signal)
        if membership.owns_run_file:
            port = {"master_port": _master_port()} if _master_port() else {}  # known by now
            _update_json(membership.run_dir / RUN_FILE, state=state, ended_at=now,
                         updated_at=now, error=error, **port)
        if membership.launcher == membership.me:
            for name, value in membership.previous_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


# A stop signal (Ctrl-C pressed again) arriving while the records are written must not cut
# them in two: its handler would raise between the process's record and run.json, leaving
# the run ``running``. Held until both are written; dropped when the run is already recorded
# stopped (the same stop, pressed twice), else delivered.
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def recorded(run_dir: Path, *, kind: str, global_rank: int = 0,
             details: Optional[dict] = None) -> Iterator[Membership]:
    """This process's part of the run in ``run_dir``, from :func:`start` to :func:`finish`:
    whatever way the block ends, the records say so. Call ``membership.stopped()`` inside
    when the run was stopped by a signal (it ends ``stopped``, not ``finished``)."""
    membership = start(run_dir, kind=kind, global_rank=global_rank, details=details)
    try:
        yield membership
    except Stopped as stop:
        finish(STOPPED, str(stop), stop.signal_name)
        raise
    except KeyboardInterrupt:
        finish(STOPPED, "KeyboardInterrupt", signal.SIGINT.name)
        raise
    except BaseException as err:
        finish(FAILED, f"{type(err).__name__}: {err}"[:REASON_CHARS])
        raise
    finish(membership.ending[0])


def current() -> Optional[Membership]:
    return _current


def settle_if_gone(run_dir: Path) -> Optional[str]:
    """A run recorded ``running`` on this host whose launcher and processes are all gone was
    killed without a word (``kill -9``, out of memory): record it ``killed``. Returns the
    state it was settled to, or None (not running, still alive, or partly on other hosts,
    whose processes cannot be seen from here)."""
    run_dir = Path(run_dir)
    record = read_run(run_dir)
    if not record or record.get("state") != RUNNING:
        return None
    processes = read_processes(run_dir)
    if record.get("host") != hostname() or any(p.get("host") != hostname() for p in processes):
        return None
    members = [ProcessId.from_dict(record.get("launcher"))] + [
        ProcessId.from_dict(p) for p in processes if p.get("state") == RUNNING]
    if any(member is not None and member.is_alive() for member in members):
        return None
    now = time.time()
    try:
        for process in processes:
            if process.get("state") == RUNNING:
                _update_json(process_record_path(run_dir, process["pid"]), state=KILLED,
                             ended_at=now)
        _update_json(run_dir / RUN_FILE, state=KILLED, ended_at=now, updated_at=now,
                     error="its processes ended without recording why (kill -9, out of "
                           "memory, a crash of the machine)")
    except OSError:  # a home that cannot be written: the record stays as it was
        return None
    return KILLED


def read_run(run_dir: Path) -> Optional[dict]:
    return _read_json(Path(run_dir) / RUN_FILE)


def read_processes(run_dir: Path) -> List[dict]:
    folder = Path(run_dir) / PROCESS_DIR
    records = (_read_json(path) for path in sorted(folder.glob("*.json")))
    return [record for record in records if record]


def _process_record(membership: Membership, parent: Optional[ProcessId]) -> dict:
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT")
    return {
        "pid": membership.me.pid, "create_time": membership.me.create_time,
        "run_id": membership.run_dir.name, "host": hostname(), "role": membership.role,
        "launcher": membership.launcher.as_dict(), "parent": parent.as_dict() if parent else None,
        "spawned": membership.launcher != membership.me,
        # Ranks of one attempt: a torchrun restart or a Slurm requeue starts another.
        "attempt": f"{membership.launcher.pid}@{membership.launcher.create_time!r}#{restarts or 0}",
        "rank": _int_env("RANK", "SLURM_PROCID"), "local_rank": _int_env("LOCAL_RANK"),
        "node_rank": _int_env("NODE_RANK", "GROUP_RANK"), "master_port": _master_port(),
        "state": RUNNING, "started_at": time.time(), "ended_at": None,
    }


def _earlier_attempts(run_dir: Path) -> List[dict]:
    """A resumed run keeps what its earlier attempts were: when, and how they ended."""
    earlier = read_run(run_dir)
    if not earlier:
        return []
    last = {key: earlier.get(key) for key in ("started_at", "ended_at", "state", "error")}
    return list(earlier.get("attempts") or []) + [last]


# What each external launcher sets in its ranks, in the order detect_launcher asks.
EXTERNAL_RANK_MARKERS = (("torchrun", "TORCHELASTIC_RUN_ID"), ("horovodrun", "HOROVOD_RANK"),
                         ("slurm", "SLURM_PROCID"), ("mpirun", "OMPI_COMM_WORLD_RANK"),
                         ("mpirun", "PMI_RANK"))


def external_kind() -> Optional[str]:
    """The external launcher that started this process, from its variables alone (no torch)."""
    return next((kind for kind, variable in EXTERNAL_RANK_MARKERS if variable in os.environ),
                None)


def external_run_id(kind: str, launcher: Optional[ProcessId] = None) -> str:
    """The run id every rank of an external launcher derives alike: from the job's own id
    (Slurm: the same across a requeue, so a resume finds it; torchrun's --rdzv-id), else from
    the launcher's process (torchrun's agent; horovodrun and mpirun give no common id, so
    kosmoss's Horovod engine takes rank 0's instead: this one only marks the process)."""
    if kind == "slurm":
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ.get(
            "SLURM_JOB_ID", "0")
        return f"slurm-{job}"
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if kind == "torchrun" and elastic and elastic != "none":
        return f"torchrun-{elastic[:12]}"
    launcher = launcher or _parent() or ProcessId.of(os.getpid())
    return f"{kind}-{launcher.pid}-{launcher.create_time:.0f}"


def mark_external_rank() -> None:
    """In a rank an external launcher started: exec this same command again with the run's
    mark in its environment (the only environment others can read), same pid, before torch
    is imported (~50 ms). Nothing when the mark is there, or kosmoss or nobody started it."""
    kind = external_kind()
    if kind is None or os.environ.get(RUN_ID_ENV) or not _runs_a_kosmoss_entry():
        return
    launcher = _external_launcher(kind)
    run_id = external_run_id(kind, launcher)
    mark = {RUN_ID_ENV: run_id, LAUNCHER_ENV: LauncherMark(run_id, launcher).encode()}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **mark})
    except OSError:  # an interpreter that cannot be run again: train unmarked
        return


ENTRY_SCRIPTS = ("trainup_cpu.py", "trainup_gpu.py", "kosmoss")


def _runs_a_kosmoss_entry() -> bool:
    """This process's command is a kosmoss entry point, so running it again is training
    (``main(argv)`` called from a test's or a notebook's process is not)."""
    script = Path(sys.argv[0] if sys.argv else "")
    entry = script.name in ENTRY_SCRIPTS or script.parent.name == "kosmoss"  # python -m kosmoss
    return entry and bool(getattr(sys, "orig_argv", None))


def _external_launcher(kind: str) -> ProcessId:
    """The nearest ancestor that runs the launcher's program, else the parent."""
    me = psutil.Process()
    for proc in me.parents():
        try:
            if _runs_program(proc.cmdline(), LAUNCHER_PROGRAMS[kind]):
                return ProcessId(proc.pid, proc.create_time())
        except psutil.Error:
            continue
    return _parent() or ProcessId(me.pid, me.create_time())


def _parent() -> Optional[ProcessId]:
    try:  # pid 1 of a container has none
        return ProcessId.of(os.getppid()) if os.getppid() > 0 else None
    except psutil.Error:
        return None


def _runs_program(cmdline: List[str], names) -> bool:
    # argv[0] (slurmstepd retitles itself "slurmstepd: [job.step]"), argv[1] for a Python
    # script, or the module after `-m`.
    programs = {os.path.basename(arg).split(":")[0] for arg in cmdline[:2]}
    programs |= {cmdline[i + 1] for i, arg in enumerate(cmdline[:-1]) if arg == "-m"}
    return bool(programs & set(names))


def _install_fork_hook() -> None:
    global _fork_hook_installed
    if not _fork_hook_installed:  # hooks cannot be removed: one that reads _current
        os.register_at_fork(after_in_child=_record_forked_child)
        _fork_hook_installed = True


def _record_forked_child() -> None:
    """A data worker forked from a rank keeps the rank's exec-time environment, without the
    marks: it records itself, so it is found if the rank dies and leaves it behind."""
    global _current
    parent = _current
    if parent is None:
        return
    try:
        child = replace(parent, me=ProcessId.of(os.getpid()), owns_run_file=False,
                        role="worker", previous_env={})
        atomic_write_json(child.record_path, _process_record(child, parent=parent.me))
        _current = child
    except Exception:  # never break a data worker over its record
        _current = None


def _master_port() -> Optional[int]:
    port = os.environ.get("MASTER_PORT")
    return int(port) if port and port.isdigit() else None


def _int_env(*names: str) -> Optional[int]:
    value = next((os.environ[name] for name in names if name in os.environ), None)
    return int(value) if value and value.lstrip("-").isdigit() else None


def _update_json(path: Path, **changes) -> None:
    data = _read_json(path)
    if data is not None:
        atomic_write_json(path, {**data, **changes})


def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
