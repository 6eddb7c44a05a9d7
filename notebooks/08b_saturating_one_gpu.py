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
# # Lesson 8b — Saturating one GPU
#
# **What you will learn**
#
# - what one training sample of this model costs a machine — the bytes it must read and
#   the arithmetic it must do — and the limit those two set on a GPU;
# - the *ladder*: the raw training loop made faster one change at a time (the data on the
#   GPU, bf16, a fused optimizer, `torch.compile`, CUDA graphs, larger batches), each rung
#   measured, and what each one takes out of a step;
# - why even the best rung stays far below that limit for this small model, and what
#   kosmoss's run path takes from the ladder (`--cuda-graphs`, `--compile`, several steps
#   per step of Lightning's loop).
#
# Time: ~20 min; the cells run in ~1 min on 2 CPU cores

# %%
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display

from kosmoss.bench import ladder
from kosmoss.bench.rungs import COMPILE_ALONE, RUNGS, rung
from kosmoss.core.defaults import DEFAULT_HIDDEN
from kosmoss.data.schema import ColumnSchema
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare
from kosmoss.bench.baselines import limit_setup
from kosmoss.lessons import quick, quiet_lightning, recorded_gpu, scratch_folder, script

quiet_lightning()
scratch = scratch_folder("lesson08b-")
gpu = torch.cuda.is_available()

# %% [markdown]
# ## What a sample costs
#
# A training step cannot do less than read every sample's inputs and targets once from
# memory, and do the sample's arithmetic: the multiply-adds of every layer forward, and
# backward the gradient of every weight and of every layer's input — except the first
# layer's, whose input is the data. A multiply-add is two floating-point operations.

# %%
schema = ColumnSchema()
costs = ladder.sample_costs(schema.n_x, DEFAULT_HIDDEN, schema.n_y)
intensity = costs["flop_per_sample"] / costs["bytes_per_sample"]
print(f"the course's model: {schema.n_x:,} inputs -> {list(DEFAULT_HIDDEN)} -> "
      f"{schema.n_y:,} outputs, {costs['parameters']:,.0f} parameters")
print(f"bytes read per sample (float32 x and y): {costs['bytes_per_sample']:,.0f}")
print(f"FLOP per sample: forward {costs['forward_flop_per_sample'] / 1e6:.2f} M, "
      f"forward and backward {costs['flop_per_sample'] / 1e6:.2f} M")
print(f"arithmetic intensity: {intensity:.0f} FLOP per byte read")
# The "6 x parameters" rule of thumb also counts the data's own gradient:
assert costs["flop_per_sample"] < 6 * costs["parameters"]

# %% [markdown]
# ## The limit of one GPU
#
# Divide what the device can move and compute per second by what a sample needs: the
# smaller of the two rates is a bound no training loop can beat. On a GPU kosmoss reads
# the memory bandwidth from the device (NVML) where it can, and the dense bf16 peak from
# NVIDIA's datasheets. Without a GPU here, the lesson uses the limits recorded with the
# ladder on a real one.

# %%
record = recorded_gpu("ladder")
if gpu:
    limits = ladder.device_limits(torch.device("cuda"))
    print(f"live: {limits['device']}")
else:
    assert record is not None, "the recorded ladder ships with kosmoss (docs/gpu/)"
    limits = record["figures"]["limits"]
    print(f"no GPU here: the limits of the {record['device']} the ladder was recorded on "
          f"({record['date']}, `{record['command']}`)")
print(f"memory bandwidth {limits['memory_bandwidth_bytes_s'] / 1e12:.2f} TB/s "
      f"({limits['bandwidth_source']})")
print(f"dense bf16 peak {limits['peak_bf16_flop_s'] / 1e12:,.0f} TFLOP/s ({limits['peak_source']})")
limit = ladder.bound(costs, limits)
print(f"bound by memory: {limit['memory_bound_samples_per_s'] / 1e6:,.0f} M samples/s; "
      f"by bf16 arithmetic: {limit['compute_bound_samples_per_s'] / 1e6:,.0f} M samples/s")
