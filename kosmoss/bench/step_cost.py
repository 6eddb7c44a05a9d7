"""Lightning's fixed cost per training step, alone: the model with next to no arithmetic (one
input, one hidden unit, one output, batch 1), its steps run by a plain loop, by
``Trainer(barebones=True)`` in a few ways and by kosmoss's own run path, each timed over
the same number of steps.
What is left above the plain loop is the framework's per-step Python: its loop, hook
dispatch, optimizer closure, DataLoader and fetcher (docs/benchmarks.md).

    python -m kosmoss.bench.step_cost --steps 2000 --repeats 3

Variants, interleaved repeat by repeat:

- ``plain``: the loop written out (batch from a list, forward, MSE, zero_grad, backward,
  Adam), no DataLoader;
- ``lightning``: the model as kosmoss's run path trains it (:class:`~kosmoss.run.lean.LeanLitMLP`),
  automatic optimisation, as kosmoss's Trainer runs it: :class:`~kosmoss.run.lean.NoProfiler`,
  batches from a :class:`~kosmoss.data.datamodule.BatchLoader`;
- ``lightning, torch DataLoader``: the same batches through torch's DataLoader (what the
  BatchLoader saves);
- ``lightning, stock profiler``: the same with Lightning's default ``PassThroughProfiler``
  (what NoProfiler saves);
- ``lightning, nn.Module.__setattr__``: the same with LeanLitMLP's shortcut for Lightning's
  hook name removed (what that shortcut saves);
- ``lightning, inspected training_step``: the same with a training_step Lightning inspects
  every step (what its ``__signature__`` saves);
- ``lightning, 8 more callbacks``: the same with 8 callbacks that override nothing
  (Lightning calls each of a step's hooks on every callback: what one callback costs);
- ``lightning, 8 more LeanCallbacks``: the same 8 as :class:`kosmoss.run.lean.LeanCallback`
  (what a callback costs when Lightning skips the hooks it does not use);
- ``lightning, manual optimisation``: the step calls ``manual_backward`` and the
  optimizer itself (what automatic optimisation costs; LitMLP keeps automatic: learners
  put it in their own Trainers, where ``accumulate_grad_batches`` and gradient clipping
  need it, and its warm-up schedule is stepped by Lightning);
- ``lightning, Trainer not barebones``: the same in a Trainer built as usual with its
  logger, checkpointing, progress bar, summary and sanity check off (what the full loop
  costs before anything is logged or saved: kosmoss runs this loop);
- ``lightning, not barebones, textbook LitMLP``: that Trainer with the lesson's LitMLP,
  none of the run path's trims to the model, ``train_loss`` logged every step (what
  LeanLitMLP's three trims save together);
- ``lightning, ModelCheckpoint`` / ``lightning, LeanModelCheckpoint``: that Trainer with a
  checkpoint callback that saves at the end only (what LeanModelCheckpoint saves a step);
- ``fabric``: the plain loop's step with the model and optimizer set up by Lightning
  Fabric, its backward through ``fabric.backward`` (what a run path on Fabric, its own
  loop under Lightning's strategies and precision, would pay: the lever left at small batches);
- ``fabric, with kosmoss's loader, step and loggers``: kosmoss's pieces that need no
  Trainer on a Fabric loop (the data module's loader on the dataset below, LitMLP's
  training step, its logging through Fabric's TensorBoard and CSV loggers every 50 steps):
  the fixed cost a run path on Fabric would start from, before its callbacks;
- ``kosmoss, as trainup runs it``: kosmoss's own run path, ``prepare`` then ``train`` as
  ``trainup_cpu.py`` calls them (its Trainer, callbacks, loggers, data module and loader),
  on a two-level synthetic dataset in a temporary ``KOSMOSS_HOME``, one hidden unit, batch
  1, timed by the run's own ThroughputMeter: what kosmoss adds above ``lightning``
  (one process: 8 optimizer steps per step of Lightning's loop, kosmoss.run.chunks);
- ``kosmoss, one step a batch``: the same run with ``--steps-per-execution 1``, one
  optimizer step per step of Lightning's loop (what the chunks save);
- ``kosmoss, without ...``: the same run with one part patched out (the logging of
  ``train_loss``, the loggers, the per-batch hooks of Heartbeat and StopOnSignal): what
  that part costs a step;
- ``kosmoss, train_loss logged every step``: the same run with LeanLitMLP's logging rule
  off (what logging only on the loggers' steps saves).
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional
from unittest import mock

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric import Fabric
from lightning_fabric.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from ..core.commandline import OneLineParser
from ..data.datamodule import BatchLoader, FlattenedDataModule
from ..data.sources import SyntheticSource
from ..data.store import PreparedDataset
from ..data.store import prepare as prepare_dataset
from ..diagnose.heartbeat import Heartbeat
from ..lessons.course import quiet_lightning
from ..model import LitMLP
from ..run.config import RunConfig
from ..run.lean import LeanCallback, LeanLitMLP, LeanModelCheckpoint, NoProfiler, used_hooks
from ..run.plan import prepare
from ..run.preemption import StopOnSignal
from ..run.throughput import StepClock
from ..run.train import LOG_EVERY_N_STEPS, train
from .baselines import RowsInMemory, on_fabric


class StockSetattr(LeanLitMLP):
    __setattr__ = torch.nn.Module.__setattr__  # nn.Module's checks for every attribute


class InspectedStep(LeanLitMLP):
    def training_step(self, batch, batch_idx):  # no __signature__: inspected every step
        return self._common_step(batch, "train")


class ManualStep(LeanLitMLP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self._common_step(batch, "train")
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


def tiny(cls=LeanLitMLP) -> LitMLP:
    torch.manual_seed(0)
    return cls(1, (1,), 1)


def batches(steps: int) -> List[tuple]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 1, generator=generator), torch.randn(1, 1, generator=generator))
            for _ in range(steps)]


CPU = torch.device("cpu")


def seconds_per_step(clock: StepClock) -> float:
    return 1.0 / clock.samples_per_s  # one sample a step


def plain(steps: int, fabric: bool = False) -> float:
    model, data, clock = tiny(), batches(steps), StepClock()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    net, backward = model.net, torch.Tensor.backward
    if fabric:  # the bench's fabric row's set-up, on this loop
        net, optimizer, backward = on_fabric(model.net, optimizer, CPU)
    for x, y in data:
        loss = torch.nn.functional.mse_loss(net(x.sub_(model.x_mean).div_(model.x_std)),
                                            model.normalize_y(y))
        optimizer.zero_grad(set_to_none=True)
        backward(loss)
        optimizer.step()
        clock.step_done(1, CPU)
    return seconds_per_step(clock)


class StepTimer(pl.Callback):
    """kosmoss's step clock (first step left out, as in every variant) inside the fit."""

    def __init__(self) -> None:
        self.clock = StepClock()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.step_done(1, CPU)


