"""Ghost jobs: processes of kosmoss runs that outlived their run, and who holds the GPU or
a port.

A *ghost* is a live process of the current user that belongs to a kosmoss run, whatever its
``KOSMOSS_HOME`` (found by the mark in its environment, or by the records of the current
home or of the home its mark names: :mod:`kosmoss.records`), and has no run left to serve:

- ``launcher-gone``: the process that launched the run (the script the user started,
  torchrun's agent, the simulated-node parent, slurmstepd) is gone and the run never ended;
- ``run-ended``: the run is recorded finished, failed or stopped, yet this process lives on;
- ``peer-died``: another rank of the same run died without finishing; this one waits for it
  in a collective or a rendezvous that never completes;
- ``worker-orphaned``: a data worker whose rank is gone;
- ``not-exited``: a started process that finished its part but never exited.

Listed beside them, and ended only when named with ``--pid``: processes holding GPU memory
(through nvitop's API), marked as kosmoss or foreign; the holders of ``--port N``; processes
named with ``--pid``. Another user's process is listed where it holds a GPU or the port,
never ended, whatever mark it carries.

Each entry says in ``causes`` why it matters to the next run: it holds the MASTER_PORT a new
run wants ("Address already in use"), it is an orphaned rank still holding a CUDA context
(and how much), a data worker of a dead rank, the RAM it frees when it ends.
"""
from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import psutil

from . import paths, records
from .errors import UsageError
from .launch import port_holders, port_is_free
from .records import ENDED, FINISHED, RUNNING, STOPPED, LauncherMark, ProcessId

SETTLE_S = 10.0  # after a run ends, its processes get this long to exit before they are ghosts
DEFAULT_GRACE_S = 5.0
KILL_WAIT_S = 3.0  # after SIGKILL: the kernel frees a process's memory and ports by then
POLL_S = 0.05
LAUNCHER_GONE, RUN_ENDED, PEER_DIED = "launcher-gone", "run-ended", "peer-died"
WORKER_ORPHANED, NOT_EXITED = "worker-orphaned", "not-exited"
GPU_MEMORY, PORT, NAMED = "gpu-memory", "port", "named"
TORCHRUN_PORT = 29500  # torchrun's default MASTER_PORT, which many scripts copy
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


@dataclass
class KillReport:
    ended: List[int]
    survived: List[int]
    gpu_memory_freed_bytes: Optional[int]  # None: no GPU on this machine, nothing to free
    ports_freed: List[int]

    def summary(self) -> str:
        if not self.ended and not self.survived:
            return "no ghost to end"
        ports = ", ".join(map(str, self.ports_freed))
        gpu = ("" if self.gpu_memory_freed_bytes is None
               else f"{human_bytes(self.gpu_memory_freed_bytes)} of GPU memory and ")
        line = (f"ended {len(self.ended)} process(es){_pids(self.ended)}, freed {gpu}"
                f"{'port(s) ' + ports if ports else 'no port'}")
        if self.survived:
            line += f"; still alive after SIGKILL: {', '.join(map(str, self.survived))}"
        return line


@dataclass
class _Run:
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
class _Member:
    proc: psutil.Process
    run: _Run
    record: Optional[dict]  # its process record; None: known by its environment only
    mark: Optional[LauncherMark]


@dataclass
class _GpuUse:
    memory: int = 0
    gpus: List[int] = field(default_factory=list)


def find_ghosts(port: Optional[int] = None, pids: Sequence[int] = ()) -> List[Ghost]:
    """Ghosts of the current user's kosmoss runs and, beside them, GPU memory holders.
    ``port`` or ``pids`` narrow the list to the holders of that port and those processes
    (a named pid is checked: it must exist and be the user's own; :class:`UsageError`)."""
    _check_port(port)
    named = [_named_process(pid) for pid in pids]
    now = time.time()
    members = _members()
    gpu = _gpu_processes()
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
    return sorted(found.values(), key=lambda g: (g.run_id is None, g.run_id or "", g.pid))


def end_ghosts(ghosts: Iterable[Ghost], grace: float = DEFAULT_GRACE_S) -> KillReport:
    """End every killable ghost with its whole process tree: SIGTERM (and SIGCONT, so a
    stopped one can act on it), ``grace`` seconds, then SIGKILL. Sets ``ghost.ended``."""
    check_grace(grace)
    targets = [g for g in ghosts if g.killable]
    procs = _kill_set(targets)
    listening = sorted({p for g in targets for p in g.ports})
    gpu_before = _gpu_processes()
    _signal(procs, signal.SIGTERM, signal.SIGCONT)
    alive = _wait_gone(procs, grace)
    _signal(alive, signal.SIGKILL)
    alive = _wait_gone(alive, KILL_WAIT_S)
    ended = sorted(pid for pid in procs if pid not in alive)
    for ghost in targets:
        ghost.ended = ghost.pid not in alive
    from .environment import gpus

    freed = _gpu_freed(gpu_before, ended) if gpus() else None  # no GPU: say nothing of one
    return KillReport(ended, sorted(alive), freed,
                      [port for port in listening if port_is_free(port)])


