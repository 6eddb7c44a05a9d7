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
# # Lesson 3b — Metrics under DDP: a lab
#
# **What you will learn**
#
# - that a validation loss computed by two ranks can differ from the loss one process
#   computes with the *same weights on the same data*, and why that matters (model
#   selection, early stopping and comparisons of set-ups all read that number);
# - the three causes users hit, each found in the code that causes it:
#   `DistributedSampler` pads a rank's share with duplicates (pytorch issue 25162);
#   `self.log` without `sync_dist` reports rank 0's share alone; and with `sync_dist`,
#   Lightning averages the integer count of samples over the ranks, which truncates it
#   (Lightning issue 21859);
# - the fix: reduce **sums and counts**, never means — with torchmetrics, or by hand with
#   one `all_reduce`.
#
# Time: ~20 min; the cells run in ~1 min on 2 CPU cores

# %%
import inspect
import json
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset
from torchmetrics import MeanMetric

from kosmoss.data import presets
from kosmoss.data.loading import FlattenedDataset
from kosmoss.lessons import one_thread_per_forked_rank, quiet_lightning, scratch_folder
from kosmoss.model import LitMLP

quiet_lightning()
dataset = presets.resolve("tiny", log=print)
scratch = scratch_folder("lesson03b-")

# %% [markdown]
# ## The reference: one process, every column once
#
# A model trained for a few steps (its quality does not matter, only that its weights
# stay fixed from now on), and a validation split whose size does not divide by two, as
# most real splits do not. One process computes the loss of every column once: the
# number every set-up should report.

# %%
N_VAL, BATCH, RANKS = 201, 32, 2
x_all, y_all = FlattenedDataset(dataset)[np.arange(dataset.n_samples)]
torch.manual_seed(0)
model = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=dataset.statistics())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for rows in torch.arange(N_VAL, len(x_all)).split(64):  # train on the columns after the split
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model.net(model.normalize_x(x_all[rows])),
                                        model.normalize_y(y_all[rows]))
    loss.backward()
    optimizer.step()
model.eval()
torch.save(model.state_dict(), scratch / "weights.pt")

x_val, y_val = x_all[:N_VAL], y_all[:N_VAL]
validation = TensorDataset(torch.arange(N_VAL), x_val, y_val)  # the index, to see who saw what


def per_sample_loss(model, x, y):
    """The loss of each column: the mean squared error over its normalised fluxes."""
    return ((model.net(model.normalize_x(x)) - model.normalize_y(y)) ** 2).mean(dim=1)


with torch.no_grad():
    losses = per_sample_loss(model, x_val, y_val).double()
exact = losses.mean().item()
print(f"{N_VAL} validation columns, one process: loss {exact:.6f}")

# %% [markdown]
# ## Two ranks, as most code does it
#
# The `LightningModule` below validates the same weights and logs the loss three ways:
# as most code does (`self.log` of the batch's mean loss), with `sync_dist=True`, and as a
# torchmetrics `MeanMetric` fed the per-column losses. It also keeps the indices each rank
# saw. The Trainer runs two CPU processes over gloo, forked from this kernel (lesson 3's
# notebook launcher), and Lightning gives each rank a `DistributedSampler`, as it does by
# default. A callback leaves each rank's numbers in a note.


