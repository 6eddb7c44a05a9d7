"""A run that hangs says which rank and where, instead of waiting 30 minutes.

- :class:`StartupCheck` — a Lightning callback: in ``setup`` (after every rank has set up
  its data) all ranks meet at ``torch.distributed.monitored_barrier``; rank 0 names the
  ranks that did not arrive within the timeout, and the run fails with that name.
- :func:`is_collective_timeout` — whether an error is a collective (or rendezvous) that
  timed out: the rank that catches one calls :func:`write_stacks` and exits non-zero;
  :func:`timeout_line` says which kind (start-up check, rendezvous, a later collective).
- :func:`write_stacks` — the stacks of every live process of the run into the run
  directory (``stacks/<time>-pid<pid>.txt`` and ``.json``, as ``kosmoss stacks`` prints them).
- :func:`flight_recorder_env` — the variables that make NCCL's flight recorder dump into
  the run directory on a timeout (set before the process group starts).

    trainer = pl.Trainer(strategy=DDPStrategy(timeout=timedelta(seconds=120)),
                         callbacks=[StartupCheck(timeout_s=120)], ...)
    try:
        trainer.fit(model)
    except Exception as err:
        if is_collective_timeout(err):
            print(f"collective timeout; stacks of every rank in {write_stacks(run_dir)}")
        raise
"""
from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from ..core.errors import RunFailed
from ..run.lean import LeanCallback

FLIGHT_RECORDER_DIR = "flight-recorder"
STACKS_DIR = "stacks"
FLIGHT_RECORDER_ENTRIES = 2000  # PyTorch's own default when the recorder is on
# monitored_barrier on rank 0: "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms"
_MISSING = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier in (\d+) ?ms")
# What gloo ("Timed out waiting 4000ms for recv operation"), NCCL's watchdog ("Watchdog
# caught collective operation timeout"), the TCPStore ("Timed out after 120 seconds waiting
# for clients") and monitored_barrier say when time runs out...
_TIMEOUT_WORDS = ("timed out", "timeout", "failed to pass monitoredbarrier")
# ...and what tells them from other timeouts (a DataLoader's "timed out after 5 seconds").
_COLLECTIVE_WORDS = ("gloo", "nccl", "collective", "monitoredbarrier", "operation to complete",
                     "clients", "store", "rendezvous", "process group")


class StartupTimeout(RunFailed):
    """Some ranks never reached the start-up check."""

    def __init__(self, missing: List[int], timeout_s: float, detail: str) -> None:
        self.missing, self.timeout_s = missing, timeout_s
        names = ", ".join(map(str, missing)) or "?"
        super().__init__(f"rank{'s' if len(missing) != 1 else ''} {names} did not reach the "
                         f"start-up check within {timeout_s:g} s (stuck before training: "
                         f"loading data, or never started); monitored_barrier: {detail}")


class StartupCheck(LeanCallback):
    """All ranks meet once before training; a rank missing after ``timeout_s`` is named.

    Lightning's own barriers and DDP's first broadcast would wait for the collective
    timeout and fail without a name; ``monitored_barrier`` (gloo only) names the ranks
    that did not arrive. Under NCCL it runs on a gloo group made for it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.passed_in_s: Optional[float] = None

    def setup(self, trainer, pl_module, stage) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        began = time.monotonic()
        try:
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=self.timeout_s),
                                   wait_all_ranks=True)
        except RuntimeError as err:
            raise StartupTimeout(missing_ranks(err), self.timeout_s, _first_line(err)) from err
        self.passed_in_s = time.monotonic() - began


def missing_ranks(error: BaseException) -> List[int]:
    """The ranks a monitored_barrier error names (rank 0 sees them; the others see only that
    rank 0 gave up, and get [])."""
    found = _MISSING.search(str(error))
    return [int(rank) for rank in re.findall(r"\d+", found.group(1))] if found else []


def is_collective_timeout(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a collective, a barrier or the
    rendezvous running out of time, rather than a peer that died ("Connection closed by
    peer") or a bug."""
    return any(isinstance(each, StartupTimeout) or _says_timeout(each)
               for each in _chain(error))


def _chain(error: Optional[BaseException]) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from (Lightning and torch wrap the real one)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


# The TCPStore's rendezvous in init_process_group: "... waiting for clients. 1/2 clients joined."
_RENDEZVOUS = re.compile(r"waiting for clients\.\s*(\d+/\d+ clients joined)")


def timeout_line(error: BaseException, timeout_s: float, culprit: Optional[str] = None) -> str:
    """What a collective timeout means, in words: the start-up check names the missing
    ranks; the rendezvous says how many ranks came (a rank that started late or never);
    anything later is a collective that one rank did not reach: ``culprit`` names it
    (:func:`who_hangs`), when this host's stacks tell."""
    for each in _chain(error):
        if isinstance(each, StartupTimeout):
            return str(each)
        joined = _RENDEZVOUS.search(str(each))
        if joined:
            return (f"the ranks did not all meet at start-up within {timeout_s:g} s "
                    f"(--collective-timeout; {joined.group(1)}): a rank started late or never "
                    "(on a loaded machine importing torch can take minutes; raise the flag)")
    why = culprit or "a rank hangs or is far slower than the others"
    return f"a collective waited longer than {timeout_s:g} s (--collective-timeout): {why}"


