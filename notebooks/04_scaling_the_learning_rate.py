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
# # Lesson 4 — Scaling the learning rate: an experiment that reaches a verdict
#
# **What you will learn**
#
# - why adding ranks changes the optimisation, not only the speed: the effective batch
#   grows with the number of ranks, and each optimizer step averages over more columns;
# - the rules for the learning rate and who claims what: linear scaling with warm-up
#   (Goyal et al., 2017), the square root (Krizhevsky, 2014; Hoffer et al., 2017;
#   Malladi et al., 2022), and the layer-wise optimizers LARS and LAMB;
# - how to test them honestly: tune the base rate first, grow the batch by gradient
#   accumulation, give every run the same number of columns, repeat with several seeds;
# - what this experiment finds for SGD with momentum and for Adam on the course's model,
#   and how that compares with the literature;
# - why the gain of a larger batch stops: the gradient noise scale and the critical batch
#   size (McCandlish et al., 2018), measured during this lesson's own runs from the
#   gradient norms of the micro-batches and of their average, and set against the table.
#
# Time: ~30 min; the cells run in ~3 min on 2 CPU cores

# %%
import math
import multiprocessing
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display
from pytorch_optimizer import LARS, Lamb

from kosmoss.core import paths
from kosmoss.devices.cpus import available_cores
from kosmoss.data.loading import FlattenedDataset
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare
from kosmoss.lessons import forked, quick, quiet_lightning
from kosmoss.model import LitMLP, mlp
from kosmoss.scaling import plan, warmup_factor

quiet_lightning()

# %% [markdown]
# ## The effective batch grows with the ranks
#
# Keep the per-rank batch `b` that fits one device and add ranks: with `N` ranks each
# optimizer step averages the gradient over `N × b` columns (lesson 3). The gradient is
# less noisy, but an epoch has `N` times fewer steps. With an unchanged learning rate the
# model takes fewer steps of the same size through the same data: it learns less per
# column seen. With `k` = effective batch / the batch the rate was tuned for:
#
# - **linear**: multiply the rate by `k`. Goyal et al. (2017) argue that `k` small SGD
#   steps are close to one step of `k` times the size on the average gradient, as long as
#   the gradient changes little over those steps — which fails at the start of training,
#   hence their **gradual warm-up** from the base rate to `k` times it over the first
#   epochs. With it they trained ResNet-50 on ImageNet with SGD and momentum at a batch
#   far larger than the usual one, at the same accuracy (their batch sizes are printed
#   below, next to this lesson's).
# - **square root**: multiply by `√k`, which keeps the variance of the update the same.
#   Krizhevsky (2014) gives this argument but reports that linear scaling worked better
#   in his experiments; Hoffer et al. (2017) argue for `√k` (with more steps, "train
#   longer"); Malladi et al. (2022) derive `√k` as *the* rule for Adam and RMSprop from a
#   stochastic differential equation, where linear is the rule for SGD.
# - **layer-wise rates**: LARS (You et al., 2017, SGD with momentum) and LAMB (You et
#   al., 2020, Adam) scale each layer's step by the ratio of its weights' norm to the norm
#   of its gradient (LARS, times a trust coefficient; biases take plain SGD steps) or of
#   its Adam update (LAMB), so that no layer moves too far in one step; they were built
#   for the largest batches. We use the implementations of the `pytorch-optimizer` library.
#
# kosmoss does the arithmetic in one place, `kosmoss.scaling.plan`, the same that
# `trainup_cpu.py --scale-lr {none,linear,sqrt} --warmup-steps N` prints before it
# trains. For a rank batch `b` grown by `k` ranks (the values the cell sets):

# %%
GOYAL_BATCHES = (256, 8192)  # Goyal et al. (2017): ResNet-50's usual batch, and theirs
b, k = 16, 16
print(f"Goyal et al.: batch {GOYAL_BATCHES[0]} -> {GOYAL_BATCHES[1]} "
      f"(k = {GOYAL_BATCHES[1] // GOYAL_BATCHES[0]}); here: batch {b} -> {b * k} (k = {k})")
example = plan(b * k, 0.03, "linear", devices_per_node=k, base_batch_size=b, warmup_steps=25)
for line in example.lines():
    print(line)
ramp = [example.lr * warmup_factor(s, example.warmup_steps, example.base_lr / example.lr)
        for s in range(2 * example.warmup_steps)]
print(f"warm-up: step 0 uses {ramp[0]:.3g}, step {example.warmup_steps} and after "
      f"{example.lr:.3g}")
assert math.isclose(ramp[0], example.base_lr) and math.isclose(ramp[-1], example.lr)

# %% [markdown]
# ## The set-up: many short runs, so a plain PyTorch loop
#
# A verdict needs many runs: a sweep of the base rate, four rules at two batch sizes for
# two optimizers, a rate tuned at the large batch for each optimizer, LARS and LAMB,
# each with three seeds — step 2 counts them. To fit them in a few minutes on two cores:
#
# - the same synthetic physics on **fewer levels** than the IFS's (printed below: fewer
#   inputs and fluxes per column), held in memory and normalised once by `LitMLP`'s
#   buffers; the network is kosmoss's `mlp` with the course's hidden layers;
# - a **plain PyTorch loop**, not Lightning: a step here is a few small matrix products,
#   and Lightning's per-step machinery (hooks, logging, the optimizer closure — lesson 8
#   measures it) would cost more than the arithmetic;
# - the larger batches by **gradient accumulation**: `k` micro-batches of `b` columns,
#   each loss divided by `k`, gradients summed, one optimizer step. That is exactly the
#   gradient of one batch of `k × b` columns, and what `k` ranks all-reduce — so one
#   core plays `k` ranks (Lightning does the same with `Trainer(accumulate_grad_batches=k)`);
# - one thread per run and one run per core, in parallel: a batch of `b` columns is too
#   small to share among threads, which would mostly wait for each other.
#
# This is the lesson's longest cell sequence: a few minutes on two cores.

# %%
QUICK = quick()  # CI sets KOSMOSS_LESSON_QUICK=1: the same experiment, half as long
BASE_BATCH = 16  # b: the batch the base rate is tuned for, one rank's batch
KS = (1, 8, 16)  # effective batch = k * b
K_MAX = max(KS)
CURVE_POINTS = 24  # validation losses along each small-batch run (step 4 reads them)
CURVE_COLUMNS = 1024  # of the validation columns, for those losses: a quarter of the cost
SAMPLES = 32_768 if QUICK else 65_536  # columns every run sees, whatever its batch
SEEDS = (0, 1, 2)
WARMUP_FRACTION = 0.2  # of a run's steps, for "linear + warm-up", LARS and LAMB
RULES = ("none", "linear", "sqrt", "linear + warm-up")
HIDDEN = (100, 100, 100)
LARS_TRUST = 0.02  # LARS: a step moves a layer by about lr * 2 % of its norm (before momentum)
WORKERS = available_cores()

lab = prepare(SyntheticSource(32_768, levels=30), paths.data_root() / "lesson04-levels30",
              shard_size=8192)
columns_x, columns_y = FlattenedDataset(lab)[np.arange(lab.n_samples)]
scaler = LitMLP(lab.n_x, hidden_channels=HIDDEN, out_channels=lab.n_y, stats=lab.statistics())
with torch.no_grad():
    X, Y = scaler.normalize_x(columns_x), scaler.normalize_y(columns_y)
N_VAL = 4096
X_train, Y_train, X_val, Y_val = X[:-N_VAL], Y[:-N_VAL], X[-N_VAL:], Y[-N_VAL:]
print(f"{lab.schema.levels} levels: {len(X_train)} training and {N_VAL} validation columns, "
      f"{lab.n_x} inputs, {lab.n_y} fluxes, hidden layers {HIDDEN}; every run sees "
      f"{SAMPLES:,} columns ({SAMPLES / len(X_train):.1f} epochs); {WORKERS} runs at a time")
print("steps per run: " + ", ".join(f"k={k}: {SAMPLES // (k * BASE_BATCH)}" for k in KS))

# %% [markdown]
# First, check the claim that accumulation is the big batch: the gradient of `k`
# micro-batches, each loss divided by `k`, against the gradient of one batch of `k × b`.

# %%
def accumulation_versus_one_batch(k):
    """The largest gradient difference, and the largest gradient, of one seeded network."""
    torch.manual_seed(0)
    net = mlp(lab.n_x, list(HIDDEN), lab.n_y)
    rows = torch.arange(k * BASE_BATCH)
    torch.nn.functional.mse_loss(net(X_train[rows]), Y_train[rows]).backward()
    one_batch = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    for micro in rows.split(BASE_BATCH):
        (torch.nn.functional.mse_loss(net(X_train[micro]), Y_train[micro]) / k).backward()
    return (max((p.grad - g).abs().max().item() for p, g in zip(net.parameters(), one_batch)),
            max(g.abs().max().item() for g in one_batch))


# In a forked process, as every backward of this lesson: the runs below are forked from
# the kernel, which must not run a backward itself (lesson 3 says why).
k = 16
difference, scale = forked(accumulation_versus_one_batch, k)
print(f"{k} accumulated micro-batches of {BASE_BATCH} vs one batch of {k * BASE_BATCH}: "
      f"largest difference {difference:.1e} (largest gradient {scale:.1e})")
assert difference < 1e-5 * scale, "accumulation must reproduce the big batch's gradient"


# %% [markdown]
# ## One run
#
# `train(run)` trains one network from its seed and returns its validation loss (mean
# squared error on normalised fluxes). The learning rate comes from `plan`, the warm-up
# from `warmup_factor`; a run whose loss leaves the finite numbers is stopped and
# counted as diverged.

# %%
@dataclass(frozen=True)
class Run:
    optimizer: str  # SGD | Adam | LARS | LAMB
    base_lr: float
    k: int
    rule: str  # one of RULES, or "own rate": a rate tuned at the run's own batch
    seed: int


def make_optimizer(name, parameters, lr):
    if name == "SGD":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9)
    if name == "Adam":
        return torch.optim.Adam(parameters, lr=lr)
    if name == "LARS":
        return LARS(parameters, lr=lr, momentum=0.9, trust_coefficient=LARS_TRUST)
    return Lamb(parameters, lr=lr)


def schedule(run):
    """(steps, scaling plan) of a run: its rate and warm-up, from kosmoss.scaling."""
    steps = SAMPLES // (run.k * BASE_BATCH)
    warm = run.rule in ("linear + warm-up", "own rate")
    rule = {"linear + warm-up": "linear", "own rate": "none"}.get(run.rule, run.rule)
    scaling = plan(run.k * BASE_BATCH, run.base_lr, rule, devices_per_node=run.k,
                   base_batch_size=BASE_BATCH,
                   warmup_steps=int(WARMUP_FRACTION * steps) if warm else 0)
    return steps, scaling


def flat_gradient(net):
    return torch.cat([p.grad.flatten() for p in net.parameters()])


def train(run):
    torch.set_num_threads(1)
    torch.manual_seed(run.seed)
    net = mlp(lab.n_x, list(HIDDEN), lab.n_y)
    steps, scaling = schedule(run)
    # A rate tuned at its batch warms up from rate / k, like "linear + warm-up" from the base.
    start = 1 / run.k if run.rule == "own rate" else scaling.base_lr / scaling.lr
    optimizer = make_optimizer(run.optimizer, net.parameters(), scaling.lr)
    order = torch.Generator().manual_seed(run.seed)
    batches = iter(())
    seen = 0
    norms = []  # per step, at the largest k: (mean |micro-batch gradient|², |their mean|²)
    measure_norms = run.k == K_MAX and run.rule in RULES  # the runs step 4 reads
    curve = []  # at k = 1: (columns seen, validation loss), at steps evenly spaced in log
    measured_at = set(np.geomspace(1, steps, CURVE_POINTS).astype(int)) if run.k == 1 else ()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = scaling.lr * warmup_factor(step, scaling.warmup_steps, start)
        optimizer.zero_grad()
        before, small = 0.0, []
        for _ in range(run.k):  # k micro-batches = k ranks' batches
            rows = next(batches, None)
            if rows is None:  # a new epoch: a new order
                batches = iter(torch.randperm(len(X_train), generator=order).split(BASE_BATCH))
                rows = next(batches)
            loss = torch.nn.functional.mse_loss(net(X_train[rows]), Y_train[rows]) / run.k
            loss.backward()
            seen += len(rows)
            if measure_norms:  # this micro-batch's own gradient: what its backward added, x k
                after = flat_gradient(net)
                small.append(float((run.k * (after - before)).square().sum()))
                before = after
        if not math.isfinite(loss.item()) or loss.item() > 1e3:
            return {"val_loss": math.inf, "seen": seen, "diverged": True, "norms": norms,
                    "curve": curve, "curve_end": math.inf}
        if small:
            norms.append((sum(small) / len(small), float(before.square().sum())))
        optimizer.step()
        if step + 1 in measured_at:
            curve.append((seen, validation_loss(net, CURVE_COLUMNS)))
    val, end = validation_loss(net), validation_loss(net, CURVE_COLUMNS)
    return {"val_loss": val if math.isfinite(val) else math.inf, "seen": seen,
            "diverged": not math.isfinite(val), "norms": norms, "curve": curve,
            "curve_end": end if math.isfinite(end) else math.inf}


def validation_loss(net, columns=N_VAL):
    with torch.no_grad():
        return torch.nn.functional.mse_loss(net(X_val[:columns]), Y_val[:columns]).item()


def train_all(runs):
    """Every run, WORKERS at a time (forked: they share the data in memory)."""
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        return dict(zip(runs, pool.map(train, runs, chunksize=1)))


def median_loss(runs):
    return float(np.median([results[run]["val_loss"] for run in runs]))


results = {}  # Run -> its outcome, filled by every step below

# %% [markdown]
# ## Step 1: tune the base rate at the small batch
#
# A rule scales a rate that must first be good at the small batch: an untuned base rate
# makes any comparison of rules meaningless. A grid of rates evenly spaced on a log
# scale, for each optimizer at `k = 1`, three seeds each. The base rate is the one with
# the lowest median loss among the rates that never diverged: a rate that blows up with
# one seed in three is not a rate anyone would train with (and a single seed can hide it).

# %%
SWEEP = {"SGD": (0.003, 0.01, 0.03, 0.1, 0.3), "Adam": (1e-4, 3e-4, 1e-3, 3e-3)}


def diverged(runs):
    return sum(results[run]["diverged"] for run in runs)


def tune(name, grid, k, rule):
    """(best rate, {rate: (median loss, runs diverged)}) over the seeds."""
    by_rate = {lr: [Run(name, lr, k, rule, seed) for seed in SEEDS] for lr in grid}
    scores = {lr: (median_loss(runs), diverged(runs)) for lr, runs in by_rate.items()}
    stable = {lr: loss for lr, (loss, bad) in scores.items() if not bad}
    return min(stable, key=stable.get), scores


started = time.perf_counter()
results |= train_all([Run(name, lr, 1, "none", seed) for name, grid in SWEEP.items()
                      for lr in grid for seed in SEEDS])
base_lr, unstable_at = {}, {}
for name, grid in SWEEP.items():
    base_lr[name], scores = tune(name, grid, 1, "none")
    unstable_at[name] = min((lr for lr, (_, bad) in scores.items() if bad), default=None)
    print(f"{name:4s} " + "  ".join(f"lr {lr:g}: {loss:.4f}" + (f" ({bad} diverged)" if bad else "")
                                    for lr, (loss, bad) in scores.items())
          + f"  -> base rate {base_lr[name]:g}")
    assert base_lr[name] not in (grid[0], grid[-1]), \
        f"{name}: widen the grid, its best is at an edge"
print(f"(median of {len(SEEDS)} seeds; {time.perf_counter() - started:.0f} s)")
print("smallest rate that diverged at the small batch: "
      + ", ".join(f"{name} {lr:g}" if lr else f"{name} none" for name, lr in unstable_at.items()))

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, grid in SWEEP.items():
    medians = [median_loss([Run(name, lr, 1, "none", s) for s in SEEDS]) for lr in grid]
    ax.plot(grid, np.where(np.isfinite(medians), medians, np.nan), "o-", label=name)
ax.set(xscale="log", yscale="log", xlabel="learning rate", ylabel="validation loss (median)",
       title=f"base rate sweep at batch {BASE_BATCH}")
ax.legend()
plt.show()

# %% [markdown]
# Both best rates lie inside their grids (the cell checks it), so each optimizer starts
# from a rate tuned for the small batch. LARS and LAMB are meant for the large batch
# itself, so their rates are tuned there, at the largest `k`, the same way, with the same
# warm-up. A rule is then only fair against a baseline that got the same care: SGD and
# Adam with a rate tuned at the large batch too ("own rate"), the best any rule could
# hope to find.

# %%
LARGE_SWEEP = {"SGD": (0.1, 0.3, 1.0), "Adam": (1e-3, 3e-3, 1e-2),
               "LARS": (0.1, 0.3, 1.0), "LAMB": (0.003, 0.01, 0.03, 0.1)}
LAYERWISE = {"LARS": "SGD", "LAMB": "Adam"}  # each layer-wise optimizer and its plain one
started = time.perf_counter()
results |= train_all([Run(name, lr, K_MAX, "own rate", seed) for name, grid in
                      LARGE_SWEEP.items() for lr in grid for seed in SEEDS])
own_rate, at_edge = {}, {}
for name, grid in LARGE_SWEEP.items():
    own_rate[name], scores = tune(name, grid, K_MAX, "own rate")
    at_edge[name] = own_rate[name] in (grid[0], grid[-1])
    print(f"{name:4s} at k={K_MAX}: " + "  ".join(
        f"lr {lr:g}: {loss:.4f}" + (f" ({bad} diverged)" if bad else "")
        for lr, (loss, bad) in scores.items()) + f"  -> rate {own_rate[name]:g}"
        + ("  (at the grid's edge)" if at_edge[name] else ""))
for name in LAYERWISE:
    assert not at_edge[name], f"{name}: widen the grid, its best is at an edge"
base_lr |= {name: own_rate[name] for name in LAYERWISE}
print(f"({time.perf_counter() - started:.0f} s)")

# %% [markdown]
# ## Step 2: grow the batch, every rule, three seeds
#
# Every run sees the same number of columns. The seed sets the initial weights and the
# order of the data, so the spread over seeds is the noise a single run would hide.

# %%
runs = [Run(name, base_lr[name], 1, "none", seed) for name in SWEEP for seed in SEEDS]
runs += [Run(name, base_lr[name], k, rule, seed) for name in SWEEP for k in KS[1:]
         for rule in RULES for seed in SEEDS]
runs += [Run(name, own_rate[name], K_MAX, "own rate", seed) for name in LARGE_SWEEP
         for seed in SEEDS]
new_runs = [run for run in runs if run not in results]  # the sweeps ran the others
started = time.perf_counter()
results |= train_all(new_runs)
print(f"{len(runs)} runs in the table, {len(new_runs)} new "
      f"({time.perf_counter() - started:.0f} s); "
      f"{len(results)} trainings in this lesson")
assert all(results[run]["seen"] == SAMPLES or results[run]["diverged"] for run in results), \
    "every run that did not diverge saw the same number of columns"


def outcome(name, k, rule):
    """Median, lowest and highest validation loss over the seeds, and how many diverged."""
    lr = own_rate[name] if rule == "own rate" else base_lr[name]
    losses = [results[Run(name, lr, k, rule, seed)]["val_loss"] for seed in SEEDS]
    return {"median": float(np.median(losses)), "low": min(losses), "high": max(losses),
            "diverged": sum(not math.isfinite(v) for v in losses), "lr": lr}


table = {(name, 1, "none"): outcome(name, 1, "none") for name in SWEEP}
table |= {(name, k, rule): outcome(name, k, rule) for name in SWEEP for k in KS[1:]
          for rule in RULES}
table |= {(name, K_MAX, "own rate"): outcome(name, K_MAX, "own rate") for name in LARGE_SWEEP}

print(f"validation loss after {SAMPLES:,} columns: median of {len(SEEDS)} seeds [lowest, highest]")
print(f"{'optimizer':9s} {'k':>3s} {'batch':>5s} {'rule':17s} {'lr':>8s} {'median':>8s} "
      f"{'spread':>19s}")
for (name, k, rule), o in table.items():
    lr = schedule(Run(name, o["lr"], k, rule, 0))[1].lr
    spread = f"[{o['low']:.4f}, {o['high']:.4f}]" if not o["diverged"] else \
        f"{o['diverged']} of {len(SEEDS)} diverged"
    print(f"{name:9s} {k:3d} {k * BASE_BATCH:5d} {rule:17s} {lr:8.3g} {o['median']:8.4f} "
          f"{spread:>19s}")

# %%
def bars(points):
    """Median and the distance to the lowest and highest seed; NaN where it diverged."""
    median = np.array([p["median"] for p in points])
    low, high = np.array([p["low"] for p in points]), np.array([p["high"] for p in points])
    finite = np.isfinite(median) & np.isfinite(high)
    nan = np.full(len(points), np.nan)
    return (np.where(np.isfinite(median), median, np.nan),
            [np.where(finite, median - low, nan), np.where(finite, high - median, nan)])


fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
for ax, (layerwise_name, name) in zip(axes, LAYERWISE.items()):
    for rule in RULES:
        median, spread = bars([table[(name, 1, "none")]] + [table[(name, k, rule)] for k in KS[1:]])
        ax.errorbar(KS, median, yerr=spread, marker="o", capsize=4, label=rule)
    for offset, marker, which in ((0.96, "kD", name), (1.04, "k*", layerwise_name)):
        median, spread = bars([table[(which, K_MAX, "own rate")]])
        ax.errorbar([K_MAX * offset], median, yerr=spread, fmt=marker, ms=9, capsize=4,
                    label=f"{which} (rate tuned at k={K_MAX})")
    ax.set(xscale="log", yscale="log", xticks=KS, xticklabels=[str(k) for k in KS],
           xlabel="k (effective batch / base batch)", title=name)
    ax.legend(fontsize=8)
axes[0].set_ylabel(f"validation loss after {SAMPLES:,} columns")
fig.suptitle("final loss vs k, per rule (median of the seeds, bars: lowest to highest; "
             "diverged runs off the chart)")
plt.show()

# %% [markdown]
# ## Step 3: the verdict, read from the table
#
# For each optimizer and each large batch, the verdict is the rule with the lowest
# median, and it is *clear* when its worst seed is still below the runner-up's best. The
# literature agrees with the experiment only on a clear win of the rule it predicts
# (linear with warm-up for SGD, the square root for Adam). The cell below works that
# out, measures every rule against the rate tuned at the large batch, and writes the
# conclusion.

# %%
EXPECTED = {"SGD": ("linear + warm-up", "linear"), "Adam": ("sqrt",)}
CITED = {"SGD": ("Goyal et al. (2017)", "linear, with warm-up"),
         "Adam": ("Malladi et al. (2022)", "the square root")}


def ranking(name, k):
    return sorted(RULES, key=lambda rule: table[(name, k, rule)]["median"])


def clearly_below(a, b):
    """Every seed of a below every seed of b."""
    return table[a]["high"] < table[b]["low"]


verdict = {}
for name in SWEEP:
    for k in KS[1:]:
        best, runner_up = ranking(name, k)[:2]
        clear = clearly_below((name, k, best), (name, k, runner_up))
        verdict[(name, k)] = {
            "best": best, "runner_up": runner_up, "clear": clear,
            "agrees": clear and best in EXPECTED[name],
            "vs_small_batch": table[(name, k, best)]["median"] / table[(name, 1, "none")]["median"],
            "none_vs_small_batch": table[(name, k, "none")]["median"] /
            table[(name, 1, "none")]["median"]}
for (name, k), v in verdict.items():
    print(f"{name:4s} k={k:2d}: best {v['best']!r} ({'clear' if v['clear'] else 'within the noise'}"
          f" over {v['runner_up']!r}), {v['vs_small_batch']:.2f}x the small batch's loss; "
          f"no rule: {v['none_vs_small_batch']:.2f}x; the literature "
          f"{'agrees' if v['agrees'] else 'is not confirmed'}")
vs_own = {name: table[(name, K_MAX, verdict[(name, K_MAX)]["best"])]["median"] /
          table[(name, K_MAX, "own rate")]["median"] for name in SWEEP}
layerwise = {lw: table[(lw, K_MAX, "own rate")]["median"]
             / table[(name, K_MAX, "own rate")]["median"] for lw, name in LAYERWISE.items()}
print("best rule / rate tuned at the large batch: "
      + ", ".join(f"{name} {ratio:.2f}" for name, ratio in vs_own.items()))
print("layer-wise / plain optimizer, both tuned at the large batch: "
      + ", ".join(f"{lw} {ratio:.2f}" for lw, ratio in layerwise.items()))

# The claim the text below makes whatever the outcome: a larger batch with the base rate
# unchanged learns less per column than the small batch, for both optimizers.
for name in SWEEP:
    assert verdict[(name, K_MAX)]["none_vs_small_batch"] > 1, f"{name}: no rule kept up"


def warmup_sentence(name):
    plain, warm = table[(name, K_MAX, "linear")], table[(name, K_MAX, "linear + warm-up")]
    if clearly_below((name, K_MAX, "linear + warm-up"), (name, K_MAX, "linear")):
        effect = "helped the linear rule, beyond the spread of the seeds"
    elif warm["median"] < plain["median"]:
        effect = "lowered the linear rule's median, within the spread of the seeds"
    else:
        effect = "did not help the linear rule"
    diverged = (f"; {plain['diverged']} of {len(SEEDS)} runs diverged without it"
                if plain["diverged"] else "; no run diverged without it")
    return (f"Warm-up {effect} here (median {warm['median']:.3g} with it, "
            f"{plain['median']:.3g} without{diverged}). ")


def literature_sentence(name, v):
    who, rule = CITED[name]
    if v["agrees"]:
        return f"This agrees with {who} ({rule}): the rule they predict wins clearly. "
    if v["best"] in EXPECTED[name]:
        return (f"{who} predict this rule ({rule}), but its win is within the noise: "
                "consistent with them, not a confirmation. ")
    return f"This differs from {who} ({rule}). " + why_sentence(name)


def why_sentence(name):
    blown = [rule for rule in RULES if table[(name, K_MAX, rule)]["diverged"]]
    if not blown:
        return ""
    asked = {rule: schedule(Run(name, base_lr[name], K_MAX, rule, 0))[1].lr for rule in blown}
    rates = ", ".join(f"{rule} asks for {lr:g}" for rule, lr in asked.items())
    edge = unstable_at[name]
    if edge is not None and min(asked.values()) >= edge:
        return (f"Why: runs diverged where {rates}, at or above {edge:g}, the smallest rate "
                "that already diverged at the small batch. A larger batch averages the noise "
                "out of the gradient, not the curvature out of the loss, and a step too large "
                "for the curvature diverges whatever the batch: the rules hold only while the "
                "scaled rate stays below that limit. ")
    below = (f"below {edge:g}, the small batch's instability edge" if edge is not None
             else "although no rate of the sweep diverged at the small batch")
    return (f"Runs diverged where {rates}, {below}: the curvature measured at the small batch "
            "does not explain it. ")


def sentence(name):
    v, eight = verdict[(name, K_MAX)], verdict[(name, KS[1])]
    if v["vs_small_batch"] <= 1.1:
        match = "and it matches the small batch's loss, within a tenth"
    else:
        match = f"yet it ends {v['vs_small_batch']:.1f} times above the small batch's loss"
    clear = (f"ahead of {v['runner_up']} beyond the spread of the seeds" if v["clear"]
             else f"ahead of {v['runner_up']}, but within the spread of the seeds: not a "
             "clear win")
    own = (f"A rate tuned at k = {K_MAX} itself ({own_rate[name]:g}) ends at "
           f"{1 / vs_own[name]:.2f} times the best rule's loss"
           + (", at the edge of its grid" if at_edge[name] else "") + ". ")
    text = (f"**{name}**: at k = {K_MAX}, **{v['best']}** gives the lowest loss ({clear}), "
            f"{match}. At k = {KS[1]} the best is {eight['best']}. "
            f"Without a rule the loss is {v['none_vs_small_batch']:.1f} times the small batch's. ")
    text += warmup_sentence(name) + own + literature_sentence(name, v)
    return text + (f"The literature's rules describe long trainings; here k = {K_MAX} has "
                   f"{SAMPLES // (K_MAX * BASE_BATCH)} steps, where the start of training "
                   f"weighs most, and {len(SEEDS)} seeds cannot resolve small differences.")


def layerwise_sentence(lw, name):
    if clearly_below((lw, K_MAX, "own rate"), (name, K_MAX, "own rate")):
        how = "clearly below"
    elif clearly_below((name, K_MAX, "own rate"), (lw, K_MAX, "own rate")):
        how = "clearly above"
    else:
        how = "within the seeds' spread of"
    return (f"**{lw}** at its own tuned rate ends {how} {name} with a rate tuned at the same "
            f"batch ({layerwise[lw]:.2f} times its loss).")


display(Markdown("\n\n".join([sentence(name) for name in SWEEP]
                             + [layerwise_sentence(lw, name) for lw, name in LAYERWISE.items()])))

# %% [markdown]
# How to read it — the cell below states each point from this run's figures:

# %%
def how_to_read():
    cost = ", ".join(f"{name} {verdict[(name, K_MAX)]['vs_small_batch']:.1f}x" for name in SWEEP)
    free = all(verdict[(name, K_MAX)]["vs_small_batch"] <= 1.1 for name in SWEEP)
    lw_best = [lw for lw, name in LAYERWISE.items()
               if clearly_below((lw, K_MAX, "own rate"), (name, K_MAX, "own rate"))]
    no_rule = ", ".join(f"{name} {verdict[(name, K_MAX)]['none_vs_small_batch']:.1f}x"
                        for name in SWEEP)
    beat = "beats" if len(lw_best) == 1 else "beat"
    layerwise_line = (f"{' and '.join(lw_best)} clearly {beat} the plain optimizer tuned at "
                      "the same batch" if lw_best else
                      "neither clearly beats the plain optimizer tuned at the same batch")
    return [
        "- **No rule** loses for both optimizers: at equal columns seen, the large batch "
        f"takes `k` times fewer steps of the same size ({no_rule} the small batch's loss).",
        "- For **SGD**, the update is proportional to the rate, so a rate `k` times larger "
        "makes one large-batch step stand for `k` small ones: the linear rule. It is also "
        "the rule that can blow up at the start, when the gradients are large and change "
        "fast — the reason for warm-up.",
        "- For **Adam**, the update is normalised by the running root-mean-square of the "
        "gradient: averaging `k` times more columns lowers the noise in that denominator, "
        "not the size of the step, and the SDE analysis of Malladi et al. gives `√k` (they "
        "also adjust Adam's betas and epsilon, which this lesson keeps fixed).",
        f"- **LARS and LAMB** still need a tuned rate and a warm-up; here {layerwise_line}. "
        f"They were built for batches far beyond this one (`k` = {K_MAX}).",
        ("- The best rule makes the large batch *free* here: it matches the small batch's "
         "loss at equal columns." if free else
         f"- Even the best rule does not make a large batch *free*: at equal columns it ends "
         f"at {cost} the small batch's loss; what it buys is wall-clock time, since the `k` "
         "micro-batches run on `k` devices at once."),
    ]


display(Markdown("\n".join(how_to_read())))

# %% [markdown]
# ## Step 4: why the gain stops — the critical batch size
#
# McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") explain where a
# larger batch stops paying. A batch of `B` columns estimates the true gradient `G` with
# noise of covariance `Σ / B`. While that noise dominates, a batch `k` times larger
# divides it by `k`, and a step can go `k` times as far: `k` times fewer steps for the same
# columns. Once the batch is so large that the noise no longer matters, a larger batch buys
# no fewer steps and only costs columns. Their model puts the turn at the *critical batch size*,
# `B_crit`, predicted by the *gradient noise scale*; its simple form
# `B_simple = tr(Σ) / |G|²` can be measured while training, and the steps and columns
# needed trade off as `(S / S_min - 1)(E / E_min - 1) = 1`.
#
# This lesson's runs at the largest `k` measured it as they trained: each step's `k`
# micro-batches are `k` gradients of `b` columns (what `k` ranks compute), and their mean is
# the gradient of `k × b` columns (what the all-reduce gives them). Since a squared norm
# `|G_B|²` averages `|G|² + tr(Σ) / B`, the two norms give both unknowns (the paper's
# appendix A; the exercise at the end asks for the formula, the cell below solves the two
# equations as a linear system). One step's estimates are noisy, so, as the paper
# advises, each is averaged over many steps (and the seeds) before one is divided by the
# other. The runs are those of each optimizer's best rule at the largest `k`.
#
# The model also says what a larger batch costs at equal columns, which is this lesson's
# protocol: reaching a loss takes `E = E_min (1 + B / B_noise)` columns, so a batch of
# `k × b` makes the progress the small batch `b` makes with a share
# `(1 + b / B_noise) / (1 + k b / B_noise)` of the columns — one half near
# `k = B_noise / b`. The small batch's runs recorded their validation loss as they went
# (on the first `CURVE_COLUMNS` validation columns, and every run its final loss on them
# too): the cell finds when they reached each large batch's final loss, and sets that
# share of the columns beside the prediction.

# %%
SMALL_BATCH, BIG_BATCH = BASE_BATCH, K_MAX * BASE_BATCH
SYSTEM = np.array([[1.0, 1 / SMALL_BATCH], [1.0, 1 / BIG_BATCH]])  # |G_B|² = |G|² + tr(Σ)/B


def noise_parts(norms):
    """Per step, (|G|², tr(Σ)) from (mean |micro-batch gradient|², |their mean|²)."""
    return np.linalg.solve(SYSTEM, np.array(norms, dtype=float).T).T


check_parts = noise_parts([(2.0 + 40.0 / SMALL_BATCH, 2.0 + 40.0 / BIG_BATCH)])[0]
assert np.allclose(check_parts, (2.0, 40.0)), "the system gives back a known |G|² and tr(Σ)"

WINDOWS = 4  # stretches of each run over which B_simple is tracked


def noise_scale(name):
    """B_simple over the run (per stretch of steps) and over the whole run, from every
    seed of the optimizer's best rule at K_MAX that did not diverge."""
    rule = verdict[(name, K_MAX)]["best"]
    runs = [Run(name, base_lr[name], K_MAX, rule, seed) for seed in SEEDS]
    parts = [noise_parts(results[run]["norms"]) for run in runs if not results[run]["diverged"]]
    steps = min(len(p) for p in parts)
    bounds = np.linspace(0, steps, WINDOWS + 1).astype(int)

    def ratio(lo, hi):
        g_sq = np.mean([p[lo:hi, 0].mean() for p in parts])
        trace = np.mean([p[lo:hi, 1].mean() for p in parts])
        return trace / g_sq if g_sq > 0 else math.inf  # noise alone: |G|² not resolved

    return {"rule": rule, "seeds": len(parts), "steps": steps,
            "track": [ratio(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])],
            "whole": ratio(0, steps)}


def small_batch_curve(name):
    """Columns seen and the median validation loss of the seeds, along the small batch's
    runs at the base rate."""
    curves = [results[Run(name, base_lr[name], 1, "none", seed)]["curve"] for seed in SEEDS]
    return (np.array([seen for seen, _ in curves[0]], dtype=float),
            np.median([[loss for _, loss in curve] for curve in curves], axis=0))


def columns_to_reach(name, loss):
    """How many columns the small batch needed to reach ``loss`` (interpolated in log-log
    between its measured points); inf if it never did."""
    seen, losses = small_batch_curve(name)
    reached = np.nonzero(losses <= loss)[0]
    if not len(reached):
        return math.inf
    i = reached[0]
    if i == 0:
        return seen[0]
    t = math.log(losses[i - 1] / loss) / math.log(losses[i - 1] / losses[i])
    return math.exp(math.log(seen[i - 1]) + t * math.log(seen[i] / seen[i - 1]))


def efficiency(name, k):
    """The share of its columns the small batch needed to match what the best rule at k
    reached with all of them (1: the larger batch cost nothing), on the curves' columns."""
    best = verdict[(name, k)]["best"] if k > 1 else "none"
    reached = np.median([results[Run(name, base_lr[name], k, best, seed)]["curve_end"]
                         for seed in SEEDS])
    return min(1.0, columns_to_reach(name, reached) / SAMPLES)


def predicted_efficiency(k, b_noise):
    """McCandlish et al.'s E = E_min (1 + B / B_noise), the batch b against k b."""
    return (1 + BASE_BATCH / b_noise) / (1 + k * BASE_BATCH / b_noise)


def half_way(ks, shares):
    """The k at which the share falls to one half (log-log between the ks), or None."""
    for (k0, e0), (k1, e1) in zip(zip(ks, shares), zip(ks[1:], shares[1:])):
        if e1 <= 0.5 < e0:
            t = math.log(e0 / 0.5) / math.log(e0 / e1)
            return math.exp(math.log(k0) + t * math.log(k1 / k0))
    return None


noise = {}
for name in SWEEP:
    found = noise[name] = noise_scale(name)
    measured_share = [efficiency(name, k) for k in KS]
    predicted_share = [predicted_efficiency(k, found["whole"]) for k in KS]
    found |= {"measured": measured_share, "predicted": predicted_share,
              "k_half_measured": half_way(KS, measured_share),
              "k_half_predicted": found["whole"] / BASE_BATCH + 2}  # (1 + b/B)/(1 + kb/B) = 1/2
    grows = found["track"][-1] > found["track"][0]
    print(f"{name} ({found['rule']}, {found['seeds']} seeds x {found['steps']} steps): B_simple "
          + " -> ".join(f"{b:.0f}" for b in found["track"])
          + f" over the run ({'grew' if grows else 'did not grow'} as the loss fell); "
          f"{found['whole']:.0f} over the whole run")
    for k, measured_k, predicted_k in zip(KS[1:], measured_share[1:], predicted_share[1:]):
        print(f"   k = {k:2d}: the small batch needed {measured_k:.0%} of the columns to match "
              f"the best rule's loss; the model predicts {predicted_k:.0%}")
    assert math.isfinite(found["whole"]) and found["whole"] > 0, f"{name}: |G|² not resolved"

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, found in noise.items():
    ax.plot(np.arange(1, WINDOWS + 1), found["track"], "o-", label=f"{name} ({found['rule']})")
ax.axhline(BASE_BATCH * KS[1], color="grey", ls=":",
           label=f"k = {KS[1]} (batch {BASE_BATCH * KS[1]})")
ax.set(yscale="log", xlabel="quarter of the run", ylabel="B_simple (columns)",
       title=f"the gradient noise scale during the k = {K_MAX} runs")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Where does the gain stop? The noise scale predicts the `k` at which the large batch needs
# double the columns — the critical batch over the base batch; the small batch's curve
# measures where the share of the columns falls to one half. The cell sets the two side
# by side and calls them near when they are within a factor of two of each other (our
# choice: the grid of `k` has three points).

# %%
for name, found in noise.items():
    predicted, measured = found["k_half_predicted"], found["k_half_measured"]
    if measured is None:
        near = predicted >= K_MAX / 2
        seen = f"the share stays above one half up to k = {K_MAX}"
    else:
        near = 0.5 <= predicted / measured <= 2
        seen = f"the share falls to one half at k = {measured:.1f}"
    found["near"] = near
    print(f"{name}: B_simple / b + 2 = {predicted:.1f}; measured, {seen}: the noise scale "
          f"{'does' if near else 'does not'} predict where this model's gain stops")

# %% [markdown]
# Where the two agree, the table's turn is the one the paper predicts: below
# `B_noise` a larger batch is nearly free at equal columns, above it it is not, whatever
# the learning-rate rule. Where they disagree, remember what each leaves out: `B_simple`
# assumes the curvature is the same in every direction (the paper's `B_noise` weighs the
# noise by the Hessian), a short run weighs its first steps, where McCandlish et al. find
# the noise scale smallest (the cell above printed how it moved here), and three seeds
# resolve the table only so far.

# %% [markdown]
# ## When a real run diverges
#
# The loop above stops a run whose loss leaves the finite numbers. `trainup_cpu.py` does
# the same for every run, on every rank at once: each rank's loss is its own, but after
# DDP's all-reduce the weights are the same on all of them, so it checks the *weights*
# (every few steps and at each epoch's end: the cell prints how often) and every rank
# decides alike with no extra message. The run ends there, keeps no checkpoint of NaN
# weights, writes where it found them in `result.json` and fails (its exit code says
# so). Here with a rate far too high:

# %%
import json
import sys

from kosmoss.lessons import scratch_folder, script, sh

diverging = scratch_folder("lesson04-") / "result.json"
too_high = 1e30  # Adam's first step moves every weight by about the rate
done = sh([sys.executable, script("trainup_cpu.py"), "--dataset", "tiny", "--lr", str(too_high),
           "--batch-size", "64", "--max-epochs", "3", "--no-progress",
           "--result-json", str(diverging)], check=False)
found = json.loads(diverging.read_text())["diverged"]
print(f"exit code {done.returncode}; {found['what']} at step {found['step']}, numbers at "
      f"the check before (step {found['finite_at_step']}); checked every "
      f"{found['checked_every']} steps and at each epoch's end")
assert done.returncode == 1 and "NaN or inf" in found["what"]

# %% [markdown]
# ## With a GPU
#
# The arithmetic does not change: `k` counts the ranks (times the accumulated
# micro-batches), and the per-rank batch is set by what fits one GPU's memory, usually
# far larger than here. This experiment is CPU-sized on purpose; on a GPU the same loop
# runs unchanged with the tensors moved to `cuda` (GPU only; no recorded result yet).
#
# ## Exercises
#
# 1. Double `SAMPLES` (a longer training) and rerun steps 2 and 3. Does the gap between
#    the best large-batch rule and the small batch shrink, as Hoffer et al. argue?
# 2. Run `trainup_cpu.py --num-processes 2 --batch-size 512 --scale-lr linear
#    --warmup-steps 20 --dataset small --max-epochs 1` and read the scaling lines it
#    prints and `lr`, `lr_rule`, `warmup_steps` in its `result.json`.
# 3. Give Adam the linear rule at the largest `k` with a longer warm-up
#    (`WARMUP_FRACTION = 0.5`).
#    Does warm-up rescue the linear rule for Adam?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1.
# SAMPLES *= 2
# results = train_all(runs)  # then rerun the table, plot and verdict cells
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
# WARMUP_FRACTION = 0.5
# long_warmup = train_all([Run("Adam", base_lr["Adam"], K_MAX, "linear + warm-up", seed)
#                          for seed in SEEDS])
# print([r["val_loss"] for r in long_warmup.values()], table[("Adam", K_MAX, "sqrt")])
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 04` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Scale a learning rate with the none, linear and square-root rules.**
#
# Write `scaled_lr(base_lr, rule, effective_batch_size, base_batch_size)`: `base_lr` was
# tuned for batches of `base_batch_size`; the run averages each optimizer step over
# `effective_batch_size` columns (per-device batch × ranks × accumulated batches). With
# `k = effective_batch_size / base_batch_size`, rule `"none"` keeps the rate, `"linear"`
# multiplies it by `k`, `"sqrt"` by `√k`. The checker compares with `kosmoss.scaling.arithmetic`
# for each rule on several batch sizes, where `k` is not always a whole number and may be
# below one, to float64 rounding.

# %%
# exercise: 04.scaled_lr
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    """The learning rate for rule "none", "linear" or "sqrt"."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("04.scaled_lr", globals())

# %% [markdown]
# **Write the learning rate of a linear warm-up, step by step.**
#
# Write `warmup_lr(step, warmup_steps, base_lr, target_lr)`: the rate used at optimizer
# step `step` (counted from `0`) when the run warms up from the unscaled `base_lr` to the
# scaled `target_lr` linearly over `warmup_steps` steps (Goyal et al.'s gradual warm-up,
# as kosmoss does it): `base_lr` at step `0`, `target_lr` from step `warmup_steps` on (and
# for every step after it), and `target_lr` throughout when `warmup_steps` is `0`. The
# checker compares with `kosmoss.scaling.arithmetic.warmup_factor` step by step, well past
# the warm-up, to float64 rounding.

# %%
# exercise: 04.warmup_lr
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    """The learning rate at optimizer step `step` (from 0)."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("04.warmup_lr", globals())

# %% [markdown]
# **Estimate |G|² and tr(Σ) from the gradient norms at two batch sizes.**
#
# Write `noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch)`. The
# gradient of a batch of `B` columns drawn from the data is the true gradient `G` plus
# noise of covariance `Σ / B`, so its squared norm is, on average,
# `|G_B|² = |G|² + tr(Σ) / B`. Given that squared norm at two batch sizes — a rank's
# micro-batch (`small_batch` columns) and the average over all of them (`big_batch`) —
# solve for the two unknowns and return `(g_sq, trace)`: the estimates of `|G|²` and
# `tr(Σ)` of McCandlish et al. (2018, appendix A), whose ratio `tr(Σ) / |G|²` is the
# simple noise scale `B_simple`. From one step's norms the estimate of `|G|²` can come out
# negative (noise): return it as it is — the lesson averages the estimates over steps
# before it divides. The checker gives you the exact expected squared norms of the per-sample
# gradients of a small model (and of chosen `|G|²` and `tr(Σ)`, a noiseless one included)
# and compares your two numbers with the true ones to float64 rounding.

# %%
# exercise: 04.noise_scale
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    """(estimate of |G|², estimate of tr(Σ)) from the squared gradient norms at two batch
    sizes."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("04.noise_scale", globals())
