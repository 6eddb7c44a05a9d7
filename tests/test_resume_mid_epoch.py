"""A run stopped mid-epoch and resumed ends with the weights of a run never stopped: the
train loader's state travels in the checkpoint and the epoch continues its own order."""
import signal
import warnings

import pytest
import pytorch_lightning as pl
import torch

from kosmoss.model import LitMLP
from kosmoss.run.datamodule import RunDataModule
from kosmoss.run.loops import ExactResume
from kosmoss.run.preemption import STOP_SIGNALS, StopOnSignal

TOTAL_STEPS = 22  # 13 batches per epoch: stops fall in epochs 0 and 1


class StopAt(pl.Callback):
    """What StopOnSignal does on a signal, at a chosen step."""

    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


class FirstStep(pl.Callback):
    """The global step at which this fit trained its first batch."""

    def __init__(self):
        self.step = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.step is None:
            self.step = trainer.global_step


def _fit(dataset, steps, callbacks=(), ckpt_path=None):
    pl.seed_everything(7, verbose=False)
    model = LitMLP(dataset.n_x, (16,), dataset.n_y, stats=dataset.statistics())
    datamodule = RunDataModule(dataset, batch_size=64, seed=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         limit_val_batches=0, num_sanity_val_steps=0,
                         callbacks=list(callbacks))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dataloader is not resumable.*")
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model


@pytest.mark.parametrize("stop_at", [5, 18])
def test_resumed_mid_epoch_matches_an_uninterrupted_run(random_dataset, tmp_path, stop_at):
    _, reference = _fit(random_dataset, TOTAL_STEPS)
    checkpoint = tmp_path / "stopped.ckpt"
    stopped, _ = _fit(random_dataset, TOTAL_STEPS, [StopAt(stop_at, checkpoint)])
    assert stopped.global_step == stop_at
    # Raises on Lightning's "your dataloader is not resumable" warning.
    first = FirstStep()
    resumed, model = _fit(random_dataset, TOTAL_STEPS, [first], ckpt_path=checkpoint)
    # Only the remaining steps: a fit that started over (same seed) would end with the same
    # weights too, but its first step would be 0.
    assert (first.step, resumed.global_step) == (stop_at, TOTAL_STEPS)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_a_stop_asked_on_an_epochs_last_batch_ends_that_epoch_and_resumes_exactly(
        random_dataset, tmp_path):
    """Lightning 2.6 counts an epoch done when it resumes a checkpoint of its last batch;
    StopOnSignal saves once the epoch has ended, and the resumed fit begins the next epoch
    at its first batch, in that epoch's order (kosmoss.run.loops)."""
    _, reference = _fit(random_dataset, TOTAL_STEPS)
    stopper = StopOnSignal(tmp_path)

    class SignalDuringTheLastBatch(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 12:  # the 13th batch, the last of epoch 0
                stopper._note(signal.SIGTERM, None)

    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        _fit(random_dataset, TOTAL_STEPS, [SignalDuringTheLastBatch(), stopper,
                                           ExactResume(1)])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert (stopper.stopped_by, stopper.stopped_at_step) == ("SIGTERM", 13)
    first = FirstStep()
    _, model = _fit(random_dataset, TOTAL_STEPS, [first, ExactResume(1)],
                    ckpt_path=stopper.checkpoint)
    assert first.step == 13
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0, msg=name)
