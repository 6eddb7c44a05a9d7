"""What kosmoss's Trainer leaves out of Lightning's per-step Python (issue 19), and that
leaving it out changes nothing a run records."""
import pytorch_lightning as pl
import pytest

from kosmoss.run import RunConfig
from kosmoss.run.callbacks import CheckpointToTheEnd
from kosmoss.run.profiler import NoProfiler


def test_the_run_trainer_profiles_nothing_with_one_shared_context(shared_home, monkeypatch):
    from kosmoss.run.plan import prepare
    from kosmoss.run.train import build_trainer

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    trainer = build_trainer(prepare(RunConfig(dataset="tiny", progress=False)), [])
    profiler = trainer.profiler
    assert isinstance(profiler, NoProfiler) and isinstance(profiler, pl.profilers.PassThroughProfiler)
    outer = profiler.profile("[Callback]a.on_train_batch_end")
    with outer:
        with profiler.profile("[LightningModule]LitMLP.training_step") as inner_value:
            assert inner_value is None  # what PassThroughProfiler's context gives too
    assert outer is profiler.profile("another") and profiler.describe() is None


def test_the_checkpoint_callback_keeps_lightnings_state_key(tmp_path):
    options = dict(dirpath=tmp_path, monitor="val_loss", save_last=True)
    ours, stock = CheckpointToTheEnd(**options), pl.callbacks.ModelCheckpoint(**options)
    assert ours.state_key == stock.state_key.replace("ModelCheckpoint", "CheckpointToTheEnd")
    assert ours.state_key is ours.state_key  # built once: checkpoints keep finding it
    other = CheckpointToTheEnd(dirpath=tmp_path, monitor="val_rmse_wm2")
    assert other.state_key != ours.state_key and "val_rmse_wm2" in other.state_key
