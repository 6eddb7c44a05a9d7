"""Which rank is slow: a per-rank view of a live run, from the ranks' heartbeat files
(:mod:`.heartbeat`), psutil (CPU %, resident memory) and nvitop (GPU memory and
utilisation per process). It only reads: nothing is written into the run, nothing is sent
to its processes.

    kosmoss watch                 # the newest live run, refreshed every second (Ctrl-C ends)
    kosmoss watch RUN --once      # one snapshot (scripts, tests)
    kosmoss watch --once --json

A *straggler* is flagged when, compared with the median of the other ranks:

- its own work per step (``busy_ms``: data, forward, optimizer) is larger by more than
  ``threshold`` (and by at least 2 ms): under DDP every rank makes the same number of steps,
  so the slow rank is the one the others wait for in backward's all-reduce;
- or its step rate is lower by more than ``threshold`` (ranks that do not wait for each other);
- or its heartbeat is older than ``stale_s`` while the others' are fresh (stuck, or dead);
- or its process is stopped (state T in /proc: SIGSTOP, Ctrl-Z, a debugger), however fresh
  its last heartbeat.
Each rank's process state comes from /proc (psutil): running, sleeping, stopped; a rank
that has not stepped for ``NOT_STEPPING_S`` and sleeps is read with py-spy (without pausing
it): "sleeping in a collective" waits for another rank. When every heartbeat is stale and
no rank is stopped, the run is stuck as a whole: ``kosmoss stacks`` says where.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import psutil

from ..launch.records import RUNNING
from .runs import (SLEEPING, STOPPED, STOPPED_WHY, LiveRun, RunProcess, live_run_at,
                   loss_of_beat, read_heartbeats)

DEFAULT_THRESHOLD = 0.3
DEFAULT_STALE_S = 15.0
MIN_BUSY_GAP_MS = 2.0  # timer noise on a loaded machine: smaller gaps are not a straggler
CPU_SAMPLE_S = 0.5  # psutil's CPU % is measured between two readings
NOT_STEPPING_S = 3.0  # three heartbeats missed: worth asking py-spy where the rank sleeps
IN_A_COLLECTIVE = "sleeping in a collective"


@dataclass
class RankView:
    rank: Optional[int]
    pid: Optional[int]
    label: str
    state: str  # setup | train | validate | ended | failed | gone | no heartbeat
    step: Optional[int] = None
    epoch: Optional[int] = None
    samples_per_s: Optional[float] = None
    steps_per_s: Optional[float] = None
    busy_ms: Optional[float] = None
    wait_ms: Optional[float] = None
    loss: Optional[float] = None
    heartbeat_age_s: Optional[float] = None
    process: Optional[str] = None  # running | sleeping | sleeping in a collective | stopped
    waits_in: Optional[str] = None  # the collective, when it sleeps in one
    cpu_percent: Optional[float] = None
    rss_bytes: Optional[int] = None
    gpu_memory_bytes: Optional[int] = None
    gpu_sm_percent: Optional[int] = None
    workers: int = 0
    workers_cpu_percent: float = 0.0
    straggler: bool = False
    why: List[str] = field(default_factory=list)


@dataclass
class Snapshot:
    run_id: str
    run_dir: str
    state: str
    time: float
    ranks: List[RankView]
    notes: List[str]

    @property
    def stragglers(self) -> List[Optional[int]]:
        return [view.rank for view in self.ranks if view.straggler]

    def as_dict(self) -> dict:
        return {**asdict(self), "stragglers": self.stragglers}


class Sampler:
    """Keeps psutil's Process objects between snapshots: CPU % needs two readings."""

    def __init__(self) -> None:
        self._procs: Dict[int, psutil.Process] = {}

    def prime(self, run: LiveRun) -> None:
        for member in run.processes:
            self.cpu(member)

    def cpu(self, member: RunProcess) -> Optional[float]:
        proc = self._procs.get(member.pid)
        if proc is None:
            proc = member.process()
            if proc is None:
                return None
            self._procs[member.pid] = proc
        try:
            return proc.cpu_percent(interval=None)
        except psutil.Error:
            return None


def snapshot(run_dir, sampler: Sampler, threshold: float = DEFAULT_THRESHOLD,
             stale_s: float = DEFAULT_STALE_S) -> Snapshot:
    run = live_run_at(run_dir, require_alive=False)
    now = time.time()
    gpu = gpu_processes()
    views = _views(run, read_heartbeats(run.run_dir), sampler, gpu, now)
    notes = _flag_stragglers(views, threshold, stale_s)
    if not any(v.state != "no heartbeat" for v in views):
        notes.append("no heartbeat file: the run was started without kosmoss's Heartbeat "
                     "callback, or has not reached its setup yet")
    state = run.state if run.processes or run.state != RUNNING else "gone"
    return Snapshot(run.run_id, str(run.run_dir), state, now, views, notes)