# ---- who belongs to which run


def _load_runs(root: Path, home: Optional[Path] = None) -> Dict[str, _Run]:
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
            runs[folder.name] = _Run(folder.name, record or {}, processes, home)
    return runs


def _members() -> Dict[int, _Member]:
    """Live processes of the current user that belong to a kosmoss run, whatever its home:
    those carrying a run's mark in their exec-time environment (a ghost is likeliest when
    its home is gone), and those recorded in the runs of the current home or of a home such
    a mark points to. Records, where they exist, say more than the mark."""
    protected, home = _protected(), paths.home().resolve()
    marked = _marked_processes(protected)
    homes: Dict[Path, Dict[str, _Run]] = {home: _load_runs(paths.runs_root())}
    for _, environ in marked:
        other = _home_of(environ)
        if other not in homes:
            homes[other] = _load_runs(other / "runs", home=other)
    members: Dict[int, _Member] = {}
    for runs in homes.values():
        _add_recorded(members, runs, protected)
    for proc, environ in marked:
        if proc.pid in members:
            continue
        run_id, other = environ[records.RUN_ID_ENV], _home_of(environ)
        run = homes[other].get(run_id) or _Run(run_id, {}, [], None if other == home else other)
        mark = LauncherMark.decode(environ.get(records.LAUNCHER_ENV))
        members[proc.pid] = _Member(proc, run, None, mark if mark and mark.run_id == run_id
                                    else None)
    return members


def _marked_processes(protected: Set[int]) -> List[Tuple[psutil.Process, Dict[str, str]]]:
    """The user's processes whose environment carries a kosmoss run id."""
    marked = []
    for proc in psutil.process_iter():
        if proc.pid in protected or not _is_mine(proc):
            continue
        environ = _environ(proc)
        if environ.get(records.RUN_ID_ENV):
            marked.append((proc, environ))
    return marked


def _add_recorded(members: Dict[int, _Member], runs: Dict[str, _Run], protected: Set[int]):
    for run in runs.values():
        for rec in run.processes:
            proc = ProcessId.from_dict(rec).process()
            if proc is None or proc.pid in protected or not _is_mine(proc):
                continue
            previous = members.get(proc.pid)
            if previous is None or _newer(rec, previous.record):
                members[proc.pid] = _Member(proc, run, rec, None)


def _newer(rec: dict, other: Optional[dict]) -> bool:
    """One process in two runs (a notebook that trained twice): the run it is in now."""
    key = lambda r: (r.get("state") == RUNNING, r.get("started_at") or 0)  # noqa: E731
    return other is None or key(rec) > key(other)


def _classify(member: _Member, now: float) -> Optional[Tuple[str, str]]:
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


def _elsewhere(run: _Run) -> str:
    """Where a run of another KOSMOSS_HOME lives, and whether that home is still there."""
    if run.home is None:
        return ""
    return f" of KOSMOSS_HOME {run.home}" + ("" if run.home.exists() else " (deleted)")


def _role(rec: dict) -> str:
    for name in ("rank", "local_rank", "node_rank"):
        if rec.get(name) is not None:
            return f"{name.replace('_', ' ')} {rec[name]}"
    return "a rank"


def _dead_peer(rec: dict, run: _Run) -> Optional[dict]:
    """A rank of the same attempt that died without finishing (a rank that finished or
    stopped with the others is not a reason)."""
    for peer in run.processes:
        if (peer is rec or peer.get("role") != "rank" or peer.get("attempt") != rec.get("attempt")
                or peer.get("state") in (FINISHED, STOPPED)):
            continue
        if not ProcessId.from_dict(peer).is_alive():
            return peer
    return None


# ---- GPU memory, ports, named processes


def _gpu_processes() -> Dict[int, _GpuUse]:
    """pid -> GPU memory it holds, through nvitop's API; empty without NVML (no GPU)."""
    try:
        from nvitop import Device

        from .environment import quiet_nvml

        uses: Dict[int, _GpuUse] = {}
        with quiet_nvml():
            for device in Device.all():
                for pid, proc in device.processes().items():
                    use = uses.setdefault(pid, _GpuUse())
                    memory = proc.gpu_memory()
                    use.memory += memory if isinstance(memory, int) else 0
                    use.gpus.append(device.index)
        return uses
    except Exception:  # NVML missing or broken: there is no GPU memory to hold
        return {}


def _gpu_holder(pid: int, use: _GpuUse, member: Optional[_Member]) -> Optional[Ghost]:
    held = f"holds {human_bytes(use.memory)} on GPU {','.join(map(str, use.gpus))}"
    try:
        proc = psutil.Process(pid)
        mine = _is_mine(proc)
    except psutil.Error:  # NVML sees the host's pids: another container's process
        return Ghost(pid, None, GPU_MEMORY, f"{held}; pid not visible here (another container?)",
                     False, False, "?", "?", 0.0)
    if pid == os.getpid():
        return None
    if pid in _protected():
        reason = (f"{held}; a parent of this command (a notebook kernel?): free it in there "
                  "with kosmoss.release_memory()")
    elif member is not None:
        reason = f"{held}; run {member.run.run_id} is {member.run.state}: not a ghost"
    elif mine:
        reason = f"{held}; not a kosmoss run: end it with --kill --pid {pid}"
    else:
        reason = f"{held}; another user's process: kosmoss never ends it"
    return _ghost(proc, member.run.run_id if member else None, GPU_MEMORY, reason, killable=False)


