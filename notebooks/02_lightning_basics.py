# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 2 — Lightning basics, on one CPU process
#
# **What you will learn**
#
# - what a training loop in plain PyTorch has to do, written out once;
# - how PyTorch Lightning splits it: a `LightningModule` (the model and its steps), a
#   `LightningDataModule` (the data and its split) and a `Trainer` (the loop);
# - where the boilerplate went: devices, logging, checkpoints, validation, the loop;
# - how to train on one CPU process, then test the trained model on data it never saw;
# - that a checkpoint alone predicts in W m-2, and what `trainup_cpu.py` adds on top.
#
# Time: ~20 min; the cells run in ~5 min on 2 CPU cores

# %%
import csv
import inspect
import time

import matplotlib.pyplot as plt
import pytorch_lightning as pl
import torch

from kosmoss.core import paths
from kosmoss.data import presets
from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.lessons import quiet_lightning
from kosmoss.model import LitMLP
from kosmoss.run.report import mean_baseline_loss

# No start-up banners or adverts, no warnings a learner cannot act on; the others on one line.
quiet_lightning()

# `small`, the default dataset: lesson 1's `tiny` is too small to generalise from (try it).
dataset = presets.resolve("small", log=print)
stats = dataset.statistics()
print(f"dataset: {dataset.n_samples} columns, x {dataset.n_x} / y {dataset.n_y} features")

# %% [markdown]
# ## A training loop in plain PyTorch
#
# Before Lightning, here is everything a loop has to do by hand: build the split, a
# loader, the model and an optimiser, then for every batch normalise, predict, compute
# the loss, back-propagate and step. We reuse kosmoss's model only for its network and
# its normalisation buffers.

# %%
datamodule = FlattenedDataModule(dataset, batch_size=128, seed=42)
datamodule.setup()
print({stage: len(indices) for stage, indices in datamodule.indices.items()}, "columns per split")

torch.manual_seed(0)
plain = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats)
optimizer = torch.optim.Adam(plain.parameters(), lr=1e-3)
plain.train()
losses = []
for step, (x, y) in enumerate(datamodule.train_dataloader()):
    optimizer.zero_grad()
    prediction = plain.net(plain.normalize_x(x))
    loss = torch.nn.functional.mse_loss(prediction, plain.normalize_y(y))
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    if step == 99:  # enough to see it learn
        break
print(f"{len(losses)} steps by hand: loss {losses[0]:.3f} -> {losses[-1]:.3f}")

# %% [markdown]
# And that loop still lacks validation, a test, logging, checkpoints, moving tensors to
# a GPU, several processes, mixed precision, resuming... Every project writes those again,
# slightly differently, and the differences are where bugs live.
#
# ## The LightningModule: the model and what one step does
#
# `kosmoss.model.LitMLP` is the course's model (three hidden layers, SiLU) as a
# `LightningModule`. Read its steps: training, validation and test all go through one
# `_common_step(batch, stage)`, so they cannot drift apart.

# %%
print(inspect.getsource(LitMLP._common_step))
print(inspect.getsource(LitMLP.configure_optimizers))

# %% [markdown]
# Notice what is *not* there: no `.to(device)`, no `loss.backward()`, no
# `optimizer.step()`, no loop. `self.log` records a metric. With several processes
# (lesson 3) each one computes its own: `sync_dist=True` makes Lightning reduce a logged
# value over the processes, and a torchmetrics metric (here `self.mse`, an exact sum of
# squared errors and a count) reduces its states itself — lesson 3b shows why the
# validation loss uses the second. `save_hyperparameters()` in the constructor stores
# the arguments in every checkpoint.
#
# ## The LightningDataModule: the data and its split
#
# `kosmoss.data.datamodule.FlattenedDataModule` holds the dataset path, the batch size
# and the seed, and makes the seeded train/validation/test split in `setup`. Its loaders
# hand out whole batches of indices: one read per batch, not per sample.

# %%
print(inspect.getsource(FlattenedDataModule.setup))
print(inspect.getsource(FlattenedDataModule.loader))

# %% [markdown]
# ## The Trainer: the loop
#
# One CPU process: `accelerator="cpu"`, `devices=1`. The loggers write a CSV of the
# metrics that we plot afterwards.

# %%
run_dir = paths.runs_root() / "lesson-02"
pl.seed_everything(42, verbose=False)
model = LitMLP(dataset.n_x, out_channels=dataset.n_y, lr=1e-3, stats=stats)
datamodule = FlattenedDataModule(dataset, batch_size=128, seed=42)
trainer = pl.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=4,
    logger=pl.loggers.CSVLogger(run_dir, name="csv"),
    default_root_dir=run_dir,
    log_every_n_steps=10,
    enable_model_summary=False,  # printed below without its FLOPs column (0 without an example input)
    enable_progress_bar=False,
    use_distributed_sampler=False,  # the DataModule already gives each rank its batches
)
parameters = sum(p.numel() for p in model.parameters())
print(f"{type(model).__name__}: {parameters:,} parameters, "
      f"{parameters * 4 / 2**20:.1f} MiB in float32; layers: {model.net}")