print(f"this model is bound by {limit['bound_by']}: at most "
      f"{limit['limit_samples_per_s'] / 1e6:,.0f} M samples/s")
assert limit["limit_samples_per_s"] == min(limit["memory_bound_samples_per_s"],
                                           limit["compute_bound_samples_per_s"])

# %% [markdown]
# ## The ladder
#
# Each rung adds one change to the rung below it, on the same model, the same batches in
# the same order:
#
# - **host**: batches gathered in host memory and copied to the GPU, as a data loader does;
# - **resident**: both splits on the GPU, the batch gathered there;
# - **bf16**: bfloat16 autocast, the tensor cores' format;
# - **fused**: Adam's fused kernel, one launch for all the parameters;
# - **compile**: `torch.compile` of the network;
# - **graphs**: the whole step — gather, forward, backward, Adam — captured once in a CUDA
#   graph and replayed: no Python, no kernel launch per step;
# - **graphs-k8**: several steps a replay;
# - **bf16-store**: the inputs kept on the GPU already normalised and in bf16 — no
#   per-step normalisation and cast of the batch, and fewer bytes gathered (bf16 values);
#   then the same at a much larger batch.
#
# Each rung also has a limit of its own: the peak of the format its matmuls run in (fp32
# matmuls run on the CUDA cores, not the tensor cores) and the bytes its inputs take.
#
# With a GPU the cell below runs the ladder live on a small dataset; without one it reads
# the ladder recorded on a GPU by the GPU check's ladder profile (docs/gpu.md).

# %%
if gpu:
    data = prepare(SyntheticSource(16384 if quick() else 163840, seed=3),
                   scratch / "ladder-data", shard_size=8192)
    batches = ["2048", "max"] if quick() else ["16384", "max"]
    found = ladder.run_ladder(data.path, RUNGS, batches, 60 if quick() else 300,
                              torch.device("cuda"))
    rows, source = found["rows"], f"live, {torch.cuda.get_device_name()}"
else:
    rows = record["figures"]["rows"]
    source = f"recorded on the {record['device']}, {record['date']}"

stored_costs = ladder.sample_costs(schema.n_x, DEFAULT_HIDDEN, schema.n_y, input_bytes=2)
own = {row["rung"]: ladder.rung_bound(rung(row["rung"]), costs, stored_costs, limits)
       for row in rows}
print(f"{'rung':<12s} {'batch':>8s} {'M samples/s':>12s} {'x below':>8s} {'of the limit':>13s}"
      f" {'of its own':>11s}  its own limit")
below = None
for row in rows:
    speed, mine = row["samples_per_s"], own[row["rung"]]
    gain = f"{speed / below:.2f}" if below else ""
    share = speed / limit["limit_samples_per_s"]
    print(f"{row['rung']:<12s} {row['batch_size']:>8,} {speed / 1e6:>12.2f} {gain:>8s} "
          f"{share:>13.1%} {speed / mine['limit_samples_per_s']:>11.1%}  "
          f"{mine['limit_samples_per_s'] / 1e6:,.0f} M ({mine['bound_by']})")
    below = speed
print(f"({source})")
fp32 = next(r for r in rows if r["rung"] == "resident")
fp32_own = own["resident"]
print(f"the fp32 rung '{fp32['rung']}' is held by {fp32_own['bound_by']} at "
      f"{fp32_own['limit_samples_per_s'] / 1e6:,.0f} M samples/s and reaches "
      f"{fp32['samples_per_s'] / fp32_own['limit_samples_per_s']:.0%} of it; the memory bound "
      f"of the same data is {fp32_own['memory_bound_samples_per_s'] / 1e6:,.0f} M")
assert fp32_own["limit_samples_per_s"] <= limit["memory_bound_samples_per_s"]

# %%
labels = [f"{r['rung']}\n{r['batch_size']:,}" for r in rows]
speeds = [r["samples_per_s"] / 1e6 for r in rows]
figure, axes = plt.subplots(figsize=(9, 4))
axes.bar(labels, speeds, color="tab:blue")
axes.axhline(limit["limit_samples_per_s"] / 1e6, color="tab:red", linestyle="--",
             label=f"limit ({limit['bound_by']})")
