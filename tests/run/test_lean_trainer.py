"""What kosmoss's Trainer leaves out of Lightning's per-step Python (docs/benchmarks.md), and that
leaving it out changes nothing a run records."""
from datetime import timedelta

import pytorch_lightning as pl

from kosmoss.run import RunConfig
from kosmoss.run.callbacks import CheckpointToTheEnd
from kosmoss.run.lean import NoProfiler


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


def test_a_run_calls_per_batch_only_the_hooks_its_callbacks_use(tmp_path):
    from kosmoss.diagnose.hang import StartupCheck
    from kosmoss.diagnose.heartbeat import Heartbeat
    from kosmoss.run.callbacks import GpuShare, PrecisionProbe, ReplicaCheck, ThroughputMeter
    from kosmoss.run.faults import DeadRankNamed
    from kosmoss.run.lean import used_hooks
    from kosmoss.run.preemption import StopOnSignal

    used = {type(cb).__name__: used_hooks(cb) for cb in (
        DeadRankNamed(tmp_path), ThroughputMeter(), ReplicaCheck(), PrecisionProbe(),
        StopOnSignal(tmp_path), Heartbeat(tmp_path), GpuShare(None), StartupCheck(1.0),
        CheckpointToTheEnd(dirpath=tmp_path, monitor="val_loss", save_last=True))}
    assert used == {
        "DeadRankNamed": (), "ReplicaCheck": (), "PrecisionProbe": (), "GpuShare": (),
        "StartupCheck": (), "CheckpointToTheEnd": (),
        "ThroughputMeter": ("on_train_batch_end",), "StopOnSignal": ("on_train_batch_end",),
        "Heartbeat": ("on_train_batch_start", "on_train_batch_end", "on_before_backward",
                      "on_after_backward"),
    }


def test_the_checkpoint_callback_keeps_its_batch_hook_when_it_saves_by_step(tmp_path):
    from kosmoss.run.lean import used_hooks

    by_step = CheckpointToTheEnd(dirpath=tmp_path, every_n_train_steps=5)
    assert used_hooks(by_step) == ("on_train_batch_end",)
    by_time = CheckpointToTheEnd(dirpath=tmp_path, train_time_interval=timedelta(minutes=1))
    assert used_hooks(by_time) == ("on_train_batch_end",)
