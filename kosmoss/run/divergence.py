"""Stop a run whose numbers are gone: weights, or a validation loss, that are NaN or inf.

A learning rate too high for the batch (lesson 4) takes the weights to inf and NaN within
a few steps. Lightning trains on: it validates NaN, saves NaN checkpoints (``--resume``
would continue from them) and the run ends as a success. Keras stops on a NaN loss
(``TerminateOnNaN``); Lightning's ``EarlyStopping(check_finite=True)`` does on a logged
metric, at validations only, and saves its checkpoints all the same.

Under DDP a rank's training loss is its own share's: one rank stopping on an inf loss of
its own would leave the others waiting in the next all-reduce. What every rank holds alike
is checked instead, so all of them decide the same at the same step with no collective:

- the weights after a step (DDP averages the gradients before every step: the replicas
  agree bit for bit, :class:`~.callbacks.ReplicaCheck`), every ``CHECK_EVERY_STEPS``
  steps, on the last batch of an epoch that a validation and its checkpoints end (not of
  every epoch: on a GPU the check waits for the step, and with ``--val-every-n-epochs 100``
  an epoch of one CUDA-graph replay then started on an idle GPU) and at the fit's last
  step. On a GPU the check every ``CHECK_EVERY_STEPS`` steps does not wait either: its sums
  are copied to the host behind the step (:mod:`.host_reads`) and read at the next batch's
  end, on every rank alike; the checks before a save, and before a stop signal's
  checkpoint, wait. A weight that is NaN or inf stays so (an update adds to it or scales
  it: inf - inf and inf x 0 are NaN, never a number again), so a later check still
  finds it. The check sums each parameter (:func:`weights_finite`): 55 µs for the 488,852
  parameters on 2 cores (2026-11-27, ``python -m timeit -s "from kosmoss.model import
  LitMLP; from kosmoss.run.divergence import weights_finite; p =
  list(LitMLP(4128).parameters())" "weights_finite(p)"``), ~1 µs a step at one check in 50;
- the validation loss, which torchmetrics sums over every rank's share.

The fit then ends after that step, without a validation or a checkpoint: the newest
checkpoint is the last one whose weights were numbers.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Tuple

import torch
from pytorch_lightning.trainer.states import TrainerFn

from ..core.errors import RunFailed
from . import lightning_private as private
from .host_reads import LaterRead
from .lean import LeanCallback

SLICE = 2**20  # elements looked at together when a sum is not finite: 1 MiB of booleans
CHECK_EVERY_STEPS = 50  # as Lightning's log_every_n_steps


def weights_finite(parameters: Iterable[torch.Tensor]) -> bool:
    """Whether every element is a number. A NaN or inf element makes its tensor's sum NaN or
    inf, so finite sums settle it with no copy (one sync on a GPU); a sum that is not
    finite may also have overflowed, so each element is then looked at, a slice at a time.
    (A float64 sum would be exact at once, but torch casts the whole tensor first: +400
    MiB at the peak for 64 M parameters.)"""
    tensors = [parameter.detach() for parameter in parameters]
    if sums_finite(parameter_sums(tensors)):
        return True
    return all(bool(torch.isfinite(part).all()) for tensor in tensors
               for part in tensor.reshape(-1).split(SLICE))


def parameter_sums(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """One float32 sum per parameter, on the parameters' device (nothing waits for it)."""
    sums = [parameter.detach().sum().float() for parameter in parameters]
    return torch.stack(sums) if sums else torch.zeros(0)


def sums_finite(sums: torch.Tensor) -> bool:
    return bool(torch.isfinite(sums).all())


