"""The run path's trims (kosmoss.run.lean) change no number a run records: LeanLitMLP
trains to the same weights and logs the same rows as the lesson's LitMLP."""
import inspect

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger

from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.model import LitMLP
from kosmoss.run.lean import LeanLitMLP, LeanModelCheckpoint, used_hooks


def _fit(model_class, dataset, tmp_path, progress=False, every=5):
    pl.seed_everything(3, verbose=False)
    model = model_class(dataset.n_x, (16,), dataset.n_y, stats=dataset.statistics())
    logger = CSVLogger(tmp_path, name="csv", version="")
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=logger, max_steps=23,
                         log_every_n_steps=every, enable_progress_bar=progress,
                         enable_checkpointing=False, enable_model_summary=False,
                         use_distributed_sampler=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=FlattenedDataModule(dataset, batch_size=64, seed=1))
    return trainer, model, (tmp_path / "csv" / "metrics.csv").read_text()


def test_the_lean_model_trains_and_logs_as_the_textbook_one(random_dataset, tmp_path):
    _, textbook, textbook_rows = _fit(LitMLP, random_dataset, tmp_path / "a")
    _, lean, lean_rows = _fit(LeanLitMLP, random_dataset, tmp_path / "b")
    for name, value in textbook.state_dict().items():
        torch.testing.assert_close(lean.state_dict()[name], value, rtol=0, atol=0, msg=name)
    assert lean_rows == textbook_rows and "train_loss" in lean_rows


def test_a_lean_checkpoint_loads_into_the_textbook_model(random_dataset, tmp_path):
    trainer, lean, _ = _fit(LeanLitMLP, random_dataset, tmp_path)
    trainer.save_checkpoint(tmp_path / "lean.ckpt")
    loaded = LitMLP.load_from_checkpoint(tmp_path / "lean.ckpt")
    x = torch.randn(5, random_dataset.n_x)
    torch.testing.assert_close(loaded.eval()(x), lean.eval()(x))


def test_the_hook_name_is_a_plain_attribute_and_the_rest_still_registers():
    model = LeanLitMLP(4, (3,), 2)
    before = set(model.state_dict())
    for name in ("training_step", None):  # what Lightning sets around every hook
        model._current_fx_name = name
        assert model._current_fx_name == name
    model.extra = torch.nn.Linear(1, 1)  # any other name takes nn.Module's path
    model.scale = torch.nn.Parameter(torch.ones(1))
    assert "extra" in dict(model.named_children()) and "scale" in dict(model.named_parameters())
    assert set(model.state_dict()) == before | {"extra.weight", "extra.bias", "scale"}


def test_lightning_still_passes_batch_idx_to_training_step():
    from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature

    assert LeanLitMLP.training_step.__signature__ == inspect.signature(LeanLitMLP.training_step)
    assert is_param_in_hook_signature(LeanLitMLP(4, (3,), 2).training_step, "batch_idx",
                                      min_args=2)

    class OneArgument(LeanLitMLP):  # an override is inspected as itself
        def training_step(self, batch):
            return super().training_step(batch, 0)

    assert not is_param_in_hook_signature(OneArgument(4, (3,), 2).training_step, "batch_idx",
                                          min_args=2)


@pytest.mark.parametrize("progress", [True, False])
def test_train_loss_goes_to_the_progress_bar_only_where_there_is_one(random_dataset, tmp_path,
                                                                     progress):
    """Without a progress bar Lightning would still turn the loss into a float each step."""
    trainer, _, _ = _fit(LeanLitMLP, random_dataset, tmp_path, progress=progress)
    assert "train_loss" in trainer.callback_metrics  # logged either way
    assert ("train_loss" in trainer.progress_bar_metrics) == progress


def test_the_lean_checkpoint_callback_saves_what_lightnings_saves(random_dataset, tmp_path):
    for name, callback in (("stock", pl.callbacks.ModelCheckpoint), ("lean", LeanModelCheckpoint)):
        pl.seed_everything(3, verbose=False)
        model = LitMLP(random_dataset.n_x, (16,), random_dataset.n_y,
                       stats=random_dataset.statistics())
        saver = callback(dirpath=tmp_path / name, monitor="val_loss", save_last=True,
                         save_top_k=2)
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, max_epochs=3,
                             callbacks=[saver], enable_progress_bar=False,
                             enable_model_summary=False, use_distributed_sampler=False)
        trainer.fit(model, datamodule=FlattenedDataModule(random_dataset, batch_size=64, seed=1))
    assert (sorted(p.name for p in (tmp_path / "stock").iterdir())
            == sorted(p.name for p in (tmp_path / "lean").iterdir()))
    assert used_hooks(LeanModelCheckpoint(dirpath=tmp_path)) == ()
