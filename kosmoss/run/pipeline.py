"""``run(config)``: prepare, then train and report, with this process's run record around
them; or, for simulated nodes, start the node processes that do it.

A signal before training can checkpoint (SIGTERM, SIGUSR1, Ctrl-C while the data loads or
the ranks meet) ends the run ``stopped`` with exit code 128 + the signal's number and one
line, never a traceback; once training runs, SIGTERM and SIGUSR1 stop every rank at one
step with a checkpoint (kosmoss.run.preemption) and the exit code is 0.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

from pytorch_lightning.utilities import rank_zero_only
from rich.console import Console

from .. import launch
from ..core.errors import EXIT_FAILURE, RunFailed, UsageError
from ..core.files import read_json
from ..core.output import silence_stdout
from ..core.signals import restore
from ..data.store import verify_checksums
from ..diagnose.hang import PEER_ENDED
from ..launch import records
from .allocator import pin_malloc_thresholds
from .config import RunConfig
from .divergence import Diverged, diverged_line
from .plan import RunPlan, prepare
from .report import ResultNotWritten, report
from .train import train

__all__ = ["run", "prepare", "train", "report", "run_from_command_line"]

START_UP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def say(message: str) -> None:
    """Print once per run: from global zero only (Lightning's rank-zero rule)."""
    if rank_zero_only.rank == 0:
        _RunConsole(highlight=False, soft_wrap=True).print(message, markup=False)


class _RunConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits 1 (SystemExit): a run that trained and stopped cleanly, whose
        # launcher had gone, was recorded failed. The caller decides (_Lines).
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class _Lines:
    """A run's lines, to ``echo``. Standard output that cannot take them before the run
    starts (``> /dev/full``, ``| head -3``) is bad input: one line, exit 2, nothing run.
    Once the run is under way, a reader that goes away (its launcher ended, a pipe's
    reader left) leaves the run to end as it would, recorded so: its lines go nowhere."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo, self.started, self.lost = echo, False, False

    def __call__(self, line: str) -> None:
        if self.lost:
            return
        try:
            self.echo(line)
        except OSError as err:
            silence_stdout()
            if not self.started:
                raise UsageError(f"standard output cannot be written ({err.strerror}): send "
                                 "it to a terminal or a file that takes it") from None
            self.lost = True


def run_from_command_line(prog: str, config: RunConfig) -> None:
    """:func:`run` for a launcher: a run stopped by a signal says so in one line and exits
    128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM). The process the user
    started speaks for the run: the ranks and nodes kosmoss started record why they ended
    and exit without a word."""
    speaks = not launch.started_by_kosmoss()
    try:
        run(config)
    except records.Stopped as stop:
        _ignore_stop_signals()  # this process ends now: a Ctrl-C pressed again must not cut it
        if speaks:
            print(f"{prog}: {stop}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except RunFailed as failure:
        if speaks and getattr(failure, "speaks", True):  # a divergence: global zero's line
            raise
        raise SystemExit(EXIT_FAILURE) from None


def run(config: RunConfig, *, echo: Callable[[str], None] = say) -> dict:
    """Check everything, then train. Bad input raises a UsageError before anything is
    written (only a missing preset dataset is prepared)."""
    launch.die_with_spawner()  # a local rank whose starter died leaves at once
    pin_malloc_thresholds()  # batch-sized buffers are reused, not faulted in every step
    echo = _Lines(echo)
    with signals_stop_the_run():
        plan = prepare(config, log=echo)
        rank_zero_only.rank = plan.topology.global_rank  # Lightning sets the same, later
        if plan.topology.launcher is not launch.Launcher.SIMULATED_NODE:
            for line in plan.describe():  # the node processes' parent already said it all
                echo(line)
        echo.started = True
        if plan.is_global_zero:  # the last input check: from here on, things are written
            verify_checksums(plan.dataset, trust_unchanged=True)  # records in it what matched
        if plan.launches_nodes:
            return simulate(plan, echo)
        with records.recorded(plan.run_dir, kind=plan.topology.launcher.value,
                              global_rank=plan.topology.global_rank,
                              details=run_details(plan)) as membership:
            with _stopped_said(plan), launch.local_ranks_die_with_me(plan.topology):
                outcome = train(plan)
            if outcome.stopped_by:
                membership.stopped()
            result, unwritten = _reported(plan, outcome, echo)
        if unwritten is not None:
            raise unwritten  # one line, once the run is recorded as trained
        _requeue(plan, outcome, echo)
        return result


def _reported(plan: RunPlan, outcome, echo: Callable[[str], None]):
    """(result, None), or (None, the error) when a result file could not be written: the
    run is recorded as it ended all the same."""
    try:
        return report(plan, outcome, echo=echo), None
    except ResultNotWritten as unwritten:
        return None, unwritten


def _requeue(plan: RunPlan, outcome, echo: Callable[[str], None]) -> None:
    """Last: Slurm ends the job's tasks with SIGTERM as soon as it is requeued, and this
    attempt has nothing left to do but exit (0)."""
    if not outcome.stopped_by:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # restored when run() returns
    job = outcome.requeue()
    if job:
        echo(f"requeued Slurm job {job}: it resumes from {plan.run_dir / 'checkpoints'}")


def run_details(plan: RunPlan) -> dict:
    """What run.json keeps of the run's settings: a resume continues with them."""
    return {"config": plan.config.as_dict(), "world_size": plan.scaling.world_size}


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """Until training installs its own handlers (a checkpoint at the next step), a stop
    signal raises :class:`kosmoss.launch.records.Stopped`: the records end ``stopped``, the local
    ranks and simulated nodes end with this process, and the user reads one line."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers: a run from a thread keeps the caller's
        return

    def stop(signum, frame):
        # As Lightning does on Ctrl-C: the ones pressed after it must not interrupt the
        # teardown and the records (the caller's handlers come back when the block ends).
        _ignore_stop_signals()
        raise records.Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in START_UP_SIGNALS}
    try:
        yield
    finally:
        restore(list(previous.items()))  # all of them, even when a late stop raises midway


def _ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():  # signal.signal's rule
        for sig in START_UP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def _stopped_said(plan: RunPlan) -> Iterator[None]:
    """A Stopped raised in training gets the run's name, so the one line says what to do."""
    try:
        yield
    except records.Stopped as stop:
        raise records.Stopped(stop.signum, _stop_line(plan, stop.signal_name)) from None