started = time.perf_counter()
trainer.fit(model, datamodule=datamodule)
batches_per_epoch = -(-len(datamodule.indices["train"]) // datamodule.batch_size)  # none dropped
print(f"fit: {trainer.global_step} steps in {time.perf_counter() - started:.1f} s "
      f"({trainer.max_epochs} epochs of {batches_per_epoch} batches)")
assert trainer.global_step == trainer.max_epochs * batches_per_epoch, "one step per batch"

# %% [markdown]
# ## Test after fit
#
# The test split was never used for training nor for choosing the checkpoint. Testing
# once, at the end, tells how the model does on columns it has never seen.

# %%
scores = trainer.test(model, datamodule=datamodule, verbose=False)[0]
baseline = mean_baseline_loss(stats)
print(f"test loss {scores['test_loss']:.4f} (normalised MSE; predicting the mean scores "
      f"{baseline:.3f}: {baseline / scores['test_loss']:.0f}x worse)")
print(f"test RMSE {scores['test_rmse_wm2']:.1f} W m-2")
assert scores["test_loss"] < baseline, "training must beat predicting the mean"

# %%
def curve(rows, name):
    """(steps, values) of one metric from Lightning's metrics.csv (empty cells: not logged)."""
    points = [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]
    return [p[0] for p in points], [p[1] for p in points]


with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
    rows = list(csv.DictReader(f))
plt.figure(figsize=(7, 4))
plt.plot(*curve(rows, "train_loss"), label="train loss")
plt.plot(*curve(rows, "val_loss"), "o-", label="validation loss (each epoch)")
plt.axhline(baseline, color="grey", ls="--", label="predicting the mean")
plt.yscale("log")
plt.xlabel("optimizer step")
plt.ylabel("MSE on normalised fluxes")
plt.legend()
plt.show()

# %% [markdown]
# ## A checkpoint alone predicts in W m-2
#
# The Trainer's default checkpoint callback saved the weights of the last epoch. Loading
# them needs no dataset:
# the normalisation buffers are inside, and `forward` returns fluxes in W m-2. The
# restored model predicts the same values as the trained one in memory, and scores on the
# whole test split what `trainer.test` reported.

# %%
checkpoint = trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path
restored = LitMLP.load_from_checkpoint(checkpoint)
restored.eval()
model.eval()
datamodule.setup()
x, y = datamodule.data[datamodule.indices["test"]]
with torch.no_grad():
    fluxes = restored(x)
    in_memory = model(x)
restored_rmse = float(torch.sqrt(torch.mean((fluxes - y) ** 2)))
print(f"checkpoint {checkpoint}")
print(f"hyperparameters saved with it: {dict(restored.hparams)}")
print(f"largest difference from the model in memory: "
      f"{float((fluxes - in_memory).abs().max()):.3g} W m-2")
print(f"RMSE of the restored model on the {len(x)} test columns: {restored_rmse:.3f} W m-2 "
      f"(trainer.test: {scores['test_rmse_wm2']:.3f})")
assert torch.equal(fluxes, in_memory), "the checkpoint holds other weights or statistics"
# The same squared errors, summed in another order (all at once against batch by batch).
assert abs(restored_rmse - scores["test_rmse_wm2"]) < 1e-4 * scores["test_rmse_wm2"]

# %% [markdown]
# ## What `trainup_cpu.py` adds
#
# The course's launcher does the same on one process, plus what a real run needs: the
# scaling arithmetic printed (lesson 4), TensorBoard and CSV logs, the best and last
# checkpoints, throughput, and a `result.json` that later lessons read. It runs in its
# own process; `--result-json` also writes the result where we ask.

# %%
import json
import sys
from pathlib import Path

from kosmoss.lessons import scratch_folder, script, sh

out = scratch_folder("lesson02-") / "result.json"  # removed when the kernel exits
sh([sys.executable, script("trainup_cpu.py"), "--dataset", "small", "--max-epochs", "1",
    "--batch-size", "128", "--no-progress", "--result-json", str(out)])
result = json.loads(out.read_text())
print({k: result[k] for k in ("world_size", "accelerator", "global_step", "test_loss",
                              "train_samples_per_s", "run_dir")})
assert result["world_size"] == 1 and result["accelerator"] == "cpu"
assert result["global_step"] == batches_per_epoch, "one epoch of the same split, batch 128"
assert result["test_loss"] < baseline, "one epoch already beats predicting the mean"

# %% [markdown]
# ## With a GPU
#
# Only the Trainer's arguments change: `accelerator="gpu"`, `devices=1`. Lightning moves
# the model and every batch to the GPU; the model code stays as it is (its buffers
# follow it). The cell below trains for a few steps on a GPU when there is one and says
# so when there is not.

# %%
accelerator = "gpu" if torch.cuda.is_available() else "cpu"
quick = pl.Trainer(accelerator=accelerator, devices=1, max_steps=20, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, use_distributed_sampler=False)
quick.fit(LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats),
          datamodule=FlattenedDataModule(dataset, batch_size=128))
