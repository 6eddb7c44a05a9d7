"""Every private Lightning (and torch) name kosmoss relies on exists in the installed
versions, with the shape kosmoss uses; and only kosmoss.run.lightning_private touches one
(an override excepted, where its entry says so). A failure names the entry."""
import ast
import importlib
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers import RandomSource

import kosmoss
from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.data.store import prepare
from kosmoss.model import LitMLP
from kosmoss.run import lightning_private as private
from kosmoss.run.datamodule import RunDataModule

PACKAGE = Path(kosmoss.__file__).parent
COUNTER_KEYS = {"total", "current"}


def _entry(name):
    return next(entry for entry in private.NAMES if entry.name == name)


def _label(entry):
    return f"{entry.owner} {entry.name} ({entry.kind}, used by {', '.join(entry.users)}: " \
           f"{entry.why})"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A small fit with everything kosmoss reaches into: a ModelCheckpoint, a resumable
    loader, a CSV logger; and the checkpoint it saved."""
    folder = tmp_path_factory.mktemp("private")
    dataset = prepare(RandomSource(400, levels=3), folder / "data", shard_size=128)
    pl.seed_everything(0, verbose=False)
    model = LitMLP(dataset.n_x, (8,), dataset.n_y, stats=dataset.statistics())
    saver = pl.callbacks.ModelCheckpoint(dirpath=folder / "ckpt", monitor="val_loss",
                                         save_last=True)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=5, callbacks=[saver],
                         logger=pl.loggers.CSVLogger(folder, name="csv", version=""),
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, val_check_interval=3)
    trainer.fit(model, datamodule=RunDataModule(dataset, batch_size=32, seed=1))
    trainer.save_checkpoint(folder / "end.ckpt")
    checkpoint = torch.load(folder / "end.ckpt", weights_only=False)
    return {"trainer": trainer, "model": model, "saver": saver, "checkpoint": checkpoint}


def _owner_object(entry, fitted):
    trainer = fitted["trainer"]
    objects = {
        "LightningModule": fitted["model"],
        "ModelCheckpoint": fitted["saver"],
        "_TrainingEpochLoop": trainer.fit_loop.epoch_loop,
        "_ManualOptimization": trainer.fit_loop.epoch_loop.manual_optimization,
        "_EvaluationLoop": trainer.validate_loop,
        "CSVLogger": trainer.logger,
        "_ExperimentWriter": trainer.logger.experiment,
    }
    return objects.get(entry.owner.rsplit(":", 1)[-1])


@pytest.mark.parametrize("entry", [e for e in private.NAMES
                                   if e.kind in ("attribute", "method", "override")
                                   and ":" in e.owner and not e.owner.startswith("torch")],
                         ids=lambda e: e.name)
def test_each_private_attribute_exists_where_kosmoss_reads_it(entry, fitted):
    module_name, class_name = entry.owner.split(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    assert cls is not None, f"{_label(entry)}: {class_name} is gone from {module_name}"
    instance = _owner_object(entry, fitted)
    if instance is None:  # the launcher: built as Lightning builds it
        from lightning_fabric.plugins.environments import LightningEnvironment

        instance = cls(LightningEnvironment(), num_processes=2, num_nodes=1)
    assert isinstance(instance, cls), _label(entry)
    assert hasattr(instance, entry.name) or hasattr(cls, entry.name), \
        f"{_label(entry)}: no longer on {class_name}"
    if entry.kind == "method":
        assert callable(getattr(instance, entry.name)), _label(entry)


def test_the_attributes_have_the_shapes_kosmoss_uses(fitted):
    trainer, saver = fitted["trainer"], fitted["saver"]
    assert private.attached_trainer(fitted["model"]) is trainer
    assert isinstance(fitted["model"]._current_fx_name, (str, type(None)))
    assert private.saves_during_epochs(saver) is False
    # The last validation's step (every 3 batches), not the run's end at 5: the gap
    # CheckpointToTheEnd closes.
    assert private.last_saved_step(saver) == 3 and trainer.global_step == 5
    private.set_logged_steps(trainer, 4)
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 4
    assert isinstance(private.on_last_batch(trainer), bool)
    assert isinstance(private.batches_done(trainer), int)
    assert all(isinstance(loop.inference_mode, bool) for loop in private.evaluation_loops(trainer))
    assert private.spawned_ranks(trainer) == []  # one process: nobody spawned
    before = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total.completed
    private.count_manual_step(trainer)
    progress = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
    assert progress.total.completed == progress.total.ready == before + 1


def test_the_checkpoint_holds_the_loop_state_kosmoss_rewrites(fitted):
    loops = private.fit_loop_state(fitted["checkpoint"])
    assert loops is not None, _label(_entry("loops/fit_loop/epoch_progress"))
    state = private.loader_states(loops)[0]
    assert set(state) == {"epoch", "batches_done"}, \
        _label(_entry("loops/fit_loop/state_dict/combined_loader"))
    for key in (private.BATCH_PROGRESS, private.EPOCH_PROGRESS):
        entry = next(e for e in private.NAMES if e.name.endswith(key))
        assert COUNTER_KEYS <= set(loops.get(key, {})), _label(entry)
        assert {"processed", "completed"} <= set(loops[key]["total"]), _label(entry)
    for progress in private.step_progresses(loops):
        assert COUNTER_KEYS <= set(progress) and "completed" in progress["total"]
    automatic, _, manual = private.step_progresses(loops)
    assert automatic["total"]["completed"] == fitted["trainer"].global_step
    assert manual["total"]["completed"] == 0
    logged = _entry("loops/fit_loop/epoch_loop.state_dict/_batches_that_stepped")
    assert private.saved_logged_steps(loops) == fitted["trainer"].global_step, _label(logged)


class CountValidations(pl.Callback):
    """The step of every validation the fit runs."""

    def __init__(self) -> None:
        self.steps = []

    def on_validation_start(self, trainer, pl_module):
        self.steps.append(trainer.global_step)


def test_a_fit_ends_after_the_step_that_sets_max_steps_without_validating(random_dataset,
                                                                         tmp_path):
    """end_fit_here inside an epoch: no validation, no row off the loggers' cadence, and the
    fit's step is the one made (StopOnSignal relies on it)."""

    class EndAt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 5:
                private.end_fit_here(trainer)

    validations = CountValidations()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=3, num_sanity_val_steps=0,
                         callbacks=[EndAt(), validations], log_every_n_steps=4,
                         logger=pl.loggers.CSVLogger(tmp_path, name="csv", version=""),
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    model = LitMLP(random_dataset.n_x, (4,), random_dataset.n_y)
    trainer.fit(model, datamodule=RunDataModule(random_dataset, batch_size=64, seed=1))
    entry = _entry("max_steps")
    assert (trainer.global_step, validations.steps) == (5, []), _label(entry)
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[1]) for row in rows] == [3], _label(entry)  # (3 + 1) % 4 == 0