class NoHooks(pl.Callback):
    """A callback that overrides nothing: Lightning still calls each hook on it."""


class LeanNoHooks(LeanCallback):
    """The same as a LeanCallback: Lightning skips its per-batch hooks."""


# A Trainer that is not barebones, with everything it would add switched off: its loop alone.
FULL_TRAINER = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)


def in_lightning(cls, extra_callbacks: int = 0, lean: bool = True, torch_loader: bool = False,
                 extra=NoHooks, barebones: bool = True, checkpoint=None) -> Callable[[int], float]:
    def run(steps: int) -> float:
        x = torch.randn(steps, 1, generator=torch.Generator().manual_seed(0))
        rows, batches = RowsInMemory(x, x.clone()), [np.array([i]) for i in range(steps)]
        loader = (DataLoader(rows, batch_size=None, sampler=batches) if torch_loader
                  else BatchLoader(rows, batches))
        timer = StepTimer()
        callbacks = [timer] + [extra() for _ in range(extra_callbacks)]
        options = dict(barebones=True) if barebones else dict(FULL_TRAINER)
        with tempfile.TemporaryDirectory(prefix="kosmoss-step-cost-") as folder:
            if checkpoint is not None:  # saves once, at the end of the one epoch
                callbacks.append(checkpoint(dirpath=folder, save_last=True))
                options["enable_checkpointing"] = True
            trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=callbacks,
                                 use_distributed_sampler=False, **options)
            if lean:  # barebones refuses any profiler argument, so it is swapped in afterwards
                trainer.profiler = NoProfiler()
            trainer.fit(tiny(cls), train_dataloaders=loader)
        return seconds_per_step(timer.clock)
    return run


