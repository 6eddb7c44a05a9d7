"""A checkpoint taken on an epoch's last batch — by Lightning's own
``ModelCheckpoint(every_n_train_steps=...)`` when the epoch's length divides it, or any
callback's ``trainer.save_checkpoint`` in ``on_train_batch_end`` — resumes into the next
epoch, in that epoch's order, and ends on the weights of the run never stopped.

Lightning creates a resumed run's training iterator before it moves on to the next epoch
and does not create it again: the loader's saved position (the whole epoch done) once gave
an empty iterator, so the next epoch was skipped and the run trained the one after it."""
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from kosmoss.run.chunks import StepsInChunks
from kosmoss.run.datamodule import RunDataModule
from kosmoss.run.lean import LeanLitMLP

BATCH, STEPS = 64, 40  # 800 training rows of 1000: 13 batches an epoch, the last of 32


class Epochs(pl.Callback):
    """The epochs whose batches trained, in order (one entry an epoch)."""

    def __init__(self):
        self.trained = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.trained or self.trained[-1] != trainer.current_epoch:
            self.trained.append(trainer.current_epoch)


def _fit(dataset, folder, model_class, k, ckpt=None, every=None):
    pl.seed_everything(5, verbose=False)
    model = model_class(dataset.n_x, (16,), dataset.n_y, stats=dataset.statistics())
    epochs = Epochs()
    callbacks = [epochs]
    if every:
        callbacks.append(ModelCheckpoint(dirpath=folder / "checkpoints", every_n_train_steps=every,
                                         save_top_k=-1, filename="{step}"))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False,
                         callbacks=callbacks, enable_checkpointing=bool(every),
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, default_root_dir=folder)
    module = RunDataModule(dataset, batch_size=BATCH, seed=1, mode="controlled",
                           steps_per_execution=k, chunked=model_class is StepsInChunks)
    trainer.fit(model, datamodule=module, ckpt_path=ckpt)
    return trainer, model, epochs.trained


@pytest.mark.parametrize("model_class,k", [(LeanLitMLP, 1), (StepsInChunks, 1), (StepsInChunks, 4)],
                         ids=["one-batch-steps", "chunks-of-1", "chunks-of-4"])
def test_a_checkpoint_on_an_epochs_last_batch_resumes_into_the_next_epoch(
        random_dataset, tmp_path, model_class, k):
    straight, model, trained = _fit(random_dataset, tmp_path / "straight", model_class, k,
                                    every=13)  # saved on the last batch of epochs 0 and 1
    assert trained == [0, 1, 2, 3] and straight.global_step == STEPS
    for step, epoch in ((13, 1), (26, 2)):
        ckpt = tmp_path / "straight" / "checkpoints" / f"step={step}.ckpt"
        assert torch.load(ckpt, weights_only=False)["epoch"] == epoch - 1  # not at its end yet
        resumed, again, trained = _fit(random_dataset, tmp_path / f"from-{step}", model_class, k,
                                       ckpt=ckpt)
        assert trained == list(range(epoch, 4)), f"resumed from step {step}"
        assert resumed.global_step == STEPS
        for name, value in model.state_dict().items():
            torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=0, msg=name)