def _views(run: LiveRun, beats: Dict[int, dict], sampler: Sampler, gpu: Dict[int, dict],
           now: float) -> List[RankView]:
    live = {member.pid: member for member in run.processes}
    views = []
    for rank, beat in sorted(beats.items()):
        member = live.get(beat.get("pid"))
        state = beat.get("state", "?") if member or beat.get("state") in ("ended", "failed") \
            else "gone"
        view = RankView(rank, beat.get("pid"), f"rank {rank}", state,
                        heartbeat_age_s=max(0.0, now - float(beat.get("time") or now)),
                        loss=loss_of_beat(beat),
                        **{k: beat.get(k) for k in ("step", "epoch", "samples_per_s",
                                                    "steps_per_s", "busy_ms", "wait_ms")})
        views.append(_measure(view, member, run, sampler, gpu))
    seen = {v.pid for v in views}
    for member in run.ranks:  # ranks without a heartbeat (yet)
        if member.pid not in seen:
            views.append(_measure(RankView(member.rank, member.pid, member.label, "no heartbeat"),
                                  member, run, sampler, gpu))
    return views


def _measure(view: RankView, member: Optional[RunProcess], run: LiveRun, sampler: Sampler,
             gpu: Dict[int, dict]) -> RankView:
    if member is None:
        return view
    view.process = member.state()
    if view.process == SLEEPING and (view.heartbeat_age_s or 0) > NOT_STEPPING_S:
        view.waits_in = _collective_of(member)
        view.process = IN_A_COLLECTIVE if view.waits_in else SLEEPING
    view.cpu_percent = sampler.cpu(member)
    try:
        view.rss_bytes = member.process().memory_info().rss
    except (AttributeError, psutil.Error):
        pass
    if member.pid in gpu:
        view.gpu_memory_bytes = gpu[member.pid]["memory"]
        view.gpu_sm_percent = gpu[member.pid]["sm"]
    workers = [w for w in run.processes if w.role == "worker"
               and ((w.record or {}).get("parent") or {}).get("pid") == member.pid]
    view.workers = len(workers)
    view.workers_cpu_percent = sum(sampler.cpu(w) or 0.0 for w in workers)
    return view


def _collective_of(member: RunProcess) -> Optional[str]:
    """Where a rank that does not step sleeps, if in a collective (py-spy, not pausing it)."""
    from .stacks import ProcessStacks, describe, dump

    try:
        where, waits = describe(ProcessStacks(member, dump(member.pid, nonblocking=True)))
    except Exception:  # py-spy missing, not permitted, or the process ended: no answer
        return None
    return where if waits else None


def _flag_stragglers(views: List[RankView], threshold: float, stale_s: float) -> List[str]:
    active = [v for v in views if v.state in ("setup", "train", "validate")]
    stopped = [v for v in active if v.process == STOPPED]
    stale = [v for v in active if (v.heartbeat_age_s or 0) > stale_s and v not in stopped]
    gone = [v for v in views if v.state == "gone"]
    notes = []
    for view in gone:
        _flag(view, "its process is gone, the run did not end: the others will wait for it")
    for view in stopped:
        _flag(view, f"stopped ({STOPPED_WHY.format(pid=view.pid)}): the others wait for it")
    if stopped:
        waiting = [v.label for v in active if v.process == IN_A_COLLECTIVE]
        if waiting:
            notes.append(f"{', '.join(waiting)} sleep(s) in a collective, waiting for "
                         f"{', '.join(v.label for v in stopped)}")
    elif active and len(stale) == len(active):
        notes.append(f"every rank's heartbeat is older than {stale_s:g} s: the run is stuck "
                     "(`kosmoss stacks` shows where)")
        waiting = [v for v in active if v.process == IN_A_COLLECTIVE]
        for view in (v for v in active if waiting and v.process != IN_A_COLLECTIVE):
            _flag(view, f"{view.process or 'its process'}, not in a collective, while "
                        f"{', '.join(v.label for v in waiting)} wait(s) in one for it")
    else:
        for view in stale:
            _flag(view, f"no heartbeat for {view.heartbeat_age_s:.0f} s while the others go on")
    training = [v for v in active if v.state == "train" and v not in stale and v not in stopped]
    for view in training:
        others = [o for o in training if o is not view]
        _compare(view, others, "busy_ms", threshold, higher_is_slow=True)
        _compare(view, others, "steps_per_s", threshold, higher_is_slow=False)
    return notes