def _stop_line(plan: RunPlan, signal_name: str) -> str:
    """A stop during training (Ctrl-C) may come after epochs' checkpoints: say it resumes."""
    if any(path.is_file() for path in (plan.run_dir / "checkpoints").glob("*.ckpt")):
        return (f"stopped by {signal_name} (run {plan.run_id}, recorded stopped); "
                f"--resume {plan.run_id} goes on from its newest checkpoint")
    return (f"stopped by {signal_name} before a checkpoint could be saved (run {plan.run_id}, "
            "recorded stopped)")


def simulate(plan: RunPlan, echo: Callable[[str], None]) -> dict:
    """Start one process per simulated node, each running this same command."""
    with records.recorded(plan.run_dir, kind=plan.topology.launcher.value,
                          details=run_details(plan)) as membership:  # marks the nodes
        started = time.time()
        with _stopped_said(plan):
            failure = launch.simulate_nodes(plan.topology, {records.RUN_ID_ENV: plan.run_id},
                                            echo, hosts=plan.config.hosts,
                                            link_rate=plan.config.link_rate, run_id=plan.run_id)
        if failure is not None:
            _raise_if_diverged(plan, started)  # every node ended so: its line, not an exit code
            raise RunFailed(f"{_failure_line(plan, failure)}; the other nodes were ended too "
                            f"(run {plan.run_id})")
        # Node 0's rank 0 wrote result.json (and --result-json, the same flags reached it).
        result = json.loads((plan.run_dir / "result.json").read_text())
        if result.get("stopped_by"):
            membership.stopped()
        return result


def _raise_if_diverged(plan: RunPlan, started: float) -> None:
    """The nodes' result.json, written by this attempt, says the run diverged."""
    path = plan.run_dir / "result.json"
    try:
        result = read_json(path) if path.stat().st_mtime >= started else None
    except (OSError, ValueError):
        return  # none written: the node failed before its report
    if isinstance(result, dict) and result.get("diverged"):
        raise Diverged(diverged_line(result))


def _failure_line(plan: RunPlan, failure) -> str:
    """The node that failed first, and why; when its peer's end is all it says, the node
    that failed on its own too (a collective timeout first writes the stacks, so the peers
    it closed its connections to often exit before it)."""
    mine = {r.get("pid"): r for r in records.read_processes(plan.run_dir)
            if r.get("host") == records.hostname()}
    failed = mine.get(failure.pid, {})
    why = _first_line(failed)
    if not any(words in why for words in PEER_ENDED):
        return f"{failure}{f' ({why})' if why else ''}"
    causes = [r for r in mine.values() if r.get("role") == "rank" and r.get("pid") != failure.pid
              and r.get("attempt") == failed.get("attempt") and _first_line(r)
              and not any(words in _first_line(r) for words in PEER_ENDED)]
    if not causes:
        return f"{failure} ({why})"
    cause = min(causes, key=lambda r: r.get("ended_at") or 0)
    return (f"{failure}: a peer closed its connections, as node {cause.get('node_rank')} (pid "
            f"{cause.get('pid')}) failed ({_first_line(cause)})")


def _first_line(record: dict) -> str:
    """What a node process recorded as its error (it printed nothing: its parent speaks)."""
    lines = (record.get("error") or "").splitlines()
    return lines[0][:records.REASON_CHARS] if lines else ""
