"""What the run path trims from Lightning's per-step Python, in one place.

The model, data module and trainup scripts a lesson shows are textbook Lightning; the run
path (:func:`kosmoss.run.train.train`) instantiates these subclasses of them instead. Each
trim changes no number a run records (tests/run/test_lean.py) and saves what
``python -m kosmoss.bench.step_cost --steps 2000 --repeats 3`` measures, a variant per trim
(2 CPU cores, 2026-11-26 18:50 UTC, median of 3; a step of the one-unit model costs
~330 µs written out by hand, ~575 µs in Lightning's barebones Trainer):

======================================  =======================================  =========
trim                                    what Lightning does every step without   saves
======================================  =======================================  =========
:meth:`LeanLitMLP.log` (train_loss)     ``self.log`` with ``sync_dist`` each      ~340 µs
                                        step, not only on the loggers' steps
:meth:`LeanLitMLP.__setattr__`          checks its hook name (44 sets a step)    ~77 µs
                                        against parameters, buffers, modules
:class:`NoProfiler`                     a generator context around each of ~46   ~35 µs
                                        hook calls (PassThroughProfiler)
:class:`LeanModelCheckpoint`            ``state_key`` from a dict's repr per      ~26 µs
                                        hook call, and a no-op batch hook
``LeanLitMLP.training_step``            ``inspect``'s full argspec of the step    ~15 µs
``.__signature__``
:class:`LeanCallback`                   every per-batch hook of every callback,  ~4 µs a
                                        overridden or not                        callback
======================================  =======================================  =========

The three trims of LeanLitMLP together: the textbook LitMLP costs ~436 µs a step more in a
Trainer that logs. The other run-layer levers have modules of their own: several optimizer
steps per step of Lightning's loop (:mod:`.chunks`: ~185 µs a step here), glibc's malloc
thresholds (:mod:`.allocator`), and the per-step SIGTERM broadcast (:mod:`.preemption`).
Every private Lightning name these touch is read or written through
:mod:`.lightning_private`, which a test checks against the installed Lightning.
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import pytorch_lightning as pl
import torch
from pytorch_lightning.profilers import PassThroughProfiler

from ..model import LitMLP
from . import lightning_private as private

# The hooks Lightning calls once per batch (training, validation, test, predict). Hooks
# called once per epoch or run stay as they are: Lightning calls some of them directly.
PER_BATCH_HOOKS = (
    "on_train_batch_start", "on_train_batch_end",
    "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end",
)


class LeanCallback(pl.Callback):
    """A ``pl.Callback`` whose per-batch hooks cost nothing where it does not override them.

    Lightning calls each hook of a step on every callback, formatting a profiler name from
    the callback's ``state_key`` each time; its dispatcher skips a hook that is not callable
    (:data:`~.lightning_private.SKIPS_NONE_HOOKS`). A subclass of this one has every
    per-batch hook it (or a class between) does not define set to ``None``."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for hook in PER_BATCH_HOOKS:
            if getattr(cls, hook) is getattr(pl.Callback, hook):
                setattr(cls, hook, None)


def used_hooks(callback: pl.Callback) -> tuple:
    """The per-batch hooks Lightning will call on ``callback``."""
    return tuple(hook for hook in PER_BATCH_HOOKS if callable(getattr(callback, hook, None)))


_NOTHING = contextlib.nullcontext()  # reusable and re-entrant: it holds no state


class NoProfiler(PassThroughProfiler):
    """Lightning's default ``PassThroughProfiler`` records nothing, but its ``profile()`` is
    a generator context manager built afresh around every hook call. This one hands back one
    shared ``nullcontext``; to profile, give a Trainer one of Lightning's own profilers."""

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return _NOTHING


class LeanModelCheckpoint(LeanCallback, pl.callbacks.ModelCheckpoint):
    """Lightning's ModelCheckpoint, minus two per-step costs that never change what it saves."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not private.saves_during_epochs(self):
            # Its batch hook saves only every N steps or every interval; with neither it
            # checks the trainer's state every step and returns.
            self.on_train_batch_end = None

    @functools.cached_property
    def state_key(self) -> str:
        # Built from a dict's repr on every hook call (~4 µs, ~6 a step); its parts are all
        # set in __init__, so the first answer stays right.
        return super().state_key


class LeanLitMLP(LitMLP):
    """LitMLP as the run path trains it: the same module, state dict and hyperparameters
    (its checkpoints load into LitMLP), minus three per-step costs of Lightning's; on a GPU,
    Adam's fused kernel."""

    capturable = False  # --cuda-graphs: Adam's step count on the GPU, so a graph can hold it

    def configure_optimizers(self):
        # One kernel updates every parameter (the ladder's fused rung); the same rule, rate
        # and warm-up as LitMLP's.
        if self.device.type != "cuda":
            return super().configure_optimizers()
        return self.with_warmup(torch.optim.Adam(self.parameters(), lr=self.hparams.lr,
                                                 fused=True, capturable=self.capturable))

    def __setattr__(self, name: str, value) -> None:
        # Lightning sets the name of the hook it is in before and after each one, 44 times a
        # step; a hook's name is no parameter, buffer or submodule, so nn.Module's checks
        # of it are skipped.
        if name == private.HOOK_NAME_ATTRIBUTE:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)

    # Lightning asks whether training_step takes batch_idx every step (inspect's full
    # argspec); a function's __signature__ answers at once. A subclass that overrides
    # training_step is inspected as usual.
    training_step.__signature__ = inspect.signature(training_step)

    def log(self, name: str, value, *args, **kwargs) -> None:
        # train_loss goes to the loggers only on their steps, and to a progress bar only if
        # there is one (it reads the value after every step: .item(), a GPU sync).
        if name == "train_loss":
            if not self.logs_train_loss_now():
                return
            kwargs["prog_bar"] = self.shows_progress()
        super().log(name, value, *args, **kwargs)

    def logs_train_loss_now(self) -> bool:
        """Lightning's loggers write when (steps done + 1) % log_every_n_steps == 0: log on
        those steps, and on the first (the progress bar has a value at once)."""
        trainer = private.attached_trainer(self)
        if trainer is None:
            return True
        every = trainer.log_every_n_steps  # 0 in Trainer(barebones=True): no logging at all
        return every > 0 and (self.global_step == 0 or (self.global_step + 1) % every == 0)

    def shows_progress(self) -> bool:
        trainer = private.attached_trainer(self)
        return trainer is None or trainer.progress_bar_callback is not None
