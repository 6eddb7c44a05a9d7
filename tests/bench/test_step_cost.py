"""python -m kosmoss.bench.step_cost: Lightning's per-step cost with next to no arithmetic."""
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from kosmoss.bench import step_cost
from kosmoss.bench.baselines import RowsInMemory
from kosmoss.diagnose.heartbeat import Heartbeat
from kosmoss.model import LitMLP
from kosmoss.run.lean import LeanLitMLP
from kosmoss.run import train as run_train
from kosmoss.run.lean import used_hooks
from kosmoss.run.preemption import StopOnSignal


def test_every_variant_is_timed_and_reported():
    found = step_cost.measure(steps=12, repeats=2)
    assert list(found) == list(step_cost.VARIANTS)
    assert all(len(times) == 2 and all(t > 0 for t in times) for times in found.values())
    text = step_cost.report(found)
    assert all(name in text for name in found) and "over plain" in text


def test_the_variants_differ_in_what_they_say():
    assert step_cost.StockSetattr.__setattr__ is torch.nn.Module.__setattr__
    assert LeanLitMLP.__setattr__ is not torch.nn.Module.__setattr__
    assert not hasattr(step_cost.InspectedStep.training_step, "__signature__")
    # The manual variant really steps the optimizer: its timing is of a training step.
    model = step_cost.tiny(step_cost.ManualStep)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(8, 1)
    loader = DataLoader(RowsInMemory(x, x.clone()), batch_size=None,
                        sampler=[torch.tensor([i]).numpy() for i in range(8)])
    pl.Trainer(barebones=True, accelerator="cpu", devices=1, max_epochs=1,
               use_distributed_sampler=False).fit(model, train_dataloaders=loader)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_full_trainer_variant_runs_lightnings_whole_loop_and_writes_nothing(tmp_path,
                                                                              monkeypatch):
    built, trainer_class = [], pl.Trainer
    monkeypatch.setattr(step_cost.pl, "Trainer",
                        lambda **kw: built.append(trainer_class(**kw)) or built[-1])
    monkeypatch.chdir(tmp_path)  # where a default logger or checkpoint would land
    assert step_cost.VARIANTS["lightning, Trainer not barebones"](6) > 0
    trainer, = built
    assert not trainer.barebones and trainer.global_step == 6
    assert trainer.logger is None and trainer.checkpoint_callback is None
    assert list(tmp_path.iterdir()) == []


def test_kosmoss_on_fabric_trains_and_logs_on_kosmoss_log_steps(tmp_path, monkeypatch):
    steps = []
    step = LitMLP.training_step
    monkeypatch.setattr(LitMLP, "training_step",
                        lambda self, batch, i: steps.append(i) or step(self, batch, i))
    assert step_cost.kosmoss_on_fabric(120, tmp_path) > 0
    assert steps == list(range(121))  # the untimed first step, then 120, in one 160-batch epoch
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    assert rows[0].split(",") == ["step", "train_loss"]
    assert len(rows) - 1 == 3  # steps 1, 50 and 100 log (done 0, 49, 99)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("argv, flag", [(["--steps", "2"], "--steps 2"),
                                        (["--repeats", "0"], "--repeats 0")])
def test_bad_counts_are_one_line(capsys, argv, flag):
    with pytest.raises(SystemExit) as stop:
        step_cost.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_the_kosmoss_variants_run_kosmoss_and_leave_out_only_what_they_say(monkeypatch):
    seen = []
    real_train, original = step_cost.train, LeanLitMLP.logs_train_loss_now

    def spy(plan):  # run_loggers read from its module, where the "loggers" line patches it
        seen.append((plan.scaling.global_batch_size, plan.config.hidden,
                     run_train.run_loggers(plan), LeanLitMLP.logs_train_loss_now is original,
                     used_hooks(Heartbeat) + used_hooks(StopOnSignal)))
        return real_train(plan)

    monkeypatch.setattr(step_cost, "train", spy)
    hooks = used_hooks(Heartbeat) + used_hooks(StopOnSignal)
    for left_out in step_cost.LEFT_OUT:
        assert step_cost.in_kosmoss(left_out)(5) > 0
    assert step_cost.in_kosmoss()(5) > 0
    # Each patch ends with its variant.
    assert LeanLitMLP.logs_train_loss_now is original
    assert used_hooks(Heartbeat) + used_hooks(StopOnSignal) == hooks and len(hooks) == 5
    no_logging, every_step, no_loggers, no_hooks, whole = seen
    assert every_step[3] is False  # patched: logged every step
    batch, hidden, loggers, logs, per_batch = whole
    assert (batch, hidden) == (1, (1,)) and len(loggers) == 2 and logs and per_batch == hooks
    assert no_logging[3:] == (False, hooks) and len(no_logging[2]) == 2
    assert no_loggers[2] is False and no_loggers[3:] == (True, hooks)
    assert no_hooks[3:] == (True, ()) and len(no_hooks[2]) == 2
