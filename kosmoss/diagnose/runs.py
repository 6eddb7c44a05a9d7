"""A run and its live processes on this host, each named the way a person asks about it
("rank 1", "data worker of rank 0", "launcher"), for ``kosmoss stacks`` and ``watch``.

The processes come from the run's records (``processes/*.json``, pid and start time, see
:mod:`kosmoss.launch.records`) and from the marks in their environment (``KOSMOSS_RUN_ID``), so
a rank that died before writing its record, or whose record was lost, is still found.
Global ranks come from the heartbeats when the ranks write them, else from the records
and the rank variables the launchers set.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from ..core import paths
from ..core.errors import UsageError
from ..launch import records
from ..launch.records import RUNNING, ProcessId

HEARTBEAT_DIR = "heartbeats"  # written by .heartbeat (which imports Lightning; this does not)
RUNNING_STATE, SLEEPING, STOPPED, GONE = "running", "sleeping", "stopped", "gone"
# psutil's names of /proc/<pid>/stat's state letter, in the words the tools print.
_STATES = {psutil.STATUS_RUNNING: RUNNING_STATE, psutil.STATUS_SLEEPING: SLEEPING,
           psutil.STATUS_DISK_SLEEP: SLEEPING, psutil.STATUS_IDLE: SLEEPING,
           psutil.STATUS_STOPPED: STOPPED, psutil.STATUS_TRACING_STOP: STOPPED,
           psutil.STATUS_ZOMBIE: GONE, psutil.STATUS_DEAD: GONE}
STOPPED_WHY = ("state T: SIGSTOP, Ctrl-Z or a debugger holds it; it makes no step until "
               "`kill -CONT {pid}`")


def process_state(proc: Optional[psutil.Process]) -> str:
    """running | sleeping | stopped | gone, as /proc/<pid>/stat says (psutil.status())."""
    if proc is None:
        return GONE
    try:
        return _STATES.get(proc.status(), SLEEPING)
    except psutil.Error:
        return GONE


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"rank-{rank}.json"


@dataclass
class RunProcess:
    pid: int
    create_time: float
    role: str  # rank | worker | launcher | process
    rank: Optional[int]  # global rank, when known
    label: str  # "rank 1", "data worker of rank 0 (pid 42)", "launcher", ...
    record: Optional[dict] = None

    def process(self) -> Optional[psutil.Process]:
        return ProcessId(self.pid, self.create_time).process()

    def state(self) -> str:
        return process_state(self.process())

    def as_dict(self) -> dict:
        return {"pid": self.pid, "role": self.role, "rank": self.rank, "label": self.label}


@dataclass
class LiveRun:
    run_id: str
    run_dir: Path
    record: dict  # run.json ({} when absent)
    processes: List[RunProcess] = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.record.get("state") or RUNNING

    @property
    def ranks(self) -> List[RunProcess]:
        return [p for p in self.processes if p.role == "rank"]


def resolve(name: Optional[str]) -> LiveRun:
    """The run named ``name`` (a run id, a unique prefix of one, or a run directory), or the
    newest run with a live process; :class:`UsageError` when there is none or it is over."""
    if name is None:
        return _newest_live()
    return live_run_at(_run_dir(name), require_alive=True)


def live_run_at(run_dir: Path, require_alive: bool = True) -> LiveRun:
    run = LiveRun(run_dir.name, run_dir, records.read_run(run_dir) or {})
    run.processes = _live_processes(run)
    if require_alive and not run.processes:
        raise UsageError(f"run {run.run_id} is not alive ({_state_words(run)}): no process of "
                         "it runs on this host; `kosmoss stacks` and `watch` look at live runs")
    return run


def read_heartbeats(run_dir: Path) -> Dict[int, dict]:
    """rank -> its latest heartbeat (see :mod:`kosmoss.diagnose.heartbeat`)."""
    beats = {}
    for path in sorted((Path(run_dir) / HEARTBEAT_DIR).glob("rank-*.json")):
        try:
            beat = json.loads(path.read_text())
            beats[int(beat["rank"])] = beat
        except (OSError, ValueError, KeyError, TypeError):
            continue  # written atomically, so only a foreign file lands here
    return beats


def loss_of_beat(beat: dict) -> Optional[float]:
    """The loss a heartbeat holds, NaN and inf included (written null, with ``loss_is``)."""
    said = beat.get("loss_is")
    return float(said) if beat.get("loss") is None and said in ("nan", "inf", "-inf") \
        else beat.get("loss")


def _run_dir(name: str) -> Path:
    given, root = Path(name).expanduser(), paths.runs_root()
    if given.is_dir() and ((given / records.RUN_FILE).exists() or
                           (given / records.PROCESS_DIR).is_dir()):
        return given
    if (root / name).is_dir():
        return root / name
    matches = sorted(p for p in root.glob(f"{name}*") if p.is_dir()) if root.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"run {name}: {len(matches)} runs start with it ("
                         f"{', '.join(p.name for p in matches[:4])}...): give more of the id")
    raise UsageError(f"run {name}: no such run in {root} (KOSMOSS_HOME={paths.home()}); "
                     f"`ls {root}` lists the runs, or give a run directory")


def _newest_live() -> LiveRun:
    root = paths.runs_root()
    folders = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    for folder in sorted(folders, key=_started_at, reverse=True):
        run = live_run_at(folder, require_alive=False)
        if run.processes:
            return run
    raise UsageError(f"no live kosmoss run in {root} (KOSMOSS_HOME={paths.home()}): start "
                     "one, name one with RUN, or set KOSMOSS_HOME to the run's home")


def _started_at(folder: Path) -> float:
    record = records.read_run(folder) or {}
    try:
        return float(record.get("started_at") or folder.stat().st_mtime)
    except OSError:
        return 0.0


def _live_processes(run: LiveRun) -> List[RunProcess]:
    """Alive processes of the run on this host: those recorded as running (or started for
    it and never exited), and those carrying its mark."""
    found: Dict[int, RunProcess] = {}
    by_pid = _ranks_from_heartbeats(run.run_dir)
    host = records.hostname()
    for rec in records.read_processes(run.run_dir):
        if rec.get("host") != host:
            continue
        # The user's own process (a notebook) lives on after its run: not part of it then.
        if rec.get("state") != RUNNING and not rec.get("spawned"):
            continue
        proc = ProcessId.from_dict(rec).process()
        if proc is not None:
            found[proc.pid] = _described(rec, proc, by_pid, run.record)
    for proc in _marked(run.run_id):
        if proc.pid not in found:
            found[proc.pid] = _from_environment(proc, by_pid)
    _name_workers(found)
    return sorted(found.values(), key=_order)


def _ranks_from_heartbeats(run_dir: Path) -> Dict[int, int]:
    return {int(b["pid"]): rank for rank, b in read_heartbeats(run_dir).items()
            if b.get("host") in (None, records.hostname()) and b.get("pid")}


def _described(rec: dict, proc: psutil.Process, by_pid: Dict[int, int],
               run_record: dict) -> RunProcess:
    role = rec.get("role") or "process"
    rank = by_pid.get(proc.pid, rec.get("rank"))
    if rank is None and role == "rank":
        rank = _rank_from_record(rec, run_record)
    return RunProcess(proc.pid, proc.create_time(), role, rank,
                      _label(role, rank, rec, proc.pid), rec)


def _rank_from_record(rec: dict, run_record: dict) -> Optional[int]:
    """Lightning's local ranks on one node: the rank is the local rank (the process the
    user started has none set: rank 0)."""
    if rec.get("node_rank") not in (None, 0) or run_record.get("kind") not in ("lightning",
                                                                                 "single"):
        return None
    if rec.get("local_rank") is not None:
        return rec["local_rank"]
    return None if rec.get("spawned") else 0


def _label(role: str, rank: Optional[int], rec: Optional[dict], pid: int) -> str:
    if rank is not None and role == "rank":
        return f"rank {rank}"
    if role == "launcher":
        return "launcher"
    if role == "rank" and rec:
        where = [f"{name.replace('_', ' ')} {rec[name]}" for name in ("node_rank", "local_rank")
                 if rec.get(name) is not None]
        return ", ".join(where) or "a rank"
    return role


def _from_environment(proc: psutil.Process, by_pid: Dict[int, int]) -> RunProcess:
    environ = _environ(proc)
    rank = by_pid.get(proc.pid)
    if rank is None and str(environ.get("RANK", "")).isdigit():
        rank = int(environ["RANK"])
    label = f"rank {rank}" if rank is not None else "process carrying the run's mark"
    return RunProcess(proc.pid, proc.create_time(), "rank" if rank is not None else "process",
                      rank, label)


def _name_workers(found: Dict[int, RunProcess]) -> None:
    for member in found.values():
        if member.role != "worker":
            continue
        parent = (member.record or {}).get("parent") or {}
        owner = found.get(parent.get("pid"))
        member.rank = owner.rank if owner else None
        member.label = (f"data worker of {owner.label}" if owner else
                        f"data worker of pid {parent.get('pid', '?')} (gone)")


def _order(member: RunProcess):
    roles = {"launcher": 0, "rank": 1, "process": 2, "worker": 3}
    rank = member.rank if member.rank is not None else 1 << 30
    return roles.get(member.role, 2), rank, member.pid


def _marked(run_id: str) -> List[psutil.Process]:
    marked = []
    for proc in psutil.process_iter():
        if _environ(proc).get(records.RUN_ID_ENV) == run_id:
            marked.append(proc)
    return marked


def _environ(proc: psutil.Process) -> Dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _state_words(run: LiveRun) -> str:
    if not run.record:
        return "no run.json"
    state = run.state
    return state if state != RUNNING else "recorded running, but its processes are gone"