# %%
class ValidateThreeWays(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = LitMLP(dataset.n_x, out_channels=dataset.n_y)
        self.model.load_state_dict(torch.load(scratch / "weights.pt"))
        self.metric = MeanMetric()
        self.seen = []

    def validation_step(self, batch, batch_idx):
        index, x, y = batch
        per_sample = per_sample_loss(self.model, x, y)
        self.log("plain", per_sample.mean(), batch_size=len(x))
        self.log("sync_dist", per_sample.mean(), batch_size=len(x), sync_dist=True)
        self.metric.update(per_sample)
        self.log("torchmetrics", self.metric)
        self.seen.append(index)


class LeaveNote(pl.Callback):
    def __init__(self, name):
        self.name = name

    def on_validation_end(self, trainer, pl_module):
        note = {key: float(value) for key, value in trainer.callback_metrics.items()}
        note["seen"] = torch.cat(pl_module.seen).tolist()
        (scratch / f"{self.name}-rank{trainer.global_rank}.json").write_text(json.dumps(note))


def validate_on_two_ranks(module, name, **loader):
    trainer = pl.Trainer(accelerator="cpu", devices=RANKS, strategy="ddp_notebook",
                         callbacks=[LeaveNote(name)], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, **loader)
    own_loader = "use_distributed_sampler" in loader  # the module brings its own loader
    with one_thread_per_forked_rank():  # forked ranks must not use threads (lesson 3)
        trainer.validate(module, verbose=False, dataloaders=None if own_loader
                         else DataLoader(validation, batch_size=BATCH))
    return [json.loads((scratch / f"{name}-rank{r}.json").read_text()) for r in range(RANKS)]


padded = validate_on_two_ranks(ValidateThreeWays(), "padded")
for note in padded:
    rank = padded.index(note)
    print(f"rank {rank}: {len(note['seen'])} columns; plain {note['plain']:.6f}, "
          f"sync_dist {note['sync_dist']:.6f}, torchmetrics {note['torchmetrics']:.6f}")
print(f"one process:                 {exact:.6f}")

# %% [markdown]
# Three numbers, none equal to the one-process loss, and the plain one differs between
# the ranks — the progress bar and the logger show rank 0's, and each rank's checkpoint
# callback compares its own (Lightning's `ModelCheckpoint` replaces a kept checkpoint only
# when every rank's own number improved: `check_monitor_top_k` asks the strategy's
# `reduce_boolean_decision`).
# Lightning's two warnings above name two of the causes (it knew). Let us find each one.
#
# ## Cause 1: `DistributedSampler` pads with duplicates
#
# Every rank must run the same number of steps (a collective waits for all ranks), so
# `DistributedSampler` (with its default `drop_last=False`) makes the split divisible by
# the number of ranks by **repeating** indices from the start. Its code:

# %%
source = inspect.getsource(DistributedSampler.__iter__)
print(source[source.index("if not self.drop_last"):source.index("else:\n            # remove")])
seen = np.concatenate([note["seen"] for note in padded])
values, counts = np.unique(seen, return_counts=True)
duplicates = values[counts > 1].tolist()
print(f"the two ranks saw {len(seen)} columns for a split of {N_VAL}: "
      f"columns {duplicates} twice")
assert len(seen) - N_VAL == len(duplicates) > 0

# %% [markdown]
# So even a perfectly synchronised metric averages over a split in which some columns
# count twice. The size of the effect is set by the duplicates' share of the split and
# how far their loss is from the mean: small here, large for a small split on many ranks
# (up to one column less than the number of ranks is repeated). PyTorch documents this,
# and the issue asking for an exact evaluation sampler (pytorch issue 25162) was still
# open when this lesson was written. Both synced numbers above are exactly this padded mean:

# %%
padded_mean = (losses.sum() + losses[duplicates].sum()).item() / len(seen)
print(f"mean over the padded split: {padded_mean:.6f}  (exact: {exact:.6f}, "
      f"{padded_mean / exact - 1:+.3%})")
for name in ("sync_dist", "torchmetrics"):
    assert np.isclose(padded[0][name], padded_mean, rtol=1e-5), name

# %% [markdown]
# ## Cause 2: `self.log` without `sync_dist`
#
# `self.log` accumulates on each rank the batch means weighted by the batch sizes; at
# the end of the epoch, *without* `sync_dist`, each rank keeps its own. What rank 0
# reports is the loss of rank 0's share — half of the split, here every other column:

# %%
shares = [torch.tensor(note["seen"]) for note in padded]
for rank, share in enumerate(shares):
    print(f"rank {rank}: mean over its share {losses[share].mean():.6f}, "
          f"logged plain {padded[rank]['plain']:.6f}")
    assert np.isclose(padded[rank]["plain"], losses[share].mean().item(), rtol=1e-5)
assert not np.isclose(padded[0]["plain"], padded[1]["plain"], rtol=1e-5)

# %% [markdown]
# In `training_step` the same holds for the training loss: logged without `sync_dist`,
# the curve you plot is rank 0's shards alone. With `sync_dist=True` every call of
# `self.log` costs a barrier and an all-reduce, on every step, not only on the steps the
# loggers write; kosmoss's run path calls it only on those steps (every
# `log_every_n_steps`, and the first), where all ranks' batches have the same size, so the
# mean of the ranks' means is the mean of the global batch.
#
# ## Cause 3: with `sync_dist`, the count is averaged as an integer
#
# Remove the padding — give each rank its own share, every column exactly once, even if
# the shares differ by one column — and `sync_dist=True` should now be exact. It is not.
# Lightning keeps, per logged name, the sum of `value × batch_size` and the sum of the
# batch sizes, an **integer** tensor, and at the end reduces *both* with the logged
# name's reduction, a mean over the ranks. This is in the installed Lightning:

# %%
from lightning_fabric.utilities import distributed
from pytorch_lightning.trainer.connectors.logger_connector import result

print(inspect.getsource(result._ResultMetric.compute))
sync = inspect.getsource(distributed._sync_ddp)
print(sync[sync.index("    if not divide_by_world_size"):])

# %% [markdown]
# For an integer tensor, `result.copy_(result / world_size)` writes the quotient back
# into an integer: the average count is **truncated**. With shares of different sizes the
# total count is odd, its half is rounded down, and the loss is divided by too small a
# number (Lightning issue 21859). On NCCL the average is `ReduceOp.AVG`, integer
# arithmetic on an integer tensor as well.
#
# Now the run without padding: the loader below gives rank `r` the columns `r`, `r + 2`,
# ... and Lightning no longer adds its sampler (`use_distributed_sampler=False`).


# %%
class OwnShare(ValidateThreeWays):
    def val_dataloader(self):
        mine = torch.arange(self.global_rank, N_VAL, self.trainer.world_size)
        return DataLoader(Subset(validation, mine), batch_size=BATCH)


unpadded = validate_on_two_ranks(OwnShare(), "unpadded", use_distributed_sampler=False)
counts = [len(note["seen"]) for note in unpadded]
truncated = RANKS * (sum(counts) // RANKS)  # the count Lightning divides by, times the ranks
print(f"shares {counts}: every column once: "
      f"{sorted(np.concatenate([n['seen'] for n in unpadded]).tolist()) == list(range(N_VAL))}")
print(f"sync_dist    {unpadded[0]['sync_dist']:.6f}  = sum / {truncated} instead of / {N_VAL} "
      f"({unpadded[0]['sync_dist'] / exact - 1:+.3%})")
print(f"torchmetrics {unpadded[0]['torchmetrics']:.6f}  (one process: {exact:.6f}, "
      f"{unpadded[0]['torchmetrics'] / exact - 1:+.1e})")
assert sum(counts) == N_VAL and counts[0] != counts[1]
assert np.isclose(unpadded[0]["sync_dist"], losses.sum().item() / truncated, rtol=1e-5)
assert not np.isclose(unpadded[0]["sync_dist"], exact, rtol=1e-5)
assert np.isclose(unpadded[0]["torchmetrics"], exact, rtol=1e-5)
assert np.isclose(unpadded[1]["torchmetrics"], exact, rtol=1e-5)

# %% [markdown]
# ## The fix: sums and counts
#
# torchmetrics' `MeanMetric` keeps two states, the weighted sum and the total weight, both
# floating point, and declares how each is reduced across ranks: a **sum**. The mean is
# computed once, after the reduction:

# %%
metric = MeanMetric()
print({name: (metric._defaults[name].dtype, metric._reductions[name].__name__)
       for name in metric._defaults})

# %% [markdown]
# That is the whole recipe, with torchmetrics or by hand: on every rank, the sum of the
# per-column losses and the number of columns; one `all_reduce` with `SUM` of both; divide.
# Together with a loader that serves every column once (no padding), the two-rank
# loss equals the one-process loss to float rounding, as the torchmetrics line above shows.
#
# kosmoss's `LitMLP` logs its validation and test losses as torchmetrics metrics, and its
# loader gives each rank its own columns without padding. The same weights, validated by
# kosmoss on one process and on two:

# %%
from kosmoss.data.datamodule import FlattenedDataModule


class KosmossNote(pl.Callback):
    def on_validation_end(self, trainer, pl_module):
        (scratch / f"kosmoss-rank{trainer.global_rank}.json").write_text(
            json.dumps({"val_loss": float(trainer.callback_metrics["val_loss"])}))


def kosmoss_val_loss(devices):
    restored = LitMLP(dataset.n_x, out_channels=dataset.n_y)
    restored.load_state_dict(torch.load(scratch / "weights.pt"))
    trainer = pl.Trainer(accelerator="cpu", devices=devices, callbacks=[KosmossNote()],
                         strategy="ddp_notebook" if devices > 1 else "auto", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False)  # kosmoss's loader shards by itself
    with one_thread_per_forked_rank():
        trainer.validate(restored, datamodule=FlattenedDataModule(dataset, batch_size=BATCH),
                         verbose=False)
    return json.loads((scratch / "kosmoss-rank0.json").read_text())["val_loss"]


one, two = kosmoss_val_loss(1), kosmoss_val_loss(RANKS)
print(f"kosmoss val_loss: 1 process {one:.6f}, {RANKS} ranks {two:.6f} "
      f"(relative difference {abs(two / one - 1):.1e})")
assert np.isclose(one, two, rtol=1e-5)

# %% [markdown]
# | cause | symptom | fix |
# |---|---|---|
# | `DistributedSampler` pads | columns counted twice | a sampler without padding, or drop the repeats |
# | no `sync_dist` | rank 0's share only | sums and counts, reduced |
# | integer count averaged | loss divided by a rounded count | torchmetrics, or your own sum and count |
#
# ## With a GPU
#
# The same causes, with NCCL: `sync_dist` on CUDA tensors, the integer average through
# `ReduceOp.AVG`, and torchmetrics' states on the GPU. Nothing in this lab depends on the
# device; on a GPU machine use `accelerator="gpu"` in `validate_on_two_ranks` (and
# `ddp_notebook` requires that CUDA was not initialised in the kernel before).
#
# ## Exercises
#
# 1. Rerun the padded validation with three ranks. How many columns are repeated now,
#    and how far is the synced loss from the one-process loss?
# 2. Log the per-rank count of columns with `self.log("count", float(len(x)),
#    reduce_fx="sum", sync_dist=True)` in the unpadded run. Is the sum right, and why
#    does a float count avoid the truncation?
# 3. Why can a training loop not simply drop the padding the way this validation did?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. Repeats: the sampler pads up to a multiple of the ranks.
# RANKS = 3
# print("repeated:", -(-N_VAL // RANKS) * RANKS - N_VAL)  # 0 when N_VAL divides
# print("with one more column:", -(-(N_VAL + 1) // RANKS) * RANKS - (N_VAL + 1))
# padded3 = validate_on_two_ranks(ValidateThreeWays(), "padded3")
# print(padded3[0]["sync_dist"], exact)
#
# # 2. A sum reduction of floats is exact (201.0); only a *mean* of an integer truncates.
# # 3. Every rank must take the same number of optimizer steps: DDP's all-reduce in a
# #    step waits for all ranks, so a rank with one batch more would wait forever (or
# #    until the timeout). Padding or dropping the remainder keep the ranks in step.
# #    Plain PyTorch can also let ranks run out of data at different steps, with DDP's
# #    join() context manager; Lightning has no such option (Lightning issue 3325 asks
# #    for uneven inputs), so under Lightning the batches must even out.
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check metrics` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Reduce a validation loss exactly over ranks with uneven shares.**
#
# Write `exact_val_loss(losses)`. On every rank, `losses` is a one-dimensional float32
# tensor of the per-sample losses of that rank's share of the validation split — and the
# shares need not be equal; one may even be empty. Return the mean over *every* sample of
# *every* rank (a float or a zero-dimensional tensor), the same on all ranks, leaving
# `losses` as it was: the loss one process would compute on the whole split. Use
# `torch.distributed.all_reduce`. The checker runs your cell at 2, 3 and 4 gloo processes
# holding `5 + 3`, `5 + 3 + 1` and `6 + 0 + 3 + 1` samples, and compares with the
# single-process mean to float32 rounding.

# %%
# exercise: metrics.exact_val_loss
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    """The mean of every rank's per-sample losses, the same on every rank."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("metrics.exact_val_loss", globals())

# %% [markdown]
# **Count the samples `DistributedSampler` serves twice.**
#
# Write `padded_duplicates(n_samples, world_size)`: how many extra, repeated samples
# `torch.utils.data.DistributedSampler` (with its default `drop_last=False`) adds so that
# every rank gets the same number — samples a validation metric then counts twice. The
# checker measures it by running the sampler on every rank for a range of sizes: splits
# that divide evenly, and splits smaller than the world.

# %%
# exercise: metrics.padding
def padded_duplicates(n_samples, world_size):
    """Extra (repeated) samples DistributedSampler serves over all ranks."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("metrics.padding", globals())
