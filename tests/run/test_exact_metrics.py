"""Validation metrics do not depend on the number of ranks: sums and counts, every sample of
the split counted once (103 rows: divisible by neither 2 nor 3)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from helpers import REPO
from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.data.loading import FlattenedDataset, split_indices
from kosmoss.data.splits import SPLITS
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare
from kosmoss.model import LitMLP

PROBE = Path(__file__).with_name("eval_probe.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1031-column dataset (val split of 103 rows) and a checkpoint of a model that
    trained a few steps."""
    folder = tmp_path_factory.mktemp("exact")
    # Physical fluxes: targets in W m-2 with stds far from 1, so W m-2 and normalised differ.
    dataset = prepare(SyntheticSource(1031, seed=3, levels=5), folder / "data", shard_size=256)
    pl.seed_everything(0, verbose=False)
    model = LitMLP(dataset.n_x, (32, 32), dataset.n_y, lr=1e-2, stats=dataset.statistics())
    trainer = pl.Trainer(accelerator="cpu", max_steps=5, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, datamodule=FlattenedDataModule(dataset, batch_size=64, seed=42))
    checkpoint = folder / "model.ckpt"
    trainer.save_checkpoint(checkpoint)
    return dataset, checkpoint


def _reference(dataset, checkpoint):
    """The loss over the whole validation split in one pass, float64, no Lightning."""
    model = LitMLP.load_from_checkpoint(checkpoint).eval()
    val = split_indices(dataset.n_samples, SPLITS, 42)[1]
    assert len(val) == 103
    x, y = FlattenedDataset(dataset).read(val)
    with torch.no_grad():
        prediction = model.net(model.normalize_x(x)).double()
    error = prediction - model.normalize_y(y).double()
    wm2 = error * model.y_std.double()
    return float((error ** 2).mean()), float((wm2 ** 2).mean().sqrt()), model


@pytest.mark.slow
def test_val_loss_and_rmse_equal_the_single_pass_at_1_2_and_3_ranks(trained, tmp_path):
    dataset, checkpoint = trained
    loss, rmse_wm2, model = _reference(dataset, checkpoint)
    for devices in (1, 2, 3):
        out = tmp_path / f"m{devices}.json"
        proc = subprocess.run([sys.executable, str(PROBE), "--dataset", str(dataset.path),
                               "--checkpoint", str(checkpoint), "--devices", str(devices),
                               "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads(out.read_text())
        assert metrics["world_size"] == devices
        assert metrics["val_loss"] == pytest.approx(loss, rel=1e-6), devices
        # RMSE is reported in W m-2: the normalised error scaled back by each target's std,
        # so it lies between sqrt(loss) times the smallest and the largest scale.
        assert metrics["val_rmse_wm2"] == pytest.approx(rmse_wm2, rel=1e-5), devices
        scale = model.y_std.numpy()
        assert np.sqrt(loss) * scale.min() <= metrics["val_rmse_wm2"] <= np.sqrt(loss) * scale.max()
        assert metrics["val_rmse_wm2"] > 2 * np.sqrt(loss)  # not the normalised RMSE