axes.set_yscale("log")
axes.set_ylabel("M samples/s (log)")
axes.set_title(f"The ladder ({source})")
axes.legend()
figure.tight_layout()
figure.savefig(scratch / "ladder.png", dpi=90)
plt.close(figure)
display(Image(filename=str(scratch / "ladder.png")))

# %% [markdown]
# What the ladder says, computed from its own rows:

# %%
gains = {rows[i]["rung"]: rows[i]["samples_per_s"] / rows[i - 1]["samples_per_s"]
         for i in range(1, len(rows)) if rows[i]["batch_size"] == rows[0]["batch_size"]}
biggest = max(gains, key=gains.get)
losing = [name for name, gain in gains.items() if gain < 1]
best = max(rows, key=lambda r: r["samples_per_s"])
print(f"the largest single gain: {biggest} ({gains[biggest]:.1f}x the rung below)")
print("rungs that made it slower here: " + (", ".join(losing) or "none"))
print(f"the best rung: {best['rung']} at batch {best['batch_size']:,}, "
      f"{best['samples_per_s'] / 1e6:.1f} M samples/s, "
      f"{best['samples_per_s'] / limit['limit_samples_per_s']:.1%} of the limit")
limit_step_s = best["batch_size"] / limit["limit_samples_per_s"]
best_step_s = best["batch_size"] / best["samples_per_s"]
print(f"a step of {best['batch_size']:,} samples: {best_step_s * 1e3:.2f} ms measured, "
      f"{limit_step_s * 1e3:.2f} ms if every input were read once and nothing else "
      f"took time ({best_step_s / limit_step_s:.0f}x)")
assert best["samples_per_s"] < limit["limit_samples_per_s"]  # no rung beats the limit

# %% [markdown]
# Why so far from the limit? The limit reads each input once. The step reads and writes
# it several times over: the gather writes a copy of the batch, the in-place
# normalisation reads and writes it, autocast writes a bf16 copy, the first layer's matmul
# reads it and its weight gradient reads it again. And at this model's widths the
# kernels are small for a GPU: the largest gains come from what removes work around them
# (copies from the host, Python and launches), not from faster arithmetic. The
# `bf16-store` rung takes out the normalisation's and the cast's passes over the batch and
# halves the bytes the gather and the first layer read; the gather fused into the first
# layer, which would read each input once, is not built.
#
# ## The rungs a CPU can run
#
# Autocast, the fused optimizer and `torch.compile` exist on a CPU too (host copies and
# CUDA graphs do not). The cell runs them on this machine, on a small dataset, and checks
# the ladder's other promise: every rung trains the same model — its first loss within
# bf16's rounding of the eager fp32 loop's, its loss after training within the stated
# spread (bf16 moves the path, not what is learnt).

# %%
cpu = torch.device("cpu")
small = prepare(SyntheticSource(2048, seed=3, levels=10), scratch / "cpu-data", shard_size=1024)
cpu_rungs = [r for r in RUNGS if not r.needs_cuda and not r.compile]
if not quick():
    cpu_rungs.append(COMPILE_ALONE)  # its compile takes tens of seconds on 2 cores
on_cpu = {r.name: ladder.run_rung(limit_setup(small, 128, cpu, 42), r, 128, 40, cpu)
          for r in cpu_rungs}
first = on_cpu["resident"]
for name, row in on_cpu.items():
    print(f"{name:<14s} {row['samples_per_s']:>10,.0f} samples/s, first loss "
          f"{row['train_losses'][0]:.5f}, val_loss {row['val_loss']:.5f}, untimed set-up "
          f"{row['setup_s']:.1f} s")
    assert abs(row["train_losses"][0] / first["train_losses"][0] - 1) <= \
        ladder.FIRST_LOSS_TOLERANCE, name
    assert abs(row["val_loss"] / first["val_loss"] - 1) <= ladder.TRAINED_LOSS_TOLERANCE, name

# %% [markdown]
# The `bf16-store` rung's promise — the same training, only faster — can be checked on a
# CPU too: a bf16 step normalises its batch in float32 and autocast rounds the result to
# bf16 at the first layer; stored inputs are those same bf16 values, made once. The
# losses must agree to the last bit.

