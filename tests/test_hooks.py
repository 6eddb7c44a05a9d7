"""LeanCallback: Lightning calls a callback's per-batch hooks only where it defines them."""
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from kosmoss.run.lean import PER_BATCH_HOOKS, LeanCallback, used_hooks


class Counts(LeanCallback):
    def __init__(self):
        self.batches_ended, self.started = 0, False

    def on_train_start(self, trainer, pl_module):
        self.started = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches_ended += 1


class CountsBackward(Counts):
    def __init__(self):
        super().__init__()
        self.backwards = 0

    def on_before_backward(self, trainer, pl_module, loss):
        self.backwards += 1


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_hooks_a_subclass_leaves_alone_are_none_and_the_others_stay():
    assert used_hooks(Counts()) == ("on_train_batch_end",)
    assert Counts.on_before_backward is None and Counts.on_validation_batch_end is None
    assert used_hooks(CountsBackward()) == ("on_train_batch_end", "on_before_backward")
    # Hooks called once per epoch or run are untouched: Lightning calls some directly.
    assert callable(Counts().on_train_epoch_end) and callable(Counts().state_dict)
    assert used_hooks(pl.Callback()) == PER_BATCH_HOOKS  # a stock callback: every one is called


def test_lightning_skips_the_none_hooks_and_calls_the_defined_ones():
    data = TensorDataset(torch.randn(12, 2), torch.randn(12, 1))
    lean, deeper = Counts(), CountsBackward()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[lean, deeper])
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))  # a None hook called would raise
    assert lean.started and lean.batches_ended == 6
    assert deeper.batches_ended == 6 and deeper.backwards == 6
