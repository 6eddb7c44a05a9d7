"""Where a resumed fit starts: every checkpoint's loop state rewritten, before Lightning
restores its loops, in the one form Lightning 2.6 resumes exactly.

A checkpoint holds Lightning's loop counters as they were at the hook that saved it, and
Lightning resumes each hook's form differently (pytorch_lightning/loops/fit_loop.py and
training_epoch_loop.py, ``update_restart_stage`` and ``reset``):

- at a training batch's end, inside an epoch (``preempted.ckpt`` after a signal): exact;
- at an epoch's end (``last.ckpt`` of ModelCheckpoint, on_train_epoch_end) with
  ``--max-steps``: the restarted epoch trains nothing ("restarted on last"), then counts
  one epoch more and one logged step more: the data order of the epoch after, and no
  train_loss row where kosmoss logs it;
- at an epoch's end without ``--max-steps``: the train loader's position is not restored,
  and its first epoch took the order of whatever epoch the sampler held;
- at the end of training (``on_train_end``): the epoch is closed even where --max-steps
  cut it short.

Every form is read as (epoch, batches done in it, optimizer steps): the train loader's own
state and the step counters, which do not depend on the hook, the unit of the loop (K
batches a loop step, kosmoss.run.chunks) or the optimisation (manual or automatic). From
those the counters are written as Lightning writes them at a training batch's end; on an
epoch's last batch the loader moves to the next epoch's start, which Lightning then begins;
where this run has nothing left to train, as Lightning leaves them when training ends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from . import lightning_private as private
from .lean import LeanCallback


@dataclass(frozen=True)
class Position:
    """Where a checkpoint stands, in terms no hook or K changes."""

    epoch: int
    batches_done: int  # of ``epoch``'s batches
    steps: int  # optimizer steps made

    def at_epoch_end(self, per_epoch: int) -> bool:
        return self.batches_done >= per_epoch


class ExactResume(LeanCallback):
    """Rewrites a checkpoint's fit-loop state (see the module docstring) for a run making
    ``steps_per_execution`` optimizer steps per step of Lightning's loop."""

    def __init__(self, steps_per_execution: int) -> None:
        self.steps = steps_per_execution

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        loops = private.fit_loop_state(checkpoint)
        position = saved_position(loops) if loops else None
        if position is None or trainer.datamodule is None:
            return
        per_epoch = trainer.datamodule.train_batches_per_epoch()
        _move_steps(loops, position.steps)
        if _nothing_left(trainer, position, per_epoch):
            _as_training_ended(loops, position, self._loop_steps(position, per_epoch))
        else:
            _as_batch_ended(loops, position, self._loop_steps(position, per_epoch), per_epoch)

    def _loop_steps(self, position: Position, per_epoch: int) -> int:
        """The epoch's loop steps done, in this run's unit: a chunk a step left part of at
        --max-steps counts once the resumed epoch has taken the rest (its first chunk fills
        up to K), unless it was the epoch's last."""
        done = position.batches_done
        return math.ceil(done / self.steps) if done >= per_epoch else done // self.steps


def saved_position(loops: dict) -> Optional[Position]:
    """The checkpoint's position, or None for one without the train loader's state."""
    loader = private.loader_states(loops)[0]
    epoch, done = loader.get("epoch"), loader.get("batches_done")
    if epoch is None or done is None:
        return None
    automatic_step, _, manual = private.step_progresses(loops)
    steps = max(automatic_step["total"]["completed"], manual["total"]["completed"])
    return Position(int(epoch), int(done), int(steps))


def _nothing_left(trainer, position: Position, per_epoch: int) -> bool:
    """This run's limits are reached: Lightning skips its fit, whose counters must then
    read as at the end of a run that trained to here."""
    epochs = position.epoch + 1 if position.at_epoch_end(per_epoch) else None
    return _reached(position.steps, trainer.max_steps) or (
        epochs is not None and _reached(epochs, trainer.max_epochs))


def _reached(count: int, limit: Optional[int]) -> bool:
    return limit is not None and limit != -1 and count >= limit  # -1: no limit, as Lightning


def _as_batch_ended(loops: dict, position: Position, loop_steps: int, per_epoch: int) -> None:
    """As Lightning saves at ``on_train_batch_end`` inside ``position.epoch``: it resumes
    that epoch after the batch; after its last batch it counts the epoch done and starts
    the next, whose order the loader then gives from its first batch."""
    for counters in _both(loops[private.EPOCH_PROGRESS]):
        _set(counters, ready=position.epoch + 1, started=position.epoch + 1,
             processed=position.epoch, completed=position.epoch)
    last = position.at_epoch_end(per_epoch)
    _set_batches(loops[private.BATCH_PROGRESS], loop_steps, completed_lag=1, last=last)
    # Lightning adds one on this restart: its count moves after on_train_batch_end.
    private.set_saved_logged_steps(loops, position.steps - 1)
    # After the last batch the loader's own state, "every batch of the epoch done", already
    # reads as the next epoch's start (RankBatchSampler.resume).


def _as_training_ended(loops: dict, position: Position, loop_steps: int) -> None:
    """As Lightning leaves its loops once the fit ends (its epoch closed): resumed, it has
    nothing to train, and what is logged after (validation, test) goes at the last step."""
    for counters in _both(loops[private.EPOCH_PROGRESS]):
        _set(counters, ready=position.epoch + 1, started=position.epoch + 1,
             processed=position.epoch + 1, completed=position.epoch + 1)
    _set_batches(loops[private.BATCH_PROGRESS], loop_steps, completed_lag=0, last=False)
    private.set_saved_logged_steps(loops, position.steps)


def _set_batches(progress: dict, loop_steps: int, *, completed_lag: int, last: bool) -> None:
    """The epoch's loop steps done; the total keeps the epochs before, as counted."""
    earlier = progress["total"]["processed"] - progress["current"]["processed"]
    for counters, base in ((progress["current"], 0), (progress["total"], earlier)):
        done = base + loop_steps
        _set(counters, ready=done, started=done, processed=done, completed=done - completed_lag)
    progress["is_last_batch"] = last


def _move_steps(loops: dict, steps: int) -> None:
    """Both optimisations' step counters at ``steps``: a resume with another K (manual
    optimisation) or none (automatic) would otherwise start at step 0."""
    for progress in private.step_progresses(loops):
        delta = steps - progress["total"]["completed"]
        for counters in _both(progress):
            for key in counters:  # their differences say where in a step it was saved
                counters[key] += delta


def _both(progress: dict):
    return progress["total"], progress["current"]


def _set(counters: dict, **values: int) -> None:
    for key, value in values.items():
        if key in counters:
            counters[key] = value