KOSMOSS_COLUMNS = 200  # two levels: 160 training batches of 1 an epoch, 20 to validate

# What a kosmoss variant leaves out, each a patch scoped to that variant's run.
LEFT_OUT = {
    "train_loss logging": lambda: mock.patch.object(LeanLitMLP, "logs_train_loss_now",
                                                    lambda self: False),
    # Every step, as the textbook LitMLP logs (its progress-bar rule kept).
    "the logging rule": lambda: mock.patch.object(LeanLitMLP, "logs_train_loss_now",
                                                  lambda self: True),
    "loggers": lambda: mock.patch("kosmoss.run.train.run_loggers", lambda plan: False),
    # A per-batch hook set to None is one Lightning skips (kosmoss.run.lean): the callbacks stay,
    # their per-step work goes. The meter's hook stays: it is the clock.
    "heartbeat and stop-signal hooks": lambda: _per_batch_hooks_off(Heartbeat, StopOnSignal),
}


def two_levels(folder: Path) -> PreparedDataset:
    """The kosmoss lines' dataset: KOSMOSS_COLUMNS synthetic columns of two levels."""
    return prepare_dataset(SyntheticSource(KOSMOSS_COLUMNS, levels=2), folder,
                           shard_size=KOSMOSS_COLUMNS)


def _per_batch_hooks_off(*callbacks: type) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for callback in callbacks:
        for hook in used_hooks(callback):
            stack.enter_context(mock.patch.object(callback, hook, None))
    return stack


def in_kosmoss(*left_out: str, steps_per_execution: Optional[int] = None
               ) -> Callable[[int], float]:
    def run(steps: int) -> float:
        with tempfile.TemporaryDirectory(prefix="kosmoss-step-cost-") as home, \
                mock.patch.dict(os.environ, {"KOSMOSS_HOME": home}), contextlib.ExitStack() as parts:
            for part in left_out:
                parts.enter_context(LEFT_OUT[part]())
            data = two_levels(Path(home) / "data" / "two-levels")
            plan = prepare(RunConfig(dataset=str(data.path), batch_size=1, hidden=(1,),
                                     max_steps=steps + 1, max_epochs=1_000_000, progress=False,
                                     steps_per_execution=steps_per_execution))
            outcome = train(plan)
        return 1.0 / outcome.meter.samples_per_s  # one sample a step
    return run


def kosmoss_on_fabric(steps: int, home: Path) -> float:
    """kosmoss's pieces that need no Trainer, on a loop of Fabric's: the data module's
    loader, LeanLitMLP's training step with its ``self.log`` (Fabric hands it to its TensorBoard
    and CSV loggers) on kosmoss's log steps. Seconds per step; the logs stay in ``home``."""
    data = two_levels(home / "two-levels")
    module = FlattenedDataModule(data, batch_size=1, mode="controlled")
    module.setup("fit")
    fabric = Fabric(accelerator="cpu", devices=1,
                    loggers=[TensorBoardLogger(home, name="tensorboard", version=""),
                             CSVLogger(home, name="csv", version="")])
    torch.manual_seed(0)
    model = LeanLitMLP(data.n_x, (1,), data.n_y, stats=data.statistics())
    model, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    clock, done = StepClock(), 0

    def logs_this_step(self) -> bool:
        # LeanLitMLP asks the Trainer which steps log; under Fabric there is none (it would log
        # every step), so the variant applies kosmoss's rule itself: the first and every 50th
        # (an epoch here has 160 batches).
        return done == 0 or (done + 1) % LOG_EVERY_N_STEPS == 0

    with mock.patch.object(LeanLitMLP, "logs_train_loss_now", logs_this_step):
        while done <= steps:
            for batch_idx, batch in enumerate(module.train_dataloader()):
                loss = model.training_step(batch, batch_idx)
                optimizer.zero_grad(set_to_none=True)
                fabric.backward(loss)
                optimizer.step()
                done += 1
                clock.step_done(1, CPU)
                if done > steps:
                    break
            clock.pause(CPU)  # an epoch's end: untimed, as in the Trainer's runs
    for logger in fabric.loggers:
        logger.finalize("success")
    return seconds_per_step(clock)


