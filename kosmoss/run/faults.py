"""What a fault leaves behind in a run (docs/reliability.md), as pieces of its Trainer:

- :class:`AtomicCheckpointIO`: a checkpoint is written beside its name and renamed, so a
  full disk leaves the previous one whole and no truncated file;
- :class:`ContinuedCSVLogger`: a resumed run appends to its ``csv/metrics.csv``;
- :class:`DeadRankNamed`: a rank, node or data worker that dies makes the others fail with
  one line that names it, not a gloo traceback.

    trainer = pl.Trainer(plugins=[AtomicCheckpointIO()], logger=ContinuedCSVLogger(run_dir,
                         name="csv", version=""), callbacks=[DeadRankNamed(run_dir)])
"""
from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytorch_lightning as pl
import torch
from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from ..core.errors import RunFailed
from ..core.files import atomic_write_text
from ..launch import records
from . import lightning_private as private
from .lean import LeanCallback

WAIT_FOR_THE_DEAD_S = 2.0  # a dead process's sockets close a moment before it is seen dead
EXIT_STATUS_WAIT_S = 1.0  # a child the records show gone has its status ready within this


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's own save (cloud_io._atomic_save) writes a temporary file in the system's
    temp folder and moves it: across file systems the move is a copy, which a full disk
    leaves half done in checkpoints/. Here the file is written beside its name, flushed to
    disk, then renamed: a checkpoint is whole or absent, and a full disk is one line."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        aside = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(aside, "wb") as handle:
                _save_to(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(aside, path)
        except OSError as err:
            raise RunFailed(f"checkpoint {path} could not be written ({err.strerror or err}); "
                            f"{_what_to_do(path)}") from err
        finally:
            aside.unlink(missing_ok=True)  # left only when the write failed


class _KeepsWriteErrors:
    """A file whose write errors are kept: torch.save reports whatever its write raised as a
    RuntimeError ("unexpected pos"), which says neither that the disk is full nor which file,
    and turns a Ctrl-C that lands in the write (Stopped, KeyboardInterrupt) into a failure."""

    def __init__(self, handle) -> None:
        self.handle, self.error = handle, None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except BaseException as err:  # a signal's exception too: its handler runs here
            self.error = err
            raise

    def flush(self) -> None:
        self.handle.flush()


def _save_to(checkpoint: Dict[str, Any], handle) -> None:
    """Streamed to the file: a copy in memory first would cost as much RAM as the
    checkpoint (12 bytes per parameter with Adam's moments, docs/reliability.md)."""
    sink = _KeepsWriteErrors(handle)
    try:
        torch.save(checkpoint, sink)
    except RuntimeError:
        if sink.error is not None:
            raise sink.error from None
        raise


def _what_to_do(path: Path) -> str:
    """Advice that works: --resume takes the run's furthest checkpoint of any kind."""
    others = [p for p in path.parent.glob("*.ckpt") if p.is_file() and p != path]
    if path.is_file() or others:
        return (f"the checkpoints already written are intact: free space in {path.parent}, "
                f"then resume with --resume {path.parent.parent.name}")
    return (f"no checkpoint of this run was written: free space in {path.parent}, then start "
            "it again")


class _ContinuedWriter(ExperimentWriter):
    """Lightning deletes an existing metrics.csv when its writer starts; a resumed run
    continues it instead (its header's columns first, new ones added as Lightning does),
    from the rows logged before its checkpoint: an attempt killed after that checkpoint
    logged rows the resumed run logs again."""

    def __init__(self, log_dir: str, resumed_from_step: Optional[int]) -> None:
        self.resumed_from_step = resumed_from_step
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
            reader = csv.DictReader(handle)
            rows, self.metrics_keys = list(reader), list(reader.fieldnames or [])
        kept = rows_before(rows, self.resumed_from_step)
        if len(kept) < len(rows):
            atomic_write_text(Path(self.metrics_file_path), _csv_text(self.metrics_keys, kept))


def rows_before(rows: List[dict], step: Optional[int]) -> List[dict]:
    """The rows logged before a checkpoint at ``step``: Lightning logs a step's rows at the
    optimizer steps done before it (a validation after step 26 at step 25)."""
    if step is None:
        return rows
    return [row for row in rows if int(float(row["step"])) < step]


def _csv_text(keys: List[str], rows: List[dict]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class ContinuedCSVLogger(CSVLogger):
    """CSVLogger whose metrics.csv a resumed run continues from the rows before its
    checkpoint (a new run has none)."""

    def __init__(self, *args, resumed_from_step: Optional[int] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_from_step = resumed_from_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedWriter(self.log_dir, self.resumed_from_step)
        return self._experiment


class DeadRankNamed(LeanCallback):
    """A rank that dies (``kill -9``, out of memory) makes the others fail inside a collective
    with a long gloo traceback. Say who died instead, in one line: the local ranks this
    process started (their exit status names the signal), else the run's process records.
    Raised before Lightning's teardown: its child-process observer may SIGKILL this process
    a few seconds after a child died, and the line must be out first. A peer that was
    *stopped* (a signal during start-up) stops this rank too, with the same signal."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # torch's SIGCHLD handler raises "DataLoader worker ... is killed" on every SIGCHLD
        # while a dead worker is registered: one landed in a later hook and replaced this
        # line with a traceback. The run is failing, whatever failed: nothing needs it now.
        if threading.current_thread() is threading.main_thread():  # signal.signal's rule
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # gloo's and the DataLoader's errors are RuntimeErrors; a dead worker's pipe is reset
        # or ends mid-message (EOFError); others are this rank's own.
        if not isinstance(exception, (RuntimeError, ConnectionError, EOFError)):
            return
        workers, peers = my_workers(self.run_dir), trainer.world_size > 1
        if not workers and not peers:
            return
        worker, dead, peer = self._wait_for_the_dead(trainer, workers, peers)
        if worker:
            raise RunFailed(f"{worker}; this rank stopped at step {trainer.global_step} (run "
                            f"{self.run_dir.name})") from exception
        if peer is not None and peer.get("state") == records.STOPPED:
            signum = getattr(signal, peer.get("signal") or "", signal.SIGTERM)
            raise records.Stopped(signum, f"stopped with {_describe(peer)}") from exception
        dead = dead or (_describe(peer) if peer is not None else None)
        if dead:
            raise RunFailed(f"{dead}; this rank stopped at step {trainer.global_step} "
                            f"(run {self.run_dir.name})") from exception

    def _wait_for_the_dead(self, trainer, workers: List[records.ProcessId], peers: bool
                           ) -> Tuple[Optional[str], Optional[str], Optional[dict]]:
        """A dead process's sockets close a moment before its death can be seen (it is not a
        zombie yet; a killed data worker's reset pipe was seen first under load, CI
        2026-11-26): look again for up to WAIT_FOR_THE_DEAD_S."""
        deadline = time.monotonic() + WAIT_FOR_THE_DEAD_S
        while True:
            worker = dead_worker(workers)
            dead = None if worker or not peers else dead_child(trainer)
            peer = None if worker or dead or not peers else ended_peer(self.run_dir)
            if peer is not None and peer.get("state") == records.RUNNING:
                # A child that died between the two looks: its exit status names the signal.
                dead = dead_child(trainer, gone_pid=int(peer["pid"]))
            if worker or dead or peer is not None or time.monotonic() > deadline:
                return worker, dead, peer
            time.sleep(0.1)


def dead_child(trainer: pl.Trainer, gone_pid: Optional[int] = None) -> Optional[str]:
    """A local rank Lightning started from this process that has ended badly. ``gone_pid``
    is one the records already show gone: its exit status is waited for."""
    children = private.spawned_ranks(trainer)
    for local_rank, child in enumerate(children, 1):
        code = _exit_code(child, wait_s=EXIT_STATUS_WAIT_S if child.pid == gone_pid else 0.0)
        if code not in (None, 0):
            rank = trainer.node_rank * trainer.num_devices + local_rank
            how = (f"was killed by {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            return f"rank {rank} (pid {child.pid}) {how}"
    return None


def _exit_code(child: subprocess.Popen, wait_s: float) -> Optional[int]:
    """``Popen.poll`` answers None while another thread holds the child's waitpid lock, and
    Lightning's child-process observer polls the same Popen every 5 s: ``wait`` retries."""
    try:
        return child.wait(timeout=wait_s) if wait_s else child.poll()
    except subprocess.TimeoutExpired:
        return None


def my_workers(run_dir: Path) -> List[records.ProcessId]:
    """The data workers forked from this rank, as the run's records have them running."""
    me = records.current()
    return [records.ProcessId.from_dict(process)
            for process in (records.read_processes(run_dir) if me is not None else [])
            if process.get("role") == "worker" and process.get("parent") == me.me.as_dict()
            and process.get("state") == records.RUNNING]


def dead_worker(workers: List[records.ProcessId]) -> Optional[str]:
    """The first of ``workers`` that is gone."""
    return next((f"a data worker (pid {worker.pid}) of this rank died"
                 for worker in workers if not worker.is_alive()), None)


def ended_peer(run_dir: Path) -> Optional[dict]:
    """A process of this attempt, on this host, that died (recorded running, gone) or ended
    stopped or failed while this one still runs."""
    me = records.current()
    if me is None:
        return None
    for process in records.read_processes(run_dir):
        peer = records.ProcessId.from_dict(process)
        if (process.get("role") == "worker" or process.get("host") != records.hostname()
                or peer == me.me or process.get("launcher") != me.launcher.as_dict()):
            continue
        state = process.get("state")
        if state in (records.STOPPED, records.FAILED) or (
                state == records.RUNNING and not peer.is_alive()):
            return process
    return None


def _describe(process: dict) -> str:
    state = process.get("state")
    how = "died" if state == records.RUNNING else state
    return f"{_rank_name(process)} (pid {process['pid']}) {how}"


def _rank_name(process: dict) -> str:
    if process.get("role") == "launcher":
        return "the launcher"
    if process.get("rank") is not None:
        return f"rank {process['rank']}"
    if not process.get("spawned"):
        return "rank 0"  # the process the user started, which starts the others
    where = [f"{word} {process[key]}" for word, key in (("node", "node_rank"),
                                                        ("local rank", "local_rank"))
             if process.get(key) is not None]
    return ", ".join(where) or "a rank"
