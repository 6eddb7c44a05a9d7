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
# # Lesson 4 — Scaling the learning rate
#
# **What you will learn**
#
# - why adding ranks changes the optimisation, not only the speed: the effective batch
#   grows with the number of ranks, and each step averages over more columns;
# - the linear and square-root rules for the learning rate, and warm-up;
# - how kosmoss does the arithmetic (`kosmoss.scaling.plan`, the flags `--scale-lr` and
#   `--warmup-steps`);
# - what an experiment with one rank against two ranks, with no rule, the linear rule
#   and the square-root rule, shows on this model.
#
# Time: ~30 min

# %%
import csv
import tempfile
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytorch_lightning as pl
import torch

from kosmoss.cpus import cores_per_process
from kosmoss.data import presets
from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.model import LitMLP
from kosmoss.run.train import mean_baseline_loss
from kosmoss.scaling import plan, warmup_factor

# The batched loader needs no worker processes (lesson 1); Lightning would suggest some.
warnings.filterwarnings("ignore", ".*does not have many workers.*")
# Lightning 2.6 calls torch APIs that torch 2.13 deprecates: nothing a learner can act on.
warnings.filterwarnings("ignore", ".*LeafSpec.*is deprecated.*")
# Machines with Slurm installed get a hint to use srun; this lesson runs without Slurm.
warnings.filterwarnings("ignore", ".*srun.*command is available.*")

# `small`, the default dataset: enough columns for the learning curves to mean something.
dataset = presets.resolve("small", log=print)
stats = dataset.statistics()
scratch = Path(tempfile.mkdtemp(prefix="lesson04-"))

# %% [markdown]
# ## The effective batch grows with the ranks
#
# Keep the per-process batch `b` that fits one device, and add ranks: with `N` ranks
# each optimiser step averages the gradient over `N × b` columns. The gradient gets less
# noisy, but the number of steps per epoch falls by `N`. With the same learning rate,
# the model now takes fewer steps of the same size through each epoch: it learns less
# per column seen.
#
# Two classic rules compensate, with `k` = effective batch / the batch the learning
# rate was tuned for:
#
# - **linear** (Goyal et al., 2017): multiply the rate by `k`.
#   For plain SGD, `k` small steps are close to one step of `k` times the size on the
#   average gradient, as long as the gradient does not change much over those steps;
# - **square root** (Krizhevsky, 2014): multiply by `√k`, which keeps the variance of
#   the update the same. For adaptive optimisers such as Adam — the one this model
#   uses — the square-root rule is the one theory suggests (Malladi et al., 2022).
#
# A large rate at the start, when the weights are random and the gradients large, can
# throw training off; **warm-up** starts from the unscaled rate and ramps linearly to
# the scaled one over the first steps.
#
# kosmoss does the arithmetic in one place, `kosmoss.scaling.plan`; `trainup_cpu.py`
# prints these lines from rank 0 before it trains.

# %%
PER_RANK_BATCH, BASE_LR, RANKS, WARMUP = 64, 1e-3, 2, 50
plans = {"1 rank": plan(PER_RANK_BATCH, BASE_LR, devices_per_node=1)}
for rule in ("none", "linear", "sqrt"):
    plans[f"{RANKS} ranks, {rule}"] = plan(RANKS * PER_RANK_BATCH, BASE_LR, rule,
                                          devices_per_node=RANKS,
                                          base_batch_size=PER_RANK_BATCH)
plans[f"{RANKS} ranks, linear + warm-up"] = plan(RANKS * PER_RANK_BATCH, BASE_LR, "linear",
                                                 devices_per_node=RANKS,
                                                 base_batch_size=PER_RANK_BATCH,
                                                 warmup_steps=WARMUP)
for name, p in plans.items():
    print(f"{name}:")
    for line in p.lines():
        print(f"    {line}")

# %% [markdown]
# The warm-up is a multiplier of the scaled rate, `kosmoss.scaling.warmup_factor`, which
# `LitMLP` hands to a `LambdaLR` scheduler stepped every optimiser step:

# %%
warm = plans[f"{RANKS} ranks, linear + warm-up"]
steps = np.arange(0, 2 * WARMUP)
rates = [warm.lr * warmup_factor(int(s), WARMUP, warm.base_lr / warm.lr) for s in steps]
plt.figure(figsize=(6, 3))
plt.plot(steps, rates)
plt.xlabel("optimizer step")
plt.ylabel("learning rate")
plt.title("linear warm-up from the base rate to the scaled rate")
plt.show()
print(f"step 0: {rates[0]:.2e}, step {WARMUP // 2}: {rates[WARMUP // 2]:.2e}, "
      f"step {WARMUP}: {rates[WARMUP]:.2e}")

# %% [markdown]
# ## The experiment
#
# Same dataset, model, seed and per-rank batch. One rank trains for a number of steps;
# each two-rank run trains for half as many, so **every run sees the same number of
# columns**. The two-rank runs use Lightning's notebook launcher (lesson 3). The
# validation loss is measured at regular intervals and logged to CSV. On a GPU machine
# the same cell runs the ranks on GPUs.

# %%
REFERENCE_STEPS, EVERY = 1200, 100
accelerator = "gpu" if torch.cuda.device_count() >= RANKS else "cpu"
print(f"ranks run on: {accelerator}" + ("" if accelerator == "gpu" else
      f" (fewer than {RANKS} GPUs visible)"))
# Lightning gives each rank its share of the cores; the one-rank run gets the same share.
torch.set_num_threads(cores_per_process(RANKS))
print(f"torch threads per rank: {torch.get_num_threads()}")


def train(name, scaling):
    """One run; returns the (columns seen, validation loss) curve and the time it took."""
    ranks = scaling.world_size
    pl.seed_everything(42, verbose=False)
    model = LitMLP(dataset.n_x, out_channels=dataset.n_y, lr=scaling.lr, stats=stats,
                   warmup_steps=scaling.warmup_steps, warmup_start_lr=scaling.base_lr)
    log_dir = scratch / name.replace(" ", "_").replace(",", "")
    trainer = pl.Trainer(
        accelerator=accelerator, devices=ranks,
        strategy="ddp_notebook" if ranks > 1 else "auto",
        max_steps=REFERENCE_STEPS // ranks, val_check_interval=EVERY // ranks,
        num_sanity_val_steps=0, logger=pl.loggers.CSVLogger(log_dir, name="", version=""),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False)
    started = time.perf_counter()
    trainer.fit(model, datamodule=FlattenedDataModule(dataset, batch_size=PER_RANK_BATCH))
    elapsed = time.perf_counter() - started
    with open(log_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_loss")]
    seen = np.array([(int(r["step"]) + 1) * scaling.global_batch_size for r in rows])
    return seen, np.array([float(r["val_loss"]) for r in rows]), elapsed


curves = {}
for name, scaling in plans.items():
    curves[name] = train(name, scaling)
    seen, loss, elapsed = curves[name]
    print(f"{name:28s} lr {scaling.lr:.2e}: val loss {loss[-1]:.4f} after {seen[-1]:,} "
          f"columns ({elapsed:.0f} s)")

# %%
baseline = mean_baseline_loss(stats)
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
for name, (seen, loss, _) in curves.items():
    style = "k-" if name == "1 rank" else "-"
    axes[0].plot(seen, loss, style, marker="o", ms=3, label=name)
    axes[1].plot(seen / plans[name].global_batch_size, loss, style, marker="o", ms=3, label=name)
for ax in axes:
    ax.axhline(baseline, color="grey", ls="--", lw=1)
    ax.set_yscale("log")
axes[0].set_xlabel("columns seen")
axes[1].set_xlabel("optimizer steps")
axes[0].set_ylabel("validation loss")
axes[0].legend()
fig.suptitle("one rank against two, with the learning-rate rules")
plt.show()

# %% [markdown]
# What to look at: on the left, at equal columns seen, does any two-rank curve keep up
# with the one-rank curve? On the right, at equal steps, the two-rank runs have seen
# twice as many columns. The cell below reads both off the curves: how many steps and
# how many columns each run needed to first get below a target loss, and how far each
# two-rank curve stays from the one-rank curve. Every run is short, so rerunning the
# lesson moves these numbers a little.

# %%
TARGET = 0.2


def first_below(name, target):
    seen, loss, _ = curves[name]
    below = np.flatnonzero(loss <= target)
    return None if len(below) == 0 else int(seen[below[0]])


reference = curves["1 rank"][1]
print(f"first below a validation loss of {TARGET}:")
for name, scaling in plans.items():
    columns = first_below(name, TARGET)
    reached = (f"after {columns // scaling.global_batch_size:5d} steps = {columns:7,} columns"
               if columns else "not reached")
    print(f"  {name:28s} {reached}")
gaps = {name: float(np.mean(np.log(loss / reference)))
        for name, (_, loss, _) in curves.items() if name != "1 rank"}
print("\nmean log-ratio of the validation loss to the 1-rank curve at equal columns "
      "(0: as good, > 0: behind):")
for name, gap in gaps.items():
    print(f"  {name:28s} {gap:+.3f}  (final {curves[name][1][-1]:.4f}, 1 rank {reference[-1]:.4f})")
print(f"\nclosest to the one-rank curve: {min(gaps, key=gaps.get)}")

# %% [markdown]
# How to read it. If the two-rank runs need fewer *steps* than one rank, the second rank
# bought time: with a device per rank, steps are what the wall clock counts. If they
# need more *columns*, each column taught less: that is the price of the larger batch,
# and what a learning-rate rule tries to pay back. With two ranks `k` is two, and the
# linear and square-root rates differ only by a factor `√k`; on a short run that is a
# small effect and a noisy one, and with Adam a larger rate does not simply mean larger
# steps. The rules were derived for large `k` — a job on many GPUs — where an unscaled
# rate wastes most of the extra columns and a linearly scaled one without warm-up can
# make the first steps diverge. The first exercise pushes `k` up on this same machine.
#
# ## With a GPU
#
# The arithmetic does not change: `k` counts ranks, not devices, and the per-rank batch
# is set by what fits one GPU's memory (usually much larger than on a CPU, which makes
# `k` larger for the same number of ranks). The experiment cell above puts the ranks on
# GPUs when there are at least two.
#
# ## Exercises
#
# 1. Run the same experiment with `base_batch_size=16` in `plan` (as if the rate had been
#    tuned for a batch of sixteen), so that `k` is eight. What do the three rules give
#    now?
# 2. Run `trainup_cpu.py --num-processes 2 --batch-size 512 --scale-lr linear
#    --warmup-steps 20 --dataset small --max-epochs 1` and read the scaling lines it
#    prints and `lr`, `lr_rule`, `warmup_steps` in its `result.json`.
# 3. Without warm-up, raise `BASE_LR` until the linear rule makes the first steps blow
#    up. Does warm-up rescue it?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1.
# for rule in ("none", "linear", "sqrt"):
#     p = plan(RANKS * PER_RANK_BATCH, BASE_LR, rule, devices_per_node=RANKS, base_batch_size=16)
#     print(rule, p.lr, train(f"k8 {rule}", p)[1][-1])
# # linear now multiplies the rate by eight: with Adam it tends to overshoot, sqrt is safer.
#
# # 2.
# import sys, json
# from kosmoss.lessons import script, sh
# sh([sys.executable, script("trainup_cpu.py"), "--num-processes", "2", "--batch-size", "512",
#     "--scale-lr", "linear", "--warmup-steps", "20", "--dataset", "small", "--max-epochs", "1",
#     "--no-progress", "--result-json", "r.json"])
# print({k: json.load(open("r.json"))[k] for k in ("lr", "lr_rule", "lr_factor", "warmup_steps")})
#
# # 3.
# for lr in (1e-2, 3e-2):
#     no_warm = plan(RANKS * PER_RANK_BATCH, lr, "linear", devices_per_node=RANKS,
#                    base_batch_size=PER_RANK_BATCH)
#     warm = plan(RANKS * PER_RANK_BATCH, lr, "linear", devices_per_node=RANKS,
#                 base_batch_size=PER_RANK_BATCH, warmup_steps=WARMUP)
#     print(lr, train(f"hot {lr}", no_warm)[1][:3], train(f"hot warm {lr}", warm)[1][:3])
# ```
#
# </details>