def on_fabric_in_a_temporary_home(steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="kosmoss-step-cost-") as home:
        return kosmoss_on_fabric(steps, Path(home))


VARIANTS: Dict[str, Callable[[int], float]] = {
    "plain": plain,
    "lightning": in_lightning(LeanLitMLP),
    "lightning, torch DataLoader": in_lightning(LeanLitMLP, torch_loader=True),
    "lightning, stock profiler": in_lightning(LeanLitMLP, lean=False),
    "lightning, nn.Module.__setattr__": in_lightning(StockSetattr),
    "lightning, inspected training_step": in_lightning(InspectedStep),
    "lightning, 8 more callbacks": in_lightning(LeanLitMLP, extra_callbacks=8),
    "lightning, 8 more LeanCallbacks": in_lightning(LeanLitMLP, extra_callbacks=8,
                                                    extra=LeanNoHooks),
    "lightning, manual optimisation": in_lightning(ManualStep),
    "lightning, Trainer not barebones": in_lightning(LeanLitMLP, barebones=False),
    "lightning, not barebones, textbook LitMLP": in_lightning(LitMLP, barebones=False),
    "lightning, ModelCheckpoint": in_lightning(
        LeanLitMLP, barebones=False, checkpoint=pl.callbacks.ModelCheckpoint),
    "lightning, LeanModelCheckpoint": in_lightning(
        LeanLitMLP, barebones=False, checkpoint=LeanModelCheckpoint),
    "fabric": partial(plain, fabric=True),
    "fabric, with kosmoss's loader, step and loggers": on_fabric_in_a_temporary_home,
    "kosmoss, as trainup runs it": in_kosmoss(),
    "kosmoss, one step a batch": in_kosmoss(steps_per_execution=1),
    "kosmoss, without train_loss logging": in_kosmoss("train_loss logging"),
    "kosmoss, without loggers": in_kosmoss("loggers"),
    "kosmoss, without heartbeat/stop hooks": in_kosmoss("heartbeat and stop-signal hooks"),
    "kosmoss, train_loss logged every step": in_kosmoss("the logging rule", steps_per_execution=1),
}


def measure(steps: int, repeats: int) -> Dict[str, List[float]]:
    """Seconds per step of every variant, ``repeats`` times, interleaved."""
    found: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, run in VARIANTS.items():
            found[name].append(run(steps))
    return found


def report(found: Dict[str, List[float]]) -> str:
    plain_s = statistics.median(found["plain"])
    width = max(map(len, found))
    lines = [f"{'variant':{width}s} {'µs/step':>8s} {'over plain':>10s}  (median; range)"]
    for name, times in found.items():
        median = statistics.median(times)
        lines.append(f"{name:{width}s} {median * 1e6:8.0f} {(median - plain_s) * 1e6:+10.0f}  "
                     f"({min(times) * 1e6:.0f}-{max(times) * 1e6:.0f})")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = OneLineParser(prog="python -m kosmoss.bench.step_cost",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: at least 3 (the first step is not timed)")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    quiet_lightning()  # no banners between the variants' lines
    warnings.filterwarnings("ignore", "You defined a `validation_step`")  # LitMLP has one
    print(report(measure(args.steps, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
