import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.data.store import open_dataset
from kosmoss.model import LitMLP
from kosmoss.run.report import mean_baseline_loss


def _model(dataset, **kwargs):
    return LitMLP(dataset.n_x, (32, 32), dataset.n_y, stats=dataset.statistics(), **kwargs)


def _trainer(tmp_path, **kwargs):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, use_distributed_sampler=False,
                      default_root_dir=tmp_path, **kwargs)


def test_default_model_is_the_course_model():
    model = LitMLP(4128, out_channels=552)
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linears] == [100, 100, 100, 552]
    assert all(isinstance(m, torch.nn.SiLU) for m in model.net if not isinstance(m, torch.nn.Linear))


def test_statistics_are_buffers_and_in_the_state_dict(random_dataset):
    model = _model(random_dataset)
    stats = random_dataset.statistics()
    assert {"x_mean", "x_std", "y_mean", "y_std"} <= set(model.state_dict())
    np.testing.assert_allclose(model.y_mean.numpy(), stats.y_mean, rtol=1e-6)
    assert model.x_std[0] == 1.0  # zero-variance feature made safe
    assert model.to(torch.float64).x_mean.dtype == torch.float64  # buffers follow the module
    assert "stats" not in model.hparams


def test_the_model_is_textbook_lightning():
    """The lesson's LitMLP overrides no Lightning or torch internals: the run path's trims
    live in kosmoss.run.lean (tests/run/test_lean.py)."""
    overridden = set(vars(LitMLP)) & {"__setattr__", "log", "__getattr__"}
    assert not overridden
    assert not hasattr(LitMLP.training_step, "__signature__")


def test_forward_is_in_physical_units(random_dataset):
    model = _model(random_dataset)
    x = torch.randn(4, random_dataset.n_x)
    expected = model.net((x - model.x_mean) / model.x_std) * model.y_std + model.y_mean
    torch.testing.assert_close(model(x), expected)


def test_checkpoint_reloads_and_predicts_the_same(random_dataset, tmp_path):
    model = _model(random_dataset, lr=3e-3)
    trainer = _trainer(tmp_path, max_steps=3)
    trainer.fit(model, datamodule=FlattenedDataModule(random_dataset, batch_size=64))
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    reloaded = LitMLP.load_from_checkpoint(path)
    assert reloaded.hparams.lr == 3e-3 and tuple(reloaded.hparams.hidden_channels) == (32, 32)
    x = torch.randn(8, random_dataset.n_x)
    model.eval(), reloaded.eval()
    torch.testing.assert_close(reloaded(x), model(x))
    torch.testing.assert_close(reloaded.y_std, model.y_std)


def test_the_model_learns_the_synthetic_physics(shared_home, tmp_path):
    dataset = open_dataset(shared_home / "data" / "levels10")
    pl.seed_everything(0, verbose=False)
    model = LitMLP(dataset.n_x, (100, 100, 100), dataset.n_y, lr=2e-3,
                   stats=dataset.statistics())
    datamodule = FlattenedDataModule(dataset, batch_size=64, seed=0)
    trainer = _trainer(tmp_path, max_epochs=8)
    trainer.fit(model, datamodule=datamodule)
    val_loss = float(trainer.callback_metrics["val_loss"])
    baseline = mean_baseline_loss(dataset.statistics())
    assert val_loss < 0.1 * baseline, (val_loss, baseline)


def test_warmup_schedule_steps_the_optimizer_rate():
    model = LitMLP(6, (4,), 3, lr=4e-3, warmup_steps=4, warmup_start_lr=1e-3)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([1e-3, 1.75e-3, 2.5e-3, 3.25e-3, 4e-3, 4e-3])
    assert isinstance(LitMLP(6, (4,), 3).configure_optimizers(), torch.optim.Adam)
