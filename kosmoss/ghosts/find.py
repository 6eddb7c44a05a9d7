"""The verdicts: which of a run's live processes are ghosts (launcher gone, run ended, peer
died, worker orphaned, not exited), the GPU and port holders listed beside them, and why
each matters to the next run (its ``causes``)."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import psutil

from ..core.errors import UsageError
from ..launch.ports import TORCHRUN_PORT, port_holders
from ..launch.records import FINISHED, RUNNING, STOPPED, ProcessId
from .gpu import GpuUse, gpu_processes
from .members import Member, RunRecord, find_members, is_mine, protected_pids, user_of

SETTLE_S = 10.0  # after a run ends, its processes get this long to exit before they are ghosts


LAUNCHER_GONE, RUN_ENDED, PEER_DIED = "launcher-gone", "run-ended", "peer-died"


WORKER_ORPHANED, NOT_EXITED = "worker-orphaned", "not-exited"


GPU_MEMORY, PORT, NAMED = "gpu-memory", "port", "named"




KOSMOSS_GHOSTS = (LAUNCHER_GONE, RUN_ENDED, PEER_DIED, WORKER_ORPHANED, NOT_EXITED)


@dataclass
class Ghost:
    pid: int
    run_id: Optional[str]  # None: not a kosmoss process (foreign)
    kind: str  # one of KOSMOSS_GHOSTS, or gpu-memory | port | named
    reason: str
    killable: bool  # whether --kill ends it (kosmoss ghosts and --pid, the user's own only)
    mine: bool  # owned by the current user (another user's process is never ended)
    user: str
    command: str
    create_time: float
    gpu_memory_bytes: Optional[int] = None
    gpus: List[int] = field(default_factory=list)
    ports: List[int] = field(default_factory=list)  # TCP ports it listens on
    tree: List[int] = field(default_factory=list)  # its descendants, ended with it
    causes: List[str] = field(default_factory=list)  # why it matters: port, GPU, memory, parent
    rss_bytes: Optional[int] = None  # the memory ending it frees (USS where readable)
    home: Optional[str] = None  # the KOSMOSS_HOME of its run, when it is not the current one
    ended: Optional[bool] = None  # after end_ghosts: whether it is gone

    def as_dict(self) -> dict:
        return asdict(self)


def find_ghosts(port: Optional[int] = None, pids: Sequence[int] = ()) -> List[Ghost]:
    """Ghosts of the current user's kosmoss runs and, beside them, GPU memory holders.
    ``port`` or ``pids`` narrow the list to the holders of that port and those processes
    (a named pid is checked: it must exist and be the user's own; :class:`UsageError`)."""
    _check_port(port)
    named = [_named_process(pid) for pid in pids]
    now = time.time()
    members = find_members()
    gpu = gpu_processes()
    found: Dict[int, Ghost] = {}
    for member in members.values():
        verdict = _classify(member, now)
        if verdict:
            ghost = _ghost(member.proc, member.run.run_id, *verdict, killable=True)
            ghost.home = str(member.run.home) if member.run.home else None
            found[member.proc.pid] = ghost
    for pid, use in gpu.items():
        if pid not in found:
            ghost = _gpu_holder(pid, use, members.get(pid))
            if ghost:
                found[pid] = ghost
    if port is not None or named:
        found = _narrow(found, members, port, named)
    for ghost in found.values():
        _fill(ghost, gpu)
        ghost.causes = _causes(ghost, members.get(ghost.pid))
    found_hosts = [] if port is not None or named else _leftover_hosts()
    return sorted(found.values(), key=lambda g: (g.run_id is None, g.run_id or "", g.pid)) + \
        found_hosts


def _leftover_hosts() -> List[Ghost]:
    from .hosts import leftover_host_entries  # namespaces of host sets whose owner is gone

    return [Ghost(**entry) for entry in leftover_host_entries()]


def _classify(member: Member, now: float) -> Optional[Tuple[str, str]]:
    run, rec, pid = member.run, member.record, member.proc.pid
    if rec is not None and rec.get("state") != RUNNING:
        done_ago = now - float(rec.get("ended_at") or now)
        if rec.get("spawned") and done_ago > SETTLE_S:
            return NOT_EXITED, (f"run {run.run_id}: finished its part ({rec.get('state')}) "
                                f"{_ago(done_ago)} ago, never exited")
        return None  # the user's own process (a notebook, a test) lives on after its run
    ended_ago = run.ended_ago(now)
    if ended_ago is not None:
        if ended_ago > SETTLE_S:
            return RUN_ENDED, f"run {run.run_id}: {run.state} {_ago(ended_ago)} ago, still alive"
        return None
    if rec is not None and rec.get("role") == "worker":
        parent = ProcessId.from_dict(rec.get("parent"))
        if parent and not parent.is_alive():
            return WORKER_ORPHANED, (f"run {run.run_id}: data worker of pid {parent.pid}, "
                                     "which is gone")
    launcher = ProcessId.from_dict(rec.get("launcher")) if rec else (
        member.mark.launcher if member.mark else None)
    if launcher and launcher.pid != pid and not launcher.is_alive():
        kind = run.record.get("kind")
        return LAUNCHER_GONE, (f"run {run.run_id}{_elsewhere(run)}: its launcher (pid "
                               f"{launcher.pid}{', ' + kind if kind else ''}) is gone")
    dead = _dead_peer(rec, run) if rec else None
    if dead:
        state = f" ({dead['state']})" if dead.get("state") != RUNNING else ""
        return PEER_DIED, (f"run {run.run_id}: {_role(dead)} (pid {dead['pid']}) died{state}; "
                           "this one waits for it in vain")
    return None


def _elsewhere(run: RunRecord) -> str:
    """Where a run of another KOSMOSS_HOME lives, and whether that home is still there."""
    if run.home is None:
        return ""
    return f" of KOSMOSS_HOME {run.home}" + ("" if run.home.exists() else " (deleted)")


def _role(rec: dict) -> str:
    for name in ("rank", "local_rank", "node_rank"):
        if rec.get(name) is not None:
            return f"{name.replace('_', ' ')} {rec[name]}"
    return "a rank"


def _dead_peer(rec: dict, run: RunRecord) -> Optional[dict]:
    """A rank of the same attempt that died without finishing (a rank that finished or
    stopped with the others is not a reason)."""
    for peer in run.processes:
        if (peer is rec or peer.get("role") != "rank" or peer.get("attempt") != rec.get("attempt")
                or peer.get("state") in (FINISHED, STOPPED)):
            continue
        if not ProcessId.from_dict(peer).is_alive():
            return peer
    return None


def _gpu_holder(pid: int, use: GpuUse, member: Optional[Member]) -> Optional[Ghost]:
    held = f"holds {human_bytes(use.memory)} on GPU {','.join(map(str, use.gpus))}"
    try:
        proc = psutil.Process(pid)
        mine = is_mine(proc)
    except psutil.Error:  # NVML sees the host's pids: another container's process
        return Ghost(pid, None, GPU_MEMORY, f"{held}; pid not visible here (another container?)",
                     False, False, "?", "?", 0.0)
    if pid == os.getpid():
        return None
    if pid in protected_pids():
        reason = (f"{held}; a parent of this command (a notebook kernel?): free it in there "
                  "with kosmoss.release_memory()")
    elif member is not None:
        reason = f"{held}; run {member.run.run_id} is {member.run.state}: not a ghost"
    elif mine:
        reason = f"{held}; not a kosmoss run: end it with --kill --pid {pid}"
    else:
        reason = f"{held}; another user's process: kosmoss never ends it"
    return _ghost(proc, member.run.run_id if member else None, GPU_MEMORY, reason, killable=False)


def _narrow(found: Dict[int, Ghost], members: Dict[int, Member], port: Optional[int],
            named: List[psutil.Process]) -> Dict[int, Ghost]:
    """Only the holders of ``port`` and the named processes; a named one is ended by --kill."""
    chosen: Dict[int, Ghost] = {}
    holders = [pid for pid in _port_holders(port) if pid is not None] if port is not None else []
    for pid in holders:
        chosen[pid] = found.get(pid) or _other(pid, members, PORT, f"listens on port {port}")
    for proc in named:
        ghost = found.get(proc.pid) or chosen.get(proc.pid) or _other(
            proc.pid, members, NAMED, "named with --pid")
        if ghost:
            ghost.killable = True
            chosen[proc.pid] = ghost
    return {pid: ghost for pid, ghost in chosen.items() if ghost}


def _port_holders(port: int) -> List[Optional[int]]:
    try:
        return port_holders(port)
    except psutil.AccessDenied:  # macOS shows every socket to root only
        raise UsageError(f"--port {port}: this system shows who holds a port to root only; "
                         "run it with sudo") from None


def _other(pid: int, members: Dict[int, Member], kind: str, what: str) -> Optional[Ghost]:
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    member = members.get(pid)
    if member is not None:
        reason = f"{what}; part of run {member.run.run_id}, which is {member.run.state}"
    elif is_mine(proc):
        reason = f"{what}; not a kosmoss run"
    else:
        reason = f"{what}; another user's process: kosmoss never ends it"
    return _ghost(proc, member.run.run_id if member else None, kind, reason, killable=False)


def _named_process(pid: int) -> psutil.Process:
    if pid <= 0:
        raise UsageError(f"--pid {pid}: a process id is a positive number")
    try:
        proc = psutil.Process(pid)
        proc.create_time()
    except psutil.NoSuchProcess:
        raise UsageError(f"--pid {pid}: no such process; `kosmoss ghosts` lists them") from None
    except psutil.Error as err:
        raise UsageError(f"--pid {pid}: cannot read this process "
                         f"({err.__class__.__name__})") from None
    if not is_mine(proc):
        raise UsageError(f"--pid {pid}: owned by user {user_of(proc)}, not you; kosmoss never "
                         "ends another user's process")
    if pid in protected_pids():
        raise UsageError(f"--pid {pid}: that is this command or one of its parents")
    return proc


def _check_port(port: Optional[int]) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is between 1 and 65535")


def _ghost(proc: psutil.Process, run_id: Optional[str], kind: str, reason: str, *,
           killable: bool) -> Ghost:
    try:
        command = " ".join(proc.cmdline()) or proc.name()
        create_time = proc.create_time()
    except psutil.Error:
        command, create_time = "?", 0.0
    mine = is_mine(proc)
    return Ghost(proc.pid, run_id, kind, reason, killable and mine, mine, user_of(proc), command,
                 create_time)


def _fill(ghost: Ghost, gpu: Dict[int, GpuUse]) -> None:
    """Its descendants, listening ports and GPU memory (its own and its descendants')."""
    try:
        proc = psutil.Process(ghost.pid)
        family = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return
    ghost.tree = [p.pid for p in family[1:]]
    ports: Set[int] = set()
    for member in family:
        try:
            # net_connections is psutil >= 6's name for connections.
            connections = getattr(member, "net_connections", None) or member.connections
            ports |= {c.laddr.port for c in connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN and c.laddr}
        except psutil.Error:
            pass
    ghost.ports = sorted(ports)
    try:  # USS: what ending it frees (a forked worker's RSS counts pages it shares)
        ghost.rss_bytes = proc.memory_full_info().uss
    except (psutil.Error, AttributeError):
        try:
            ghost.rss_bytes = proc.memory_info().rss
        except psutil.Error:
            pass
    uses = [gpu[p.pid] for p in family if p.pid in gpu]
    if uses:
        ghost.gpu_memory_bytes = sum(use.memory for use in uses)
        ghost.gpus = sorted({index for use in uses for index in use.gpus})


def _causes(ghost: Ghost, member: Optional[Member]) -> List[str]:
    """Why the entry matters to the next run: the port it wants, the GPU memory, the RAM."""
    causes = []
    wanted = _wanted_ports(member)
    for port in ghost.ports:
        if port in wanted:
            causes.append(f"holds port {port}, {wanted[port]}: a new run on it fails with "
                          "EADDRINUSE (\"address already in use\")")
    if ghost.kind not in KOSMOSS_GHOSTS:
        return causes
    role = "data worker" if ghost.kind == WORKER_ORPHANED else \
        ((member.record or {}).get("role") if member else None) or "rank"
    orphaned = _parent_gone(ghost, member)
    who = f"orphaned {role} ({orphaned})" if orphaned else role.capitalize()
    if ghost.gpu_memory_bytes:
        causes.append(f"{who} still holding a CUDA context: {human_bytes(ghost.gpu_memory_bytes)}"
                      f" on GPU {','.join(map(str, ghost.gpus))}, given back when it ends")
    elif orphaned:
        causes.append(who)
    if ghost.kind == WORKER_ORPHANED:
        causes.append(f"data worker of a dead rank: {human_bytes(ghost.rss_bytes)} of RAM and "
                      "a core, for nobody")
        return causes
    if role == "worker":
        parent = ((member.record or {}).get("parent") or {}).get("pid")
        causes.append(f"data worker of pid {parent}, a ghost too: ended with it")
    if ghost.rss_bytes:
        causes.append(f"frees at least {human_bytes(ghost.rss_bytes)} of RAM when it ends")
    return causes


def _wanted_ports(member: Optional[Member]) -> Dict[int, str]:
    """Ports a new run is likely to want, and why."""
    wanted = {TORCHRUN_PORT: "torchrun's default MASTER_PORT"}
    here = os.environ.get("MASTER_PORT", "")
    if here.isdigit():
        wanted[int(here)] = "the MASTER_PORT set in this shell"
    if member is not None:
        ports = [member.run.record.get("master_port")] + [r.get("master_port")
                                                          for r in member.run.processes]
        for port in filter(None, ports):
            wanted[int(port)] = f"the MASTER_PORT of run {member.run.run_id}"
    return wanted


def _parent_gone(ghost: Ghost, member: Optional[Member]) -> Optional[str]:
    parent = ProcessId.from_dict((member.record or {}).get("parent")) if member else None
    if parent is not None and not parent.is_alive():
        return f"its parent, pid {parent.pid}, is gone"
    try:
        ppid = psutil.Process(ghost.pid).ppid()
    except psutil.Error:
        return None
    return "its parent is gone: pid 1 adopted it" if ppid == 1 else None


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def human_bytes(value: Optional[int]) -> str:
    """nvitop's formatting (1.0GiB, 350.0MiB), so kosmoss prints memory as nvitop does."""
    from nvitop import bytes2human

    return bytes2human(value or 0)