def test_a_skipped_validation_is_that_epochs_only(random_dataset, tmp_path):
    """skip_next_validation on an epoch's last batch: that epoch ends without validating (its
    checkpoint with it), the next one validates (StopWhenDiverged relies on the first)."""

    class SkipFirst(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.current_epoch == 0 and private.on_last_batch(trainer):
                private.skip_next_validation(trainer)

    validations = CountValidations()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, num_sanity_val_steps=0,
                         callbacks=[SkipFirst(), validations], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    model = LitMLP(random_dataset.n_x, (4,), random_dataset.n_y)
    trainer.fit(model, datamodule=RunDataModule(random_dataset, batch_size=64, seed=1))
    epoch = trainer.global_step // 2
    assert validations.steps == [2 * epoch], _label(_entry("_skip_next_val"))


@pytest.mark.parametrize("every, max_epochs", [(1, 3), (3, 7), (2, 4)])
def test_the_epochs_the_divergence_check_ends_are_those_lightning_validates(
        every, max_epochs, random_dataset):
    """kosmoss.run.divergence.saves_after_this_epoch mirrors Lightning's choice of the epochs
    it validates (and saves after), with the fit's last epoch added: a Lightning whose rule
    changed would let NaN weights reach a checkpoint unchecked."""
    from kosmoss.run.divergence import saves_after_this_epoch

    class Said(pl.Callback):
        def __init__(self):
            self.epochs = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if private.on_last_batch(trainer) and saves_after_this_epoch(trainer):
                self.epochs.append(trainer.current_epoch)

    class Validated(pl.Callback):
        def __init__(self):
            self.epochs = []

        def on_validation_start(self, trainer, pl_module):
            self.epochs.append(trainer.current_epoch)

    said, validated = Said(), Validated()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs,
                         check_val_every_n_epoch=every, num_sanity_val_steps=0,
                         callbacks=[said, validated], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False)
    model = LitMLP(random_dataset.n_x, (4,), random_dataset.n_y)
    trainer.fit(model, datamodule=RunDataModule(random_dataset, batch_size=64, seed=1))
    assert validated.epochs == [e for e in range(max_epochs) if (e + 1) % every == 0]
    assert said.epochs == sorted(set(validated.epochs) | {max_epochs - 1})