if accelerator == "cpu":
    print("no GPU here: trained on the CPU; with one, the same cell runs on cuda:0")
print(f"trained {quick.global_step} steps on {quick.strategy.root_device}")
assert quick.global_step == quick.max_steps

# %% [markdown]
# ## Exercises
#
# 1. Train a wider model, `hidden_channels=(256, 256, 256)`, for the same number of
#    epochs. Is the test loss better? Is an epoch slower? Then train the default model
#    on `tiny` and compare the training and validation losses: what goes wrong?
# 2. Add Lightning's `EarlyStopping(monitor="val_loss", patience=2)` callback and a
#    larger `max_epochs`. When does it stop?
# 3. Predict the test split with `trainer.predict` (it calls `LitMLP.predict_step`) and
#    compute the RMSE of the long-wave upward flux at the surface alone.
#
# <details><summary>Solution</summary>
#
# ```python
# # 1.
# wide = LitMLP(dataset.n_x, hidden_channels=(256, 256, 256), out_channels=dataset.n_y, stats=stats)
# t = pl.Trainer(accelerator="cpu", devices=1, max_epochs=6, logger=False,
#                enable_progress_bar=False, use_distributed_sampler=False)
# start = time.perf_counter(); t.fit(wide, datamodule=datamodule)
# print(time.perf_counter() - start, t.test(wide, datamodule=datamodule)[0]["test_loss"])
# tiny = presets.resolve("tiny")
# t = pl.Trainer(accelerator="cpu", max_epochs=20, logger=False, enable_progress_bar=False,
#                use_distributed_sampler=False)
# t.fit(LitMLP(tiny.n_x, out_channels=tiny.n_y, stats=tiny.statistics()),
#       datamodule=FlattenedDataModule(tiny, batch_size=64))
# print(t.callback_metrics)  # train loss far below val loss: it memorises its few columns
#
# # 2.
# from pytorch_lightning.callbacks import EarlyStopping
# t = pl.Trainer(accelerator="cpu", max_epochs=50, callbacks=[EarlyStopping("val_loss", patience=2)],
#                logger=False, enable_progress_bar=False, use_distributed_sampler=False)
# t.fit(LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats), datamodule=datamodule)
# print("stopped after epoch", t.current_epoch)
#
# # 3.
# predictions = torch.cat(trainer.predict(model, dataloaders=datamodule.test_dataloader()))
# _, y_test = datamodule.data[datamodule.indices["test"]]
# shape = (-1,) + dataset.schema.block_shapes()["outputs"]  # (column, half level, variable)
# lw_up = dataset.schema.block_variables()["outputs"].index("flux_up_lw")
# surface = -1  # half levels run from the top of the atmosphere down
# error = predictions.reshape(shape)[:, surface, lw_up] - y_test.reshape(shape)[:, surface, lw_up]
# print(torch.sqrt(torch.mean(error ** 2)))
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 02` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Predict fluxes in W m-2 from a checkpoint alone.**
#
# Write `predict_wm2(checkpoint_path, x)`: load the `LitMLP` saved at `checkpoint_path`
# (no dataset, no statistics at hand: they are in the checkpoint's buffers) and return its
# prediction for the columns `x` (a float32 tensor, one flattened column per row; a batch
# may hold a single column) as a tensor in W m-2, of shape (columns, targets), computed
# without tracking gradients and leaving `x` as it was. The checker saves a small model with
# known statistics and compares your fluxes with the model's, to float32 rounding.

# %%
# exercise: 02.predict_wm2
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    """Fluxes in W m-2 predicted for the columns x by the LitMLP saved at checkpoint_path."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("02.predict_wm2", globals())

# %% [markdown]
# **Say how many optimizer steps `trainer.fit` takes.**
#
# Write `optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1)`: the
# `trainer.global_step` (an integer) after `fit` on one process, with `n_train` training
# columns in batches of `batch_size` (the last batch of an epoch may be smaller; none is
# dropped), `epochs` epochs, and one optimizer step every `accumulate_grad_batches`
# batches (and at the end of every epoch). The checker runs a real Lightning `Trainer` on
# tiny data for several set-ups — batches that do not divide, more accumulation than an
# epoch has batches, fewer columns than a batch — and compares.

# %%
# exercise: 02.optimizer_steps
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    """trainer.global_step after fit."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("02.optimizer_steps", globals())