# %%
import dataclasses

stored_rung = dataclasses.replace(rung("bf16"), name="bf16-store (CPU)", bf16_store=True)
casting = on_cpu["bf16"]
stored = ladder.run_rung(limit_setup(small, 128, cpu, 42), stored_rung, 128, 40, cpu)
same = stored["train_losses"] == casting["train_losses"] and \
    stored["val_loss"] == casting["val_loss"]
print(f"{len(stored['train_losses'])} steps: losses of the stored inputs "
      f"{'identical to' if same else 'DIFFERENT from'} the casting rung's; "
      f"val_loss {stored['val_loss']:.6f} vs {casting['val_loss']:.6f}")
assert same

# %% [markdown]
# ## kosmoss at the top of the ladder
#
# The run path takes what the ladder found as flags of the training scripts: the data on
# the GPU (`--mode auto` puts it there when it fits), Adam's fused kernel on CUDA,
# several optimizer steps per step of Lightning's loop (`--steps-per-execution`), and
# `--compile` and `--cuda-graphs` — a chunk of steps replayed from one CUDA graph, each
# batch gathered inside it; with `--precision bf16-mixed` the replays gather from inputs
# stored in bf16, as the top rung does. `kosmoss bench --only ladder-bf16-store
# kosmoss-gpu-top` puts kosmoss beside the rung with the same features; docs/gpu.md says
# how far it got.

# %%
import subprocess

flags = subprocess.run([sys.executable, str(script("trainup_gpu.py")), "--help"],
                       capture_output=True, text=True).stdout
shown = [line for line in flags.splitlines() if "--cuda-graphs" in line or "--compile" in line]
print("\n".join(shown))
assert len(shown) >= 2

# %% [markdown]
# ## With a GPU
#
# Everything above runs live: the limits come from your GPU, the ladder runs on it, and
# the plot shows where your GPU stands. Try a batch larger than the ladder's: the step
# time grows less than the batch, until the GPU's memory traffic is what limits it.
#
# ## Exercises
#
# 1. Which bound would bind a model with much wider hidden layers? Compute its limit with
#    `ladder.sample_costs` and `ladder.bound`.
# 2. The `host` rung pins a fresh buffer every step. What would a data loader with
#    pinned-memory workers change, and what would stay?
#
# <details><summary>Solution</summary>
#
# ```python
# wide = ladder.sample_costs(schema.n_x, (1000, 1000, 1000), schema.n_y)
# print(ladder.bound(wide, limits))  # more arithmetic per byte: closer to compute-bound
# # 2. workers gather and pin ahead of the step, so the copy overlaps the previous step;
# #    the bytes still cross PCIe every step, far slower than the GPU's own memory.
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line),
# run it, then run the checker cell under it: it prints `correct` or what differs. From a
# terminal, `kosmoss check 08b` checks every exercise of this lesson in your saved
# notebook.

# %% [markdown]
# **The limit of one GPU for an MLP.**
#
# Write `sample_limit(n_x, hidden, n_y, bandwidth, peak_flops)` for an MLP with `n_x`
# inputs, hidden layers of the sizes in the list `hidden` and `n_y` outputs, trained with
# float32 data on a device that reads `bandwidth` bytes/s from its memory and computes
# `peak_flops` FLOP/s. A training step must at least read each sample's inputs and
# targets once, and do its arithmetic: the forward multiply-adds of every layer, and in
# backward every weight's gradient and every layer's input gradient except the first's (the
# data needs none); a multiply-add is two FLOP, biases left out. Return
# `(samples_per_s, bound)`: the samples/s of the slower of the two, and which one binds,
# `"memory"` or `"compute"`. The checker tries the course's model on an H100, a model
# wide enough to be bound by compute, a device with little bandwidth, and a model with no
# hidden layer (`hidden` empty).

# %%
# exercise: 08b.sample_limit
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    """(samples/s that neither memory nor arithmetic can beat, "memory" or "compute")."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("08b.sample_limit", globals())