def _narrow(found: Dict[int, Ghost], members: Dict[int, _Member], port: Optional[int],
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


def _other(pid: int, members: Dict[int, _Member], kind: str, what: str) -> Optional[Ghost]:
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    member = members.get(pid)
    if member is not None:
        reason = f"{what}; part of run {member.run.run_id}, which is {member.run.state}"
    elif _is_mine(proc):
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
    if not _is_mine(proc):
        raise UsageError(f"--pid {pid}: owned by user {_user(proc)}, not you; kosmoss never "
                         "ends another user's process")
    if pid in _protected():
        raise UsageError(f"--pid {pid}: that is this command or one of its parents")
    return proc


def check_grace(grace: float) -> None:
    if not (grace >= 0 and math.isfinite(grace)):
        raise UsageError(f"--grace {grace:g}: give 0 or more seconds to wait between SIGTERM "
                         "and SIGKILL")


def _check_port(port: Optional[int]) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is between 1 and 65535")


# ---- ending processes


def _kill_set(targets: List[Ghost]) -> Dict[int, psutil.Process]:
    """The targets and their descendants now, each checked again: the same process (pid and
    create time) and the user's own. Never this command or its parents."""
    procs: Dict[int, psutil.Process] = {}
    protected = _protected()
    for ghost in targets:
        proc = ProcessId(ghost.pid, ghost.create_time).process()
        if proc is None:
            continue
        try:
            family = [proc] + proc.children(recursive=True)
        except psutil.Error:
            family = [proc]
        for member in family:
            if member.pid not in protected and _is_mine(member):
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


def _gpu_freed(before: Dict[int, _GpuUse], ended: List[int]) -> int:
    """GPU memory the ended processes held, once NVML no longer lists them."""
    held = {pid: before[pid].memory for pid in ended if pid in before}
    deadline = time.monotonic() + KILL_WAIT_S
    while held and time.monotonic() < deadline and set(held) & set(_gpu_processes()):
        time.sleep(0.2)
    still = _gpu_processes()
    return sum(memory for pid, memory in held.items() if pid not in still)


# ---- small helpers


def _ghost(proc: psutil.Process, run_id: Optional[str], kind: str, reason: str, *,
           killable: bool) -> Ghost:
    try:
        command = " ".join(proc.cmdline()) or proc.name()
        create_time = proc.create_time()
    except psutil.Error:
        command, create_time = "?", 0.0
    mine = _is_mine(proc)
    return Ghost(proc.pid, run_id, kind, reason, killable and mine, mine, _user(proc), command,
                 create_time)


def _fill(ghost: Ghost, gpu: Dict[int, _GpuUse]) -> None:
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


def _causes(ghost: Ghost, member: Optional[_Member]) -> List[str]:
    """Why the entry matters to the next run: the port it wants, the GPU memory, the RAM."""
    causes = []
    wanted = _wanted_ports(member)
    for port in ghost.ports:
        if port in wanted:
            causes.append(f"holds port {port}, {wanted[port]}: a new run on it fails with "
                          "\"Address already in use\"")
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


def _wanted_ports(member: Optional[_Member]) -> Dict[int, str]:
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


def _parent_gone(ghost: Ghost, member: Optional[_Member]) -> Optional[str]:
    parent = ProcessId.from_dict((member.record or {}).get("parent")) if member else None
    if parent is not None and not parent.is_alive():
        return f"its parent, pid {parent.pid}, is gone"
    try:
        ppid = psutil.Process(ghost.pid).ppid()
    except psutil.Error:
        return None
    return "its parent is gone: pid 1 adopted it" if ppid == 1 else None


def _protected() -> Set[int]:
    """This process and its ancestors: never listed, never ended."""
    me = psutil.Process()
    return {me.pid} | {p.pid for p in me.parents()}


def _is_mine(proc: psutil.Process) -> bool:
    try:
        return proc.uids().real == os.getuid()
    except psutil.Error:
        return False


def _user(proc: psutil.Process) -> str:
    try:
        return proc.username()
    except (psutil.Error, KeyError):  # KeyError: a uid with no passwd entry
        try:
            return str(proc.uids().real)
        except psutil.Error:
            return "?"


def _environ(proc: psutil.Process) -> Dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _home_of(environ: Dict[str, str]) -> Path:
    """The KOSMOSS_HOME a process runs with (its runs are ours only if it is the same)."""
    home = environ.get("KOSMOSS_HOME") or str(Path(environ.get("HOME", "~")) / ".kosmoss")
    return Path(home).expanduser().resolve()


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


def _pids(pids: List[int]) -> str:
    shown = ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")
    return f" (pid {shown})" if pids else ""