class StopWhenDiverged(LeanCallback):
    """Ends the fit on every rank at the step its weights (or a validation loss) are found
    NaN or inf; :attr:`found` says what, and where."""

    def __init__(self, every: int = CHECK_EVERY_STEPS) -> None:
        self.every = every
        self.found: Optional[dict] = None
        self.finite_at_step: Optional[int] = None  # the newest check the weights passed
        self._next_check = every
        self._pending: Optional[Tuple[LaterRead, int]] = None  # sums on their way, their step
        self._fit_trainer = None  # of the fit under way: its lightning_module is the model

    def on_train_start(self, trainer, pl_module) -> None:
        # Steps, not time: a resumed run checks at the same steps as the run it continues.
        self._fit_trainer = trainer
        step = trainer.global_step
        self._next_check = (step // self.every + 1) * self.every
        if weights_finite(pl_module.parameters()):
            self.finite_at_step = step
        else:  # a checkpoint saved by a kosmoss that kept NaN weights: nothing to train
            self._stop(trainer, step, "the weights resumed from are NaN or inf")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.found is None and self._pending is not None:
            self._settle(trainer, pl_module, step)  # one batch later on every rank alike
        if self.found is not None or not self._due(trainer, step):
            return
        self._next_check = (step // self.every + 1) * self.every
        if self._saves_or_ends_next(trainer, step):
            self._check_now(trainer, pl_module, step)
            return
        # Nothing is saved before the next batch's end: the sums are read there, when the
        # GPU has long made them (the next batch, or chunk, is queued by then). Each rank
        # reads at the same step as the others (not when its GPU is done): they stop together.
        self._pending = (LaterRead(parameter_sums(pl_module.parameters())), step)
        if self._pending[0].on_host:  # on the CPU they are there already: read them now
            self._settle(trainer, pl_module, step)

    def diverged_once_settled(self) -> bool:
        """Whether the run diverged, the check still on its way decided first (a wait for
        the GPU): what a save that no check precedes (a stop signal's) asks."""
        if self.found is None and self._pending is not None:
            trainer = self._fit_trainer
            self._settle(trainer, trainer.lightning_module, trainer.global_step)
        return self.found is not None

    def _check_now(self, trainer, pl_module, step: int) -> None:
        if weights_finite(pl_module.parameters()):
            self.finite_at_step = step
            return
        self._stop(trainer, step, "the weights are NaN or inf")
        if private.on_last_batch(trainer):
            private.skip_next_validation(trainer)  # its loss would be NaN, its checkpoint too

    def _settle(self, trainer, pl_module, step: int) -> None:
        """The pending check's answer. Sums that are not finite may have overflowed: the
        weights as they are now are then checked element by element, a stop at this step."""
        read, checked_at = self._pending
        self._pending = None
        if sums_finite(read.value()):
            self.finite_at_step = checked_at
        else:
            self._check_now(trainer, pl_module, step)

    def on_validation_end(self, trainer, pl_module) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if self.found is not None or not fitting:
            return
        loss = trainer.callback_metrics.get("val_loss")
        if loss is not None and not math.isfinite(float(loss)):
            self._stop(trainer, trainer.global_step, f"the validation loss is {float(loss)}")

    def _due(self, trainer, step: int) -> bool:
        return step >= self._next_check or self._saves_or_ends_next(trainer, step)

    @staticmethod
    def _saves_or_ends_next(trainer, step: int) -> bool:
        last_step = 0 <= trainer.max_steps <= step
        return last_step or (private.on_last_batch(trainer) and saves_after_this_epoch(trainer))

    def _stop(self, trainer, step: int, what: str) -> None:
        self._found(step, what)
        private.end_fit_here(trainer)

    def _found(self, step: int, what: str) -> None:
        self.found = {"step": step, "what": what, "finite_at_step": self.finite_at_step,
                      "checked_every": self.every}

    def after_fit(self, scores: dict, step: int) -> None:
        """The final validation and test (a fit that never looked diverged): a score that is
        not a number says the weights are no longer worth one."""
        bad = {name: value for name, value in scores.items()
               if value is not None and not math.isfinite(value)}
        if self.found is None and bad:
            name, value = next(iter(bad.items()))
            self._found(step, f"the final {name} is {value}")


def saves_after_this_epoch(trainer) -> bool:
    """Whether a validation, a checkpoint or the fit's end follows this epoch: every epoch
    validated (``--val-every-n-epochs``, Lightning's ``_should_check_val_epoch`` from public
    attributes), every epoch without validation (ModelCheckpoint then saves at each epoch's
    end), and the last of ``--max-epochs``."""
    every, epoch = trainer.check_val_every_n_epoch, trainer.current_epoch
    validates = every is None or (epoch + 1) % every == 0
    last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= epoch + 1
    return validates or not trainer.enable_validation or last_epoch


class Diverged(RunFailed):
    """A run that diverged: one line (global zero's; every rank exits 1)."""

    def __init__(self, line: str, *, speaks: bool = True) -> None:
        super().__init__(line)
        self.speaks = speaks


def diverged_line(result: dict) -> str:
    """What the user reads of a diverged run's result: what was found, where, what to do."""
    found = result["diverged"]
    checked = found.get("finite_at_step")
    since = (f" (numbers at the check before, step {checked})"
             if checked is not None and "weights are" in found["what"] else "")
    return (f"run {result['run_id']} diverged: {found['what']} at step {found['step']}{since}; "
            f"if the rate ({result['lr']:g} at batch {result['global_batch_size']}) is too "
            "high, start again with a lower --lr or with --warmup-steps; result in "
            f"{result['run_dir']}/result.json")
