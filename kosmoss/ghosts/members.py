"""Which live processes of the current user belong to a kosmoss run, whatever its
``KOSMOSS_HOME``: by the mark in their environment, or by the run records of the current
home or of the home a mark names (:mod:`kosmoss.launch.records`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import psutil

from ..core import paths
from ..launch import records
from ..launch.records import ENDED, RUNNING, LauncherMark, ProcessId


@dataclass
class RunRecord:
    run_id: str
    record: dict  # run.json ({} when absent)
    processes: List[dict]  # this host's process records
    home: Optional[Path] = None  # set when not the current KOSMOSS_HOME

    @property
    def state(self) -> str:
        return self.record.get("state") or RUNNING

    def ended_ago(self, now: float) -> Optional[float]:
        if self.state not in ENDED:
            return None
        return now - float(self.record.get("ended_at") or self.record.get("updated_at") or now)


@dataclass
class Member:
    proc: psutil.Process
    run: RunRecord
    record: Optional[dict]  # its process record; None: known by its environment only
    mark: Optional[LauncherMark]


def load_runs(root: Path, home: Optional[Path] = None) -> Dict[str, RunRecord]:
    runs = {}
    if not root.is_dir():
        return runs
    host = records.hostname()
    for folder in root.iterdir():
        if not folder.is_dir():
            continue
        processes = [p for p in records.read_processes(folder) if p.get("host") == host]
        records.settle_if_gone(folder)  # a killed launcher's run is recorded killed
        record = records.read_run(folder)
        if processes or record:
            runs[folder.name] = RunRecord(folder.name, record or {}, processes, home)
    return runs


def find_members() -> Dict[int, Member]:
    """Live processes of the current user that belong to a kosmoss run, whatever its home:
    those carrying a run's mark in their exec-time environment (a ghost is likeliest when
    its home is gone), and those recorded in the runs of the current home or of a home such
    a mark points to. Records, where they exist, say more than the mark."""
    protected, home = protected_pids(), paths.home().resolve()
    marked = _marked_processes(protected)
    homes: Dict[Path, Dict[str, RunRecord]] = {home: load_runs(paths.runs_root())}
    for _, environ in marked:
        other = home_of(environ)
        if other not in homes:
            homes[other] = load_runs(other / "runs", home=other)
    members: Dict[int, Member] = {}
    for runs in homes.values():
        _add_recorded(members, runs, protected)
    for proc, environ in marked:
        if proc.pid in members:
            continue
        run_id, other = environ[records.RUN_ID_ENV], home_of(environ)
        run = homes[other].get(run_id) or RunRecord(run_id, {}, [], None if other == home else other)
        mark = LauncherMark.decode(environ.get(records.LAUNCHER_ENV))
        members[proc.pid] = Member(proc, run, None, mark if mark and mark.run_id == run_id
                                    else None)
    return members


def _marked_processes(protected: Set[int]) -> List[Tuple[psutil.Process, Dict[str, str]]]:
    """The user's processes whose environment carries a kosmoss run id."""
    marked = []
    for proc in psutil.process_iter():
        if proc.pid in protected or not is_mine(proc):
            continue
        environ = environ_of(proc)
        if environ.get(records.RUN_ID_ENV):
            marked.append((proc, environ))
    return marked


def _add_recorded(members: Dict[int, Member], runs: Dict[str, RunRecord], protected: Set[int]):
    for run in runs.values():
        for rec in run.processes:
            proc = ProcessId.from_dict(rec).process()
            if proc is None or proc.pid in protected or not is_mine(proc):
                continue
            previous = members.get(proc.pid)
            if previous is None or _newer(rec, previous.record):
                members[proc.pid] = Member(proc, run, rec, None)


def _newer(rec: dict, other: Optional[dict]) -> bool:
    """One process in two runs (a notebook that trained twice): the run it is in now."""
    key = lambda r: (r.get("state") == RUNNING, r.get("started_at") or 0)  # noqa: E731
    return other is None or key(rec) > key(other)


def protected_pids() -> Set[int]:
    """This process and its ancestors: never listed, never ended."""
    me = psutil.Process()
    return {me.pid} | {p.pid for p in me.parents()}


def is_mine(proc: psutil.Process) -> bool:
    try:
        return proc.uids().real == os.getuid()
    except psutil.Error:
        return False


def user_of(proc: psutil.Process) -> str:
    try:
        return proc.username()
    except (psutil.Error, KeyError):  # KeyError: a uid with no passwd entry
        try:
            return str(proc.uids().real)
        except psutil.Error:
            return "?"


def environ_of(proc: psutil.Process) -> Dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def home_of(environ: Dict[str, str]) -> Path:
    """The KOSMOSS_HOME a process runs with (its runs are ours only if it is the same)."""
    home = environ.get("KOSMOSS_HOME") or str(Path(environ.get("HOME", "~")) / ".kosmoss")
    return Path(home).expanduser().resolve()
