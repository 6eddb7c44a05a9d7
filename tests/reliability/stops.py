"""Stops at chosen steps and what a resumed run is compared with (docs/reliability.md).

A real signal, sent by the training process to itself while the step chosen trains
(``SignalAt``): the stop lands exactly where the test derived it from the epoch's length,
through the same handler, agreement and checkpoint as a signal from Slurm. Runs happen in
this process (``run_in_process``, a second each) or, for SIGKILL, as ``trainup_cpu.py``
through ``signal_at.py``. ``compare`` says the first thing that differs from the straight
run: a weight, a row of metrics.csv, a point of the validation curve.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from helpers import REPO

from kosmoss.data.loading import RankBatchSampler, split_indices
from kosmoss.data.splits import SPLITS
from kosmoss.data.store import open_dataset

STOP_STEP_ENV, STOP_SIGNAL_ENV, STOP_WHERE_ENV = "STOP_STEP", "STOP_SIGNAL", "STOP_WHERE"
SIGNAL_AT = Path(__file__).with_name("signal_at.py")


class SignalAt(pl.Callback):
    """Sends ``sig`` to this process while the step ``step`` (the count of steps made before
    it) trains, (``where="val"``) while the first validation at or after it runs, or
    (``where="test"``) when the test pass after the fit starts."""

    def __init__(self, step: int, sig: int, where: str = "train") -> None:
        self.step, self.sig, self.where, self.sent = step, sig, where, False

    def _send(self) -> None:
        self.sent = True
        os.kill(os.getpid(), self.sig)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        steps = max(getattr(batch, "steps", 1), 1)  # a Chunk holds several
        if self.where == "train" and not self.sent and \
                trainer.global_step <= self.step < trainer.global_step + steps:
            self._send()

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.where == "val" and not self.sent and not trainer.sanity_checking and \
                trainer.global_step >= self.step:
            self._send()

    def on_test_start(self, trainer, pl_module) -> None:
        if self.where == "test" and not self.sent:
            self._send()


def from_environment() -> Optional[SignalAt]:
    if STOP_STEP_ENV not in os.environ:
        return None
    return SignalAt(int(os.environ[STOP_STEP_ENV]),
                    getattr(signal, os.environ.get(STOP_SIGNAL_ENV, "SIGTERM")),
                    os.environ.get(STOP_WHERE_ENV, "train"))


def trainup_with(extra: Optional[pl.Callback]) -> int:
    """trainup_cpu.py's main with ``extra`` among the run's callbacks: the body of the
    scripts signal_at.py and corrupt_at.py."""
    import kosmoss.run.train as train_module
    import late_reads
    import trainup_cpu

    late_reads.from_environment()
    if extra is not None:
        build = train_module.build_trainer
        train_module.build_trainer = lambda plan, callbacks: build(plan, callbacks + [extra])
    return trainup_cpu.main()


def batches_per_epoch(dataset: Path, batch_size: int, seed: int = 42, world_size: int = 1) -> int:
    """The epoch's length as the run computes it: the seeded split, cut in global batches
    of ``batch_size`` (each rank's share of one)."""
    n = open_dataset(dataset, verify=False).n_samples
    train = split_indices(n, SPLITS, seed)[0]
    return len(RankBatchSampler(np.arange(len(train)), batch_size // world_size,
                                world_size=world_size))


def run_in_process(home: Path, monkeypatch, *, stop: Optional[SignalAt] = None, **flags) -> dict:
    """kosmoss.run.run as trainup_cpu.py calls it, with ``stop`` among its callbacks."""
    import kosmoss.run.train as train_module
    from kosmoss.run import RunConfig, run

    build = train_module.build_trainer
    extra = [stop] if stop is not None else []
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    monkeypatch.setattr(train_module, "build_trainer",
                        lambda plan, callbacks: build(plan, callbacks + extra))
    try:
        return run(RunConfig(progress=False, **flags, given=frozenset(flags) | {"progress"}),
                   echo=lambda line: None)
    finally:
        monkeypatch.setattr(train_module, "build_trainer", build)


def run_script(home: Path, args: List[str], stop: Optional[SignalAt] = None,
               timeout: float = 600, late_reads: bool = False) -> subprocess.CompletedProcess:
    """trainup_cpu.py with its own home (through signal_at.py when ``stop`` is given; its
    host reads late as on a GPU with ``late_reads``: late_reads.py)."""
    from late_reads import LATE_READS_ENV

    env = {key: value for key, value in os.environ.items()
           if key not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK")}
    env.update(KOSMOSS_HOME=str(home), PYTHONUNBUFFERED="1")
    if late_reads:
        env[LATE_READS_ENV] = "1"
    script = ["trainup_cpu.py"]
    if stop is not None:
        env.update({STOP_STEP_ENV: str(stop.step), STOP_SIGNAL_ENV: signal.Signals(stop.sig).name,
                    STOP_WHERE_ENV: stop.where})
        script = [str(SIGNAL_AT)]
    return subprocess.run([sys.executable, *script, "--no-progress", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Finished:
    """What a run left: its result.json, metrics rows and final weights."""

    result: dict
    rows: List[dict]
    weights: dict

    @classmethod
    def of(cls, run_dir: Path) -> "Finished":
        run_dir = Path(run_dir)
        result = json.loads((run_dir / "result.json").read_text())
        with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu",
                                weights_only=False)
        return cls(result, rows, checkpoint["state_dict"])

    def curve(self) -> List[tuple]:
        return [(point["step"], point["val_loss"]) for point in self.result["val_curve"]]


def compare(resumed: Finished, straight: Finished) -> Optional[str]:
    """The first difference from the straight run, in words; None when there is none."""
    differ = {name: (resumed.weights[name] - value).abs().max().item()
              for name, value in straight.weights.items()
              if not torch.equal(resumed.weights[name], value)}
    if differ:  # by how much, and where the runs' step and rows stand: rounding or a lost step
        said = ", ".join(f"{name} by up to {gap:.3g}" for name, gap in differ.items())
        steps = (resumed.result["global_step"], straight.result["global_step"])
        return (f"weights differ: {said} (global_step {steps[0]}, the straight run's {steps[1]}; "
                f"rows {'the same' if resumed.rows == straight.rows else 'differ too'}; "
                f"torch threads {resumed.result.get('torch_threads')}, the straight run's "
                f"{straight.result.get('torch_threads')})")
    for index, (mine, theirs) in enumerate(zip(resumed.rows, straight.rows)):
        if mine != theirs:
            return f"metrics.csv row {index + 1}: {mine} instead of {theirs}"
    if len(resumed.rows) != len(straight.rows):
        extra = (resumed.rows[len(straight.rows):] or straight.rows[len(resumed.rows):])[0]
        return (f"metrics.csv has {len(resumed.rows)} rows, the straight run "
                f"{len(straight.rows)}; first unmatched: {extra}")
    if resumed.curve() != straight.curve():
        return f"val_curve {resumed.curve()} instead of {straight.curve()}"
    for key in ("global_step", "epochs", "val_loss", "test_loss", "replica_checksums"):
        if resumed.result[key] != straight.result[key]:
            return f"{key} {resumed.result[key]} instead of {straight.result[key]}"
    return None
