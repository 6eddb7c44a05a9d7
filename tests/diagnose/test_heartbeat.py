"""The Heartbeat callback in a real (single-process) Lightning fit: what the file says, and
that it is written at most once per interval, never every step."""
from __future__ import annotations

import json
import math
import os
import time

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from kosmoss.diagnose import heartbeat
from kosmoss.diagnose.runs import read_heartbeats

STEPS, STEP_S, INTERVAL_S = 60, 0.005, 0.1


class SleepyModel(pl.LightningModule):
    """A step of at least STEP_S, spent in training_step: the rank's own work."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_S)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_heartbeat_file_and_how_often_it_is_written(tmp_path, monkeypatch):
    writes = []

    def counted(path, data):
        writes.append((data["state"], data["step"]))
        return write(path, data)

    write = heartbeat.atomic_write_json
    monkeypatch.setattr(heartbeat, "atomic_write_json", counted)
    data = TensorDataset(torch.randn(16 * STEPS, 4), torch.randn(16 * STEPS, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False,
                         callbacks=[heartbeat.Heartbeat(tmp_path, interval_s=INTERVAL_S)],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    began = time.monotonic()
    trainer.fit(SleepyModel(), DataLoader(data, batch_size=16))
    elapsed = time.monotonic() - began

    (beat,) = read_heartbeats(tmp_path).values()
    assert (beat["rank"], beat["pid"], beat["state"], beat["step"]) == (0, os.getpid(), "ended",
                                                                         STEPS)
    assert beat["world_size"] == 1 and beat["interval_s"] == INTERVAL_S
    assert math.isfinite(beat["loss"])
    assert beat["busy_ms"] >= STEP_S * 1000  # the sleep is the rank's own work
    assert 0 < beat["steps_per_s"] <= 1 / STEP_S and beat["samples_per_s"] == pytest.approx(
        16 * beat["steps_per_s"])
    forced = [w for w in writes if w[0] in ("setup", "ended") or w[1] == 0]
    periodic = [w for w in writes if w not in forced]
    assert periodic and len(periodic) <= elapsed / INTERVAL_S + 1  # at most once per interval
    assert len(writes) < STEPS / 3  # never every step
    assert not list(tmp_path.rglob("*.tmp-*"))  # written atomically
    assert json.loads(heartbeat.heartbeat_path(tmp_path, 0).read_text()) == beat


class SlowValidation(SleepyModel):
    """Epochs of a few quick steps, each followed by a validation far longer than them."""

    def validation_step(self, batch, batch_idx):
        time.sleep(VALIDATION_S)


VALIDATION_S = 0.1


def test_epochs_shorter_than_the_interval_show_a_rate_without_their_validations(tmp_path,
                                                                              monkeypatch):
    """The tiny preset's epochs end within one interval: rates that began again after each
    validation were never in the file `kosmoss watch` read while the rank trained. Its time
    left out instead, validation slows no rate."""
    writes = []
    write = heartbeat.atomic_write_json
    monkeypatch.setattr(heartbeat, "atomic_write_json",
                        lambda path, data: (writes.append(data), write(path, data)))
    steps_per_epoch, epochs = 4, 8
    data = TensorDataset(torch.randn(16 * steps_per_epoch, 4), torch.randn(16 * steps_per_epoch, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                         callbacks=[heartbeat.Heartbeat(tmp_path, interval_s=0.5)],
                         num_sanity_val_steps=0, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(SlowValidation(), DataLoader(data, batch_size=16),
                DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=16))
    later = [w for w in writes if w["state"] in ("train", "validate") and w["epoch"] >= 2]
    assert later and all(w["steps_per_s"] is not None for w in later), writes
    # With validations counted it would be at most steps_per_epoch / VALIDATION_S = 40/s.
    assert all(2 * steps_per_epoch / VALIDATION_S < w["steps_per_s"] <= 1 / STEP_S
               for w in later), [w["steps_per_s"] for w in later]


@pytest.mark.parametrize("loss, shown", [(math.nan, "nan"), (math.inf, "inf"),
                                         (-math.inf, "-inf"), (0.25, "0.2500"), (None, "")])
def test_a_loss_that_is_no_number_is_valid_json_and_watch_shows_what_it_was(tmp_path, loss,
                                                                           shown):
    """JSON has no NaN: the heartbeat writes null and says which it was, so that a rank
    whose loss diverged shows as nan in `kosmoss watch`, not as a blank."""
    from kosmoss.diagnose.runs import loss_of_beat
    from kosmoss.diagnose.watch import _num

    path = heartbeat.heartbeat_path(tmp_path, 0)
    heartbeat.atomic_write_json(path, {"rank": 0, **heartbeat._loss_fields(loss)})
    beat = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    read = loss_of_beat(beat)
    assert (read is None) if loss is None else (str(read) == str(loss))
    assert _num(read, 4) == shown
