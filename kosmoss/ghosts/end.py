"""Ending ghosts: SIGTERM (and SIGCONT), a grace period, SIGKILL, each with its whole
process tree; the report says what ended and what that freed (GPU memory, ports)."""
from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import psutil

from ..core.errors import UsageError
from ..launch.ports import port_is_free
from ..launch.records import ProcessId
from .find import Ghost, human_bytes
from .gpu import gpu_freed, gpu_processes
from .members import is_mine, protected_pids

DEFAULT_GRACE_S = 5.0


KILL_WAIT_S = 3.0  # after SIGKILL: the kernel frees a process's memory and ports by then


POLL_S = 0.05


@dataclass
class KillReport:
    ended: List[int]
    survived: List[int]
    gpu_memory_freed_bytes: Optional[int]  # None: no GPU on this machine, nothing to free
    ports_freed: List[int]
    hosts_removed: List[str] = field(default_factory=list)  # leftover host sets' ids

    def summary(self) -> str:
        hosts = f"; removed host set(s) {', '.join(self.hosts_removed)}" \
            if self.hosts_removed else ""
        if not self.ended and not self.survived:
            return "no ghost to end" + hosts
        ports = ", ".join(map(str, self.ports_freed))
        gpu = ("" if self.gpu_memory_freed_bytes is None
               else f"{human_bytes(self.gpu_memory_freed_bytes)} of GPU memory and ")
        line = (f"ended {len(self.ended)} process(es){_pids(self.ended)}, freed {gpu}"
                f"{'port(s) ' + ports if ports else 'no port'}")
        if self.survived:
            line += f"; still alive after SIGKILL: {', '.join(map(str, self.survived))}"
        return line + hosts


def end_ghosts(ghosts: Iterable[Ghost], grace: float = DEFAULT_GRACE_S) -> KillReport:
    """End every killable ghost with its whole process tree: SIGTERM (and SIGCONT, so a
    stopped one can act on it), ``grace`` seconds, then SIGKILL. Sets ``ghost.ended``."""
    check_grace(grace)
    from .hosts import LEFTOVER_HOSTS, remove_leftover_hosts

    ghosts = list(ghosts)
    hosts_removed = remove_leftover_hosts(ghosts)  # their processes go with them
    targets = [g for g in ghosts if g.killable and g.kind != LEFTOVER_HOSTS]
    procs = _kill_set(targets)
    listening = sorted({p for g in targets for p in g.ports})
    gpu_before = gpu_processes()
    _signal(procs, signal.SIGTERM, signal.SIGCONT)
    alive = _wait_gone(procs, grace)
    _signal(alive, signal.SIGKILL)
    alive = _wait_gone(alive, KILL_WAIT_S)
    ended = sorted(pid for pid in procs if pid not in alive)
    for ghost in targets:
        ghost.ended = ghost.pid not in alive
    for ghost in ghosts:
        if ghost.kind == LEFTOVER_HOSTS and ghost.killable:
            ghost.ended = True
    from ..devices.environment import gpus

    freed = gpu_freed(gpu_before, ended, KILL_WAIT_S) if gpus() else None  # no GPU: say nothing of one
    return KillReport(ended, sorted(alive), freed,
                      [port for port in listening if port_is_free(port)], hosts_removed)


def check_grace(grace: float) -> None:
    if not (grace >= 0 and math.isfinite(grace)):
        raise UsageError(f"--grace {grace:g}: give 0 or more seconds to wait between SIGTERM "
                         "and SIGKILL")


def _kill_set(targets: List[Ghost]) -> Dict[int, psutil.Process]:
    """The targets and their descendants now, each checked again: the same process (pid and
    create time) and the user's own. Never this command or its parents."""
    procs: Dict[int, psutil.Process] = {}
    protected = protected_pids()
    for ghost in targets:
        proc = ProcessId(ghost.pid, ghost.create_time).process()
        if proc is None:
            continue
        try:
            family = [proc] + proc.children(recursive=True)
        except psutil.Error:
            family = [proc]
        for member in family:
            if member.pid not in protected and is_mine(member):
                procs[member.pid] = member
    return procs


def _signal(procs: Dict[int, psutil.Process], *signals: int) -> None:
    for proc in procs.values():
        for sig in signals:
            try:
                proc.send_signal(sig)  # psutil checks the pid still names the same process
            except psutil.Error:
                pass


def _wait_gone(procs: Dict[int, psutil.Process], timeout: float) -> Dict[int, psutil.Process]:
    """Those still alive after ``timeout``. Not psutil.wait_procs: it waits on a zombie
    whose parent does not reap it, and a zombie holds no memory and no port."""
    deadline = time.monotonic() + timeout
    alive = dict(procs)
    while alive:
        alive = {pid: p for pid, p in alive.items() if _running(p)}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pids(pids: List[int]) -> str:
    shown = ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")
    return f" (pid {shown})" if pids else ""