def who_hangs(result) -> Optional[str]:
    """The rank the others wait for, from the stacks of the run's processes on this host
    (a :class:`~.stacks.RunStacks`): a stopped one (/proc says state T), else the one
    not in a collective while the others are, else ranks in different collectives (a
    deadlock); ranks all in one collective (or timed out in it too, caught writing their
    stacks) say the wait is elsewhere or in the transfer. None when this host cannot tell."""
    from .runs import STOPPED_WHY
    from .stacks import TIMED_OUT_SUMMARY, exiting

    ranks = [s for s in result.processes if s.process.role == "rank"]
    stopped = [s for s in ranks if s.stopped]
    if stopped:
        return "; ".join(f"{s.process.label} (pid {s.process.pid}) is stopped "
                         f"({STOPPED_WHY.format(pid=s.process.pid)})" for s in stopped)
    with_ranks = [g for g in result.groups if any(m.process.role == "rank" for m in g.members)
                  and not exiting(g.summary)]
    odd = [g for g in with_ranks if g.odd and not g.waits]
    if odd:
        return "; ".join(f"{g.labels} is not in a collective: {g.summary}" for g in odd)
    waiting = [g for g in with_ranks if g.waits and g.summary != TIMED_OUT_SUMMARY]
    if len(waiting) > 1 and len({g.summary for g in waiting}) > 1:
        return "the ranks wait in different collectives (a deadlock): " + "; ".join(
            f"{g.labels} {g.summary}" for g in waiting)
    first = _failed_first(result.groups)
    if first:
        return first
    if len(ranks) > 1 and waiting and all(g.waits for g in with_ranks):
        return (f"every rank seen here waits in one collective ({waiting[0].summary}) or "
                "timed out in it: a rank on another host hangs, or the transfer outlasted "
                "the timeout (a slow or cut link)")
    return None


# What a rank records when its peer ended first: a consequence, not a cause.
PEER_ENDED = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def is_consequence(error: str) -> bool:
    """A recorded failure that another rank's failure or timeout explains."""
    return any(words in error for words in PEER_ENDED + ("a collective waited longer",))


def _failed_first(groups) -> Optional[str]:
    """A rank on its way out whose record holds a failure of its own (not its peer's end,
    not a timeout): it failed before the others timed out waiting for it."""
    from .stacks import exiting

    for group in groups:
        if not exiting(group.summary):
            continue
        for member in group.members:
            lines = ((member.process.record or {}).get("error") or "").splitlines()
            if member.process.role == "rank" and lines and not is_consequence(lines[0]):
                return (f"{member.process.label} (pid {member.process.pid}) failed first and "
                        f"is exiting: {lines[0][:300]}")
    return None


def _says_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    if not any(words in text for words in _TIMEOUT_WORDS):
        return False
    # torch.distributed's DistError family (DistBackendError, DistStoreError, ...)
    distributed = any(cls.__name__.startswith("Dist") for cls in type(error).__mro__)
    return distributed or any(words in text for words in _COLLECTIVE_WORDS)


def write_stacks(run_dir: Path) -> Path:
    """Dump the stacks of every live process of the run into ``run_dir/stacks/`` (text, and
    JSON beside it) and return the text file. The caller's own stack is read in-process."""
    return dump_stacks(run_dir)[0]


def dump_stacks(run_dir: Path):
    """:func:`write_stacks`, and the stacks themselves (a :class:`~.stacks.RunStacks`)."""
    from ..core.files import atomic_write_json, atomic_write_text
    from .runs import RunProcess, live_run_at
    from .stacks import collect, render_json, render_text

    run = live_run_at(Path(run_dir), require_alive=False)
    if os.getpid() not in {member.pid for member in run.processes}:  # its record says ended
        run.processes.insert(0, RunProcess(os.getpid(), 0.0, "process", None, "this process"))
    dump = collect(run, native=False)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-pid{os.getpid()}"
    folder = Path(run_dir) / STACKS_DIR
    atomic_write_json(folder / f"{stem}.json", render_json(dump))
    return atomic_write_text(folder / f"{stem}.txt", render_text(dump)), dump


def flight_recorder_env(run_dir: Path) -> Dict[str, str]:
    """Environment for NCCL's flight recorder (torch >= 2.3): keep the last collectives of
    each rank, and on a timeout dump them to ``run_dir/flight-recorder/rank-<rank>``.
    Both spellings of each name, as torch 2.13 reads either (``TORCH_FR_*`` first); and a
    pipe per rank that dumps on demand. Read the dumps with ``python -m
    torch.distributed.flight_recorder.fr_trace DIR -p rank-`` (torch's ``torchfrtrace``).
    Creates the folder: the recorder does not."""
    folder = Path(run_dir) / FLIGHT_RECORDER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / "rank-")  # torch appends the rank
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ENABLE_MONITORING": "1",  # the dump on timeout needs the monitor thread
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        # A named pipe per rank: `echo > <run dir>/flight-recorder/dump-now-0.pipe` dumps
        # rank 0's recorder at once, while the run still hangs.
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(folder / "dump-now-"),
    }


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__