def _compare(view: RankView, others: List[RankView], name: str, threshold: float,
             higher_is_slow: bool) -> None:
    mine = getattr(view, name)
    values = [getattr(o, name) for o in others if getattr(o, name) is not None]
    if mine is None or not values:
        return
    typical = statistics.median(values)
    if higher_is_slow and mine > typical * (1 + threshold) and mine - typical >= MIN_BUSY_GAP_MS:
        _flag(view, f"works {mine:.1f} ms per step against {typical:.1f} ms for the others "
                    "(they wait for it in the all-reduce)")
    elif not higher_is_slow and mine < typical * (1 - threshold):
        _flag(view, f"{mine:.2f} steps/s against {typical:.2f} for the others")


def _flag(view: RankView, why: str) -> None:
    view.straggler = True
    view.why.append(why)


def gpu_processes() -> Dict[int, dict]:
    """pid -> GPU memory (bytes) and SM utilisation (%) through nvitop; empty without NVML."""
    try:
        from nvitop import NA, Device

        from ..devices.environment import quiet_nvml

        found: Dict[int, dict] = {}
        with quiet_nvml():
            for device in Device.all():
                for pid, proc in device.processes().items():
                    use = found.setdefault(pid, {"memory": 0, "sm": None, "gpus": []})
                    memory, sm = proc.gpu_memory(), proc.gpu_sm_utilization()
                    use["memory"] += memory if memory is not NA else 0
                    use["sm"] = sm if sm is not NA else use["sm"]
                    use["gpus"].append(device.index)
        return found
    except Exception:  # no NVML (no GPU, no driver): nothing to show
        return {}


# ---- output


def table(snap: Snapshot):
    """The snapshot as a rich table (GPU and worker columns only where there is something),
    with the stragglers in red and why below it."""
    from rich.box import SIMPLE_HEAD
    from rich.console import Group as RichGroup
    from rich.table import Table
    from rich.text import Text

    on_gpu = any(v.gpu_memory_bytes is not None for v in snap.ranks)
    with_workers = any(v.workers for v in snap.ranks)
    columns = ["rank", "pid", "state", "process", "step", "samples/s", "loss", "beat",
               "busy/wait ms", "CPU %", "RSS"] + (["GPU mem", "GPU %"] if on_gpu else []) + \
        (["workers (CPU %)"] if with_workers else [])
    grid = Table(title=f"run {snap.run_id} ({snap.state}), "
                       f"{time.strftime('%H:%M:%S', time.localtime(snap.time))}",
                 box=SIMPLE_HEAD, title_justify="left")
    for column in columns:
        grid.add_column(column, no_wrap=True)
    for v in snap.ranks:
        cells = [v.label + (" *" if v.straggler else ""), _text(v.pid), v.state,
                 _text(v.process), _text(v.step),
                 _num(v.samples_per_s, 0), _num(v.loss, 4), _age(v.heartbeat_age_s),
                 _pair(v.busy_ms, v.wait_ms), _num(v.cpu_percent, 0),
                 _bytes(v.rss_bytes)]
        if on_gpu:
            cells += [_bytes(v.gpu_memory_bytes), _text(v.gpu_sm_percent)]
        if with_workers:
            cells.append(f"{v.workers} ({v.workers_cpu_percent:.0f})" if v.workers else "")
        grid.add_row(*cells, style="bold red" if v.straggler else None)
    lines = [Text(f"* {v.label} is a straggler: {'; '.join(v.why)}", style="bold red")
             for v in snap.ranks if v.straggler]
    lines += [Text(note, style="yellow") for note in snap.notes]
    return RichGroup(grid, *lines)


def console():
    """A terminal's own width; a pipe or file gets room for every column."""
    from rich.console import Console

    screen = Console(highlight=False)
    return screen if screen.is_terminal else Console(highlight=False, width=160)


def _text(value) -> str:
    return "" if value is None else str(value)


def _num(value: Optional[float], digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pair(busy: Optional[float], wait: Optional[float]) -> str:
    return "" if busy is None and wait is None else f"{_num(busy, 1)}/{_num(wait, 1)}"


def _age(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


def _bytes(value: Optional[int]) -> str:
    from nvitop import bytes2human  # the same formatting as nvitop's own view

    return "" if value is None else bytes2human(value)