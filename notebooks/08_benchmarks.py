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
# # Lesson 8 — Benchmarks
#
# **What you will learn**
#
# - how to compare set-ups side by side with `kosmoss bench --quick`: the raw PyTorch loop
#   (the limit), the same loop inside Lightning, kosmoss on one process, DDP, simulated
#   nodes, Horovod, and the loaders;
# - how to read its table (throughput, ratios, scaling efficiency, start-up time, time to
#   a target loss, memory) and its plot;
# - what limits each set-up on this machine, worked out from the numbers it measured.
#
# Time: ~15 min; the cells run in ~3 min on 2 CPU cores

# %%
import json
import sys
from pathlib import Path

import torch
from IPython.display import Image, display

from kosmoss.devices.cpus import available_cores, cores_per_process
from kosmoss.data import presets
from kosmoss.lessons import quick, quiet_lightning, sh, scratch_folder
from kosmoss.model import LitMLP

quiet_lightning()
out = scratch_folder("lesson08-") / "bench"

# %% [markdown]
# ## Run it
#
# `--quick` uses the `tiny` dataset, a few timed steps and two repeats per set-up, and
# reports medians: enough to see the shape of things on a laptop, not to publish. Each
# set-up runs as its own command (as a user would start it), after one warm-up step;
# set-ups that need what this machine lacks (a GPU) are listed as skipped, with the
# reason. `--list` shows the plan without running anything.

# %%
sh([sys.executable, "-m", "kosmoss", "bench", "--quick", "--list"]);

# %% [markdown]
# This lesson runs the rows it reads (`--only`): the rows across network namespaces
# (`hosts-*`) are lesson 12's, the GPU ladder and `compile-cpu` lesson 8b's;
# `kosmoss bench --quick` without `--only` runs every row of the list.

# %%
lesson_rows = ["raw-cpu", "lightning-cpu", "fabric-cpu", "kosmoss-cpu", "ddp-cpu-2",
               "nodes-cpu-2x1", "horovod-cpu-2", "loader-course", "loader-kosmoss",
               "raw-gpu", "lightning-gpu", "fabric-gpu", "kosmoss-gpu", "nodes-gpu-2x1",
               "raw-gpu-bf16", "kosmoss-gpu-bf16", "horovod-gpu-2"]
# CI's quick mode (KOSMOSS_LESSON_QUICK=1) runs each set-up once; yours repeats them.
once = ["--repeats", "1"] if quick() else []
sh([sys.executable, "-m", "kosmoss", "bench", "--quick", "--only", *lesson_rows, *once,
    "--out", out])
print(sorted(p.name for p in out.iterdir()))

# %% [markdown]
# ## Read the table
#
# - **samples/s**: training columns per second over the whole job, median of the repeats;
# - **ratio**: samples/s divided by the row named under *vs* — the raw loop for training
#   rows, the course's loader for the loader rows — repeat by repeat, then the median
#   (paired, so that a machine whose load drifts compares like with like);
# - **eff.** (scaling efficiency): samples/s divided by (ranks × the one-rank kosmoss row):
#   one means `N` ranks do `N` times the work of one;
# - **1st step s**: from launching the command to the end of the first training step —
#   imports, data, process start-up and rendezvous;
# - **target s**: from launching to the first validation below a target loss (defined in
#   `bench.json`), so start-up and speed together;
# - **host MiB / GPU MiB**: peak memory per rank.
#
# The same numbers are in `bench.json` (with every repeat) and `bench.csv`:

# %%
bench = json.loads((out / "bench.json").read_text())
rows = {row["id"]: row for row in bench["rows"]}
measured = {key: row for key, row in rows.items() if row["status"] == "measured"}
print(f"dataset {bench['plan']['dataset_name']}, batch {bench['plan']['batch_size']}, "
      f"{bench['plan']['steps']} timed steps, {bench['plan']['repeats']} repeats; "
      f"{bench['machine']['cpu']['cores_available']} cores, "
      f"{len(bench['machine']['gpus'])} GPU(s)")
print(f"target: {bench['target_definition']}\n")
print(f"{'set-up':16s} {'ranks':>5s} {'samples/s':>10s} {'ratio':>6s} {'eff.':>5s} "
      f"{'1st step s':>10s} {'target s':>8s} {'host MiB':>8s}")


def cell(value, fmt):
    return format(value, fmt) if value is not None else "-"


for key, row in measured.items():
    print(f"{key:16s} {row['ranks']:5d} {row['samples_per_s']:10,.0f} {cell(row['ratio'], '6.2f')} "
          f"{cell(row.get('scaling_efficiency'), '5.2f')} {row['time_to_first_step_s']:10.1f} "
          f"{cell(row.get('time_to_target_s'), '8.1f')} {cell(row['peak_host_mib'], '8.0f')}")
for key, row in rows.items():
    if row["status"] != "measured":
        print(f"{key:16s} {row['status']}: {row['reason']}")

# %%
display(Image(filename=str(out / "bench.png")))

# %% [markdown]
# ## What limits each set-up here
#
# Each row is limited by something different:
#
# - the **raw loop** only computes: forward, backward and Adam on tensors already in
#   memory. Its limit is the arithmetic the cores can do at this batch size;
# - **Lightning alone** (`lightning-cpu`) runs the raw loop's step on the raw loop's
#   tensors inside `Trainer(barebones=True)`: Lightning's loop, its optimizer closure and
#   hooks, a DataLoader, and nothing kosmoss adds: what a stock Lightning Trainer with
#   automatic optimisation costs for this step;
# - **kosmoss on one process** adds to that its own callbacks (the clock, heartbeat,
#   checkpoints), logging, and reading batches as `--mode auto` holds the data (one tensor
#   in RAM, as the raw loop's, when every process can hold a copy; memory-mapped shards
#   otherwise), and takes away some of Lightning's per-batch cost (a
#   profiler that builds nothing, the hook name set without `nn.Module`'s checks, batches
#   read in place instead of through torch's DataLoader, callbacks whose unused per-batch
#   hooks Lightning skips): with Lightning's, a fixed cost per step, which matters more
#   when a step is short (small batch, fast device). One CPU process also makes several
#   optimizer steps per step of Lightning's loop (`--steps-per-execution`, as Keras calls
#   it), so that loop's own Python is paid once per several steps; the steps, losses and
#   weights are the same as with one step a batch;
# - **the raw loop on Lightning Fabric** (`fabric-cpu`) is the raw loop line for line with
#   its model and optimizer set up by `Fabric` and its backward through `fabric.backward`:
#   Lightning's precision and strategy machinery without the Trainer's loop, what a
#   training loop of one's own would keep;
# - **DDP** adds an all-reduce of every gradient per step, over gloo through the loopback
#   here, and the two ranks share the machine's cores;
# - **simulated nodes** are the same ranks started as separate node processes: the same
#   communication, more start-up;
# - **Horovod** adds its own runtime: a background thread that negotiates, every step,
#   which tensors all ranks have ready before reducing them;
# - the **loaders** do no training: the course's opens a memory map per sample (Python and
#   `np.load` for every column), kosmoss's reads a whole batch in one gather, limited by
#   copying memory.
#
# An all-reduce has two bandwidths (nccl-tests' convention). The **algorithm bandwidth**,
# `algbw = buffer bytes / time`, is what the caller sees. The **bus bandwidth**,
# `busbw = algbw × 2(n−1)/n`, counts what each rank actually sends and receives in a ring
# all-reduce (every byte goes round twice, less its own share), so it compares with the
# link's speed whatever the number of ranks. The benchmark times whole steps, not the
# all-reduce alone, so the buffer reduced per second of training is only a floor on algbw.
#
# The cell below works these out from this run's numbers: the time per step, the cost
# Lightning adds per step, the bytes every DDP step all-reduces, the cores each rank had,
# the bytes a loader moves.

# %%
def step_ms(row):
    return 1000 * row["batch_size"] / row["samples_per_s"]


dataset = presets.resolve(bench["plan"]["dataset"])
params = sum(p.numel() for p in LitMLP(dataset.n_x, out_channels=dataset.n_y).parameters())
cores = available_cores()
raw, single = measured.get("raw-cpu"), measured.get("kosmoss-cpu")
if raw:
    print(f"raw loop: {step_ms(raw):.1f} ms per step of {raw['batch_size']} columns, "
          f"{torch.get_num_threads()} torch thread(s) in one process on {cores} core(s)")
if raw and single:
    medians = single["samples_per_s"] / raw["samples_per_s"]
    drifted = max(medians, single["ratio"]) / min(medians, single["ratio"]) > 1.25
    print(f"kosmoss, 1 process: {step_ms(single):.1f} ms per step, "
          f"{step_ms(single) - step_ms(raw):+.1f} ms against the raw loop (paired ratio "
          f"{single['ratio']:.2f}, ratio of the medians {medians:.2f})"
          + ("; they disagree: the machine's load moved between the repeats — rerun on a "
             "quiet machine before reading the ratios" if drifted else ""))
alone = measured.get("lightning-cpu")
if raw and alone and single:
    own_ms = step_ms(single) - step_ms(alone)
    print(f"  of which Lightning's loop: {step_ms(alone) - step_ms(raw):+.2f} ms (lightning-cpu, "
          f"ratio {alone['ratio']:.2f}); kosmoss's callbacks, logging and loader, less what "
          f"its Trainer trims from Lightning's loop: {own_ms:+.2f} ms")
    same = alone["val_loss"] == raw["val_loss"]
    print(f"  lightning-cpu ended at {'the same' if same else 'a different'} validation loss "
          f"as the raw loop ({alone['val_loss']:.7f} and {raw['val_loss']:.7f}): "
          + ("the same work, step for step" if same else
             "not the same arithmetic (another order of the data or of the sums)"))
fabric = measured.get("fabric-cpu")
if raw and fabric:
    print(f"the raw loop on Fabric: {step_ms(fabric) - step_ms(raw):+.2f} ms per step against "
          f"the raw loop (fabric-cpu, ratio {fabric['ratio']:.2f})"
          + (f", Lightning's Trainer loop {step_ms(alone) - step_ms(raw):+.2f} ms" if alone else ""))
for key in ("ddp-cpu-2", "nodes-cpu-2x1", "horovod-cpu-2"):
    row = measured.get(key)
    if not row:
        continue
    steps_per_s = row["samples_per_s"] / row["batch_size"]
    reduced_mb = params * 4 / 1e6  # float32 gradients, the all-reduce's buffer each step
    n = row["ranks"]
    # Per second of *training* (compute included): a floor on the all-reduce's algbw.
    algbw = reduced_mb * steps_per_s
    print(f"{key}: {n} ranks with {cores_per_process(n)} thread(s) each, "
          f"{step_ms(row):.1f} ms per global step, all-reduce of {reduced_mb:.2f} MB per step: "
          f"{algbw:.0f} MB/s of buffer reduced per second of training (algbw at least that), "
          f"busbw = algbw x 2({n}-1)/{n} = {algbw * 2 * (n - 1) / n:.0f} MB/s; efficiency "
          f"{row['scaling_efficiency']:.2f}, first step after {row['time_to_first_step_s']:.1f} s")
distributed = [key for key in ("ddp-cpu-2", "nodes-cpu-2x1", "horovod-cpu-2") if key in measured]
if single:
    for key in distributed:
        print(f"{key}: {step_ms(measured[key]) - step_ms(single):+.1f} ms per global step against "
              f"one process at the same global batch")
sublinear = [key for key in distributed if measured[key]["scaling_efficiency"] < 0.9]
if sublinear:
    print(f"efficiency below one ({', '.join(sublinear)}): the ranks share the {cores} cores "
          f"that one process already kept busy with its {torch.get_num_threads()} threads, so "
          "a second rank adds no arithmetic, only the all-reduce, the waiting for the slower "
          "rank and a second Lightning loop. Ranks pay off when each has its own device.")
superlinear = [key for key in distributed if measured[key]["scaling_efficiency"] > 1.05]
if superlinear:
    print(f"efficiency above one ({', '.join(superlinear)}): each rank did more than the single "
          f"process per rank. The single process runs {torch.get_num_threads()} threads that "
          "wait for each other in every operation, each rank one thread; on cores that other "
          "programs also use, that waiting can cost more than the all-reduce (the third "
          "exercise tests this).")
ddp, nodes, hvd = (measured.get(k) for k in ("ddp-cpu-2", "nodes-cpu-2x1", "horovod-cpu-2"))
if ddp and nodes:
    print(f"simulated nodes / DDP: throughput x{nodes['samples_per_s'] / ddp['samples_per_s']:.2f}, "
          f"start-up {nodes['time_to_first_step_s'] - ddp['time_to_first_step_s']:+.1f} s")
if ddp and hvd:
    print(f"Horovod / DDP: throughput x{hvd['samples_per_s'] / ddp['samples_per_s']:.2f}, "
          f"start-up {hvd['time_to_first_step_s'] - ddp['time_to_first_step_s']:+.1f} s")
course, batched = measured.get("loader-course"), measured.get("loader-kosmoss")
if course and batched:
    sample_bytes = (dataset.n_x + dataset.n_y) * 4
    print(f"loaders: a column is {sample_bytes / 1e3:.1f} kB; the course's loader "
          f"{1e6 / course['samples_per_s']:.0f} µs per column, kosmoss's "
          f"{1e6 / batched['samples_per_s']:.1f} µs ({batched['ratio']:.1f}x), moving "
          f"{batched['samples_per_s'] * sample_bytes / 1e6:,.0f} MB/s")
if single and course and batched:
    print(f"training consumes {single['samples_per_s']:,.0f} columns/s: the course's loader "
          f"alone would feed {course['samples_per_s'] / single['samples_per_s']:.1f}x that, "
          f"kosmoss's {batched['samples_per_s'] / single['samples_per_s']:.0f}x")

# %% [markdown]
# The checks at the end of the report compare this run with kosmoss's targets. With
# `--quick` on a busy laptop they are indications only: a few steps on the `tiny`
# dataset, where start-up and noise weigh most.

# %%
def follows(value, target):
    """The verdict a target such as ">= 0.95", "<= 8" or "1 ± 0.05" gives this value."""
    if "±" in target:
        centre, spread = (float(part) for part in target.split("±"))
        return abs(value - centre) <= spread
    operator, bound = target.split()
    bound = float(bound.replace(",", ""))
    return value >= bound if operator == ">=" else value <= bound


for check in bench["checks"]:
    value = "-" if check["value"] is None else f"{check['value']:.3g}"
    verdict = {True: "reached", False: "not reached", None: check["note"]}[check["passed"]]
    context = f" ({check['context']})" if check.get("context") else ""
    print(f"{check['name']}: {value} (target {check['target']}): {verdict}{context}")
    if check["passed"] is not None:  # judged: the verdict is the figure against its target
        assert check["passed"] == follows(check["value"], check["target"]), check["name"]
    else:
        assert check["note"], f"{check['name']}: neither judged nor explained"

# %% [markdown]
# ## With a GPU
#
# On a GPU machine the GPU rows run too: the raw loop with tensors on the GPU, kosmoss on
# one GPU, two simulated nodes sharing one GPU over gloo, bfloat16 autocast, and Horovod
# sharing a GPU. Without `--quick` the benchmark uses the `large` dataset and big batches,
# where a GPU step is so short that Lightning's fixed cost per step and the loader become
# the limits to watch. `bench.json` records the machine (`kosmoss env`) so runs from
# different machines can be told apart.

# %%
gpu_rows = {key: row for key, row in rows.items() if row["device"] == "gpu"}
if torch.cuda.is_available():
    print({key: round(row["samples_per_s"]) for key, row in gpu_rows.items()
           if row["status"] == "measured"})
else:
    print(f"no GPU here: {len(gpu_rows)} GPU set-ups skipped ({sorted(gpu_rows)})")

# %% [markdown]
# ## Exercises
#
# 1. Run the benchmark again into another folder and compare the two `bench.csv` files.
#    Which numbers move most between runs, and why is a median of two repeats not enough
#    to trust a difference of a few percent?
# 2. Run `kosmoss bench --quick --only raw-cpu kosmoss-cpu --batch-size 1024`. What happens
#    to the ratio of kosmoss to the raw loop, and why?
# 3. Set `OMP_NUM_THREADS=1` in the environment of the benchmark and run the CPU rows
#    again. How do the one-process rows and the scaling efficiency change?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. The first-step times and the multi-process rows move most: process start-up and
# #    cores shared with other programs. Two repeats give no idea of the spread.
# again = out.parent / "again"
# sh([sys.executable, "-m", "kosmoss", "bench", "--quick", "--out", again])
# print((out / "bench.csv").read_text(), (again / "bench.csv").read_text(), sep="\n")
#
# # 2. The ratio rises towards one: Lightning's cost is per step, and a step of four times
# #    as many columns takes about four times as long, so the fixed cost weighs less.
# sh([sys.executable, "-m", "kosmoss", "bench", "--quick", "--only", "raw-cpu", "kosmoss-cpu",
#     "--batch-size", "1024", "--out", out.parent / "big-batch"])
#
# # 3. One thread per process: the one-process rows no longer wait for a second thread
# #    (faster on a busy machine, slower on an idle one), and the efficiency drops towards
# #    one or below, since the ranks had one thread each anyway.
# import os
# sh([sys.executable, "-m", "kosmoss", "bench", "--quick", "--only", "raw-cpu", "kosmoss-cpu",
#     "ddp-cpu-2", "--out", out.parent / "one-thread"], env={**os.environ, "OMP_NUM_THREADS": "1"})
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 08` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Compute a model's training memory and check it against a measurement.**
#
# Write `training_memory(model, batch_size)`: the bytes one training step with Adam needs
# for `model` (an `nn.Sequential` of `nn.Linear` and `nn.SiLU` layers, float32) on a batch
# of `batch_size` columns: parameters + gradients + Adam's two states per parameter (its
# step counter, one number per tensor, is not counted) + activations, the tensors autograd
# keeps for the backward pass — here the input batch, the output of every layer (each
# `Linear` and each activation) and the loss's targets (as large as the last output). The
# checker measures a real step (tensor sizes, autograd's saved tensors, the optimizer's
# state) on several models, a single `Linear`, layers without a bias and a batch of one
# among them, and compares exactly: bytes are counted, not estimated.

# %%
# exercise: 08.training_memory
import torch
from torch import nn


def training_memory(model, batch_size):
    """Bytes: parameters + gradients + Adam states + activations, float32."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("08.training_memory", globals())

# %% [markdown]
# **Tell algorithm bandwidth from bus bandwidth for an all-reduce.**
#
# Write `bandwidths(nbytes, seconds, world_size)` returning `(algbw, busbw)` in bytes per
# second for an all-reduce of a buffer of `nbytes` bytes that took `seconds` on
# `world_size` ranks. The algorithm bandwidth is the buffer size over the time; the bus
# bandwidth (nccl-tests' convention) corrects it by the share of the data every rank must
# send and receive in an all-reduce, so that it compares with the hardware's link speed
# whatever the number of ranks. The checker compares on several sizes and world sizes,
# one rank and an odd number of ranks included, to float64 rounding.

# %%
# exercise: 08.bandwidths
def bandwidths(nbytes, seconds, world_size):
    """(algbw, busbw) of an all-reduce, bytes/s."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("08.bandwidths", globals())
