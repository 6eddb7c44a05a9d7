"""``LeanCallback``: a Lightning callback whose per-batch hooks cost nothing where it does
not override them.

Lightning calls each hook of a step on every callback: for each one it formats a profiler
name from the callback's ``state_key``, enters the profiler's context and calls the empty
method (6 hooks a training step, about 1 µs each on 2 cores). Its dispatcher,
``pytorch_lightning.trainer.call._call_callback_hooks``, skips a hook that is not callable:
a subclass of this one has every per-batch hook it leaves alone set to ``None``, so a
run's callbacks cost a step only the hooks they use (issue 19; ``python -m
kosmoss.bench.step_cost``, variant "8 more callbacks").
"""
from __future__ import annotations

import pytorch_lightning as pl

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
    """Subclass it as ``pl.Callback``; the per-batch hooks the subclass (or a class between)
    does not define are ``None``, which Lightning skips."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for hook in PER_BATCH_HOOKS:
            if getattr(cls, hook) is getattr(pl.Callback, hook):
                setattr(cls, hook, None)


def used_hooks(callback: pl.Callback) -> tuple:
    """The per-batch hooks Lightning will call on ``callback``."""
    return tuple(hook for hook in PER_BATCH_HOOKS if callable(getattr(callback, hook, None)))