def test_a_none_hook_is_skipped_by_lightnings_dispatcher(random_dataset):
    class Skipped(pl.Callback):
        on_train_batch_end = None

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, callbacks=[Skipped()],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    model = LitMLP(random_dataset.n_x, (4,), random_dataset.n_y)
    trainer.fit(model, datamodule=FlattenedDataModule(random_dataset, batch_size=64))
    assert trainer.global_step == 2, _label(_entry("callable(hook)"))


def test_torchs_private_names():
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    buckets = private.bucket_assignment(params, [2**20])
    assert sorted(i for bucket in buckets[0] for i in bucket) == [0, 1]
    flat = private.flatten([p.detach() for p in params])
    assert flat.numel() == 8
    assert [t.shape for t in private.unflatten(flat, params)] == [p.shape for p in params]
    optimizer = torch.optim.SGD(params, lr=0.1)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    assert hasattr(optimizer.step, "_wrapped_by_lr_sched"), _label(_entry("_wrapped_by_lr_sched"))
    optimizer.step()
    assert optimizer._opt_called, _label(_entry("_opt_called"))
    again = torch.optim.SGD(params, lr=0.1)
    again.step = private.track_scheduler_order(again, again.step)
    again.step()
    assert again._opt_called and hasattr(again.step, "_wrapped_by_lr_sched")


def _touches(tree: ast.AST, name: str) -> bool:
    """Code that reads, writes, defines, imports or names (a string, as getattr takes)
    ``name``; prose in docstrings and comments does not count."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == name
                or isinstance(node, ast.Name) and node.id == name
                or isinstance(node, ast.alias) and node.name.split(".")[-1] == name
                or isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name
                or isinstance(node, ast.Constant) and node.value == name):
            return True
    return False


def _uses(name: str):
    """kosmoss modules (other than lightning_private) whose code touches a private name."""
    for path in PACKAGE.rglob("*.py"):
        if path.name != "lightning_private.py" and _touches(ast.parse(path.read_text()), name):
            yield ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


@pytest.mark.parametrize("entry", [e for e in private.NAMES if e.name.startswith("_")],
                         ids=lambda e: e.name)
def test_only_lightning_private_touches_a_private_name(entry):
    allowed = set(entry.users) if entry.kind == "override" else set()
    assert set(_uses(entry.name)) <= allowed, \
        f"{entry.name} is used outside kosmoss.run.lightning_private: read or write it there"
