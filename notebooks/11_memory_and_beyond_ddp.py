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
# # Lesson 11 — Memory, and beyond data parallelism
#
# **What you will learn**
#
# - where the memory of a training step goes — parameters, gradients, Adam's two states,
#   and the activations autograd keeps for backward — computed for this model and for a
#   far larger one, and checked against what a real step allocates;
# - gradient accumulation: the step of a large batch, taken in micro-batches that fit;
# - what `bf16` mixed precision halves, and what it does not;
# - activation recomputation (`torch.utils.checkpoint`): the memory it saves and the time it
#   costs, measured at two batch sizes;
# - ZeRO-1 (stage one of ZeRO) with `torch.distributed.optim.ZeroRedundancyOptimizer`:
#   each rank keeps only its share of the optimizer state, and the weights stay DDP's;
# - FSDP (Lightning's `FSDPStrategy`) for the parameters and gradients too;
# - tensor parallelism by hand: the MLP's first layer split by columns and the next by
#   rows, on two and three gloo processes (Megatron-LM's pair: one all-reduce in
#   forward, one in backward), equal to the single-process layers, and its communication
#   counted against data parallelism's.
#
# Time: ~45 min; the cells run in ~1 min on 2 CPU cores

# %%
import copy
import gc
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from kosmoss.lessons import forked, on_ranks, scratch_folder
from kosmoss.model import mlp

scratch = scratch_folder("lesson11-")
N_X, HIDDEN, N_Y = 4128, (100, 100, 100), 552


def mib(nbytes):
    return f"{nbytes / 2**20:,.2f} MiB"



# %% [markdown]
# ## Where training memory goes
#
# One training step with Adam in float32 holds, for `P` parameters:
#
# | what | bytes | why |
# |---|---|---|
# | parameters | `4P` | the weights |
# | gradients | `4P` | one per weight, filled by backward |
# | Adam's states | `8P` | `exp_avg` and `exp_avg_sq`, one each per weight |
# | activations | `4 × A × batch` | what forward saves for backward, `A` numbers per sample |
#
# The first three do not depend on the batch: `16P` bytes. For an MLP, what forward saves
# per sample is the input, each hidden layer's output before and after its activation
# function (SiLU needs its input to compute its gradient), the prediction and the target:
# `A = n_x + 2 × (sum of the hidden widths) + 2 × n_y`. The cell computes both, then
# measures a real step: the sizes of the parameters, the gradients and the optimizer
# state after `optimizer.step()`, and every tensor autograd saved (through
# `torch.autograd.graph.saved_tensors_hooks`), the parameters themselves excepted.

# %%
def arithmetic(n_x, hidden, n_y, batch):
    params = sum(a * b + b for a, b in zip((n_x, *hidden), (*hidden, n_y)))
    per_sample = n_x + 2 * sum(hidden) + 2 * n_y
    return {"parameters": 4 * params, "gradients": 4 * params, "Adam states": 8 * params,
            "activations": 4 * per_sample * batch}


def measured_step(model, batch, autocast=False):
    """Bytes of one Adam step, by tensor sizes; on the meta device nothing is allocated."""
    device = next(model.parameters()).device
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    x = torch.randn(batch, linears[0].in_features, device=device)
    y = torch.randn(batch, linears[-1].out_features, device=device)
    params = {id(p) for p in model.parameters()}
    saved = {}

    def pack(tensor):
        base = tensor._base if tensor._base is not None else tensor
        if id(base) not in params:  # a weight (or its transpose) is not an activation
            key = id(tensor) if tensor.is_meta else tensor.untyped_storage().data_ptr()
            saved[key] = (tuple(tensor.shape), tensor.dtype, tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cuda" if device.type == "cuda" else "cpu", dtype=torch.bfloat16,
                            enabled=autocast):
            out = model(x)
        torch.nn.functional.mse_loss(out.float(), y).backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    return {"parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
            "gradients": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()),
            "Adam states": sum(v.numel() * v.element_size() for s in optimizer.state.values()
                               for name, v in s.items() if name != "step"),
            "activations": sum(nbytes for _, _, nbytes in saved.values()),
            "saved": list(saved.values())}


BATCH = 256
computed = arithmetic(N_X, HIDDEN, N_Y, BATCH)
torch.manual_seed(0)
measured = forked(measured_step, mlp(N_X, HIDDEN, N_Y), BATCH)  # as every step of this lesson
for part in computed:
    print(f"{part:>12}: computed {mib(computed[part]):>12}, measured {mib(measured[part]):>12}")
    assert computed[part] == measured[part], part
total = sum(computed.values())
print(f"{'total':>12}: {mib(total)} at batch {BATCH}; "
      f"activations per sample {computed['activations'] / BATCH / 1024:.1f} KiB")

# %% [markdown]
# Every line matches to the byte. For this model all of it is a few MiB: memory is not
# what limits it, on any device (past a batch size the first exercise computes, the
# activations are the larger part). Now a far larger model — `SCALE` times the
# parameters, printed below; the same shape, wider hidden layers. The cell finds the
# width, builds the model on PyTorch's **meta** device (tensors with a shape and a dtype
# but no storage: nothing is allocated), and runs the same measured step on it.

# %%
params_small = computed["parameters"] // 4
SCALE = 1000  # how many times the parameters of the course's model
width = 100
while sum(a * b + b for a, b in zip((N_X, width, width, width), (width, width, width, N_Y))) \
        < SCALE * params_small:
    width += 1
big_hidden = (width,) * 3


def step_on_meta(hidden):
    # The model only: torch 2.11's Adam makes its step counter on the default device, and a
    # step counter on meta cannot be read (torch 2.13 puts it on the CPU whatever the default).
    with torch.device("meta"):
        model = mlp(N_X, hidden, N_Y)
    return measured_step(model, BATCH)


big_computed = arithmetic(N_X, big_hidden, N_Y, BATCH)
big_measured = forked(step_on_meta, big_hidden)
params_big = big_computed["parameters"] // 4
print(f"hidden width {width}: {params_big:,} parameters, {params_big / params_small:.0f}x")
for part in big_computed:
    print(f"{part:>12}: computed {mib(big_computed[part]):>14}, measured on meta "
          f"{mib(big_measured[part]):>14}")
    assert big_computed[part] == big_measured[part], part
fixed_big = 16 * params_big
print(f"parameters + gradients + Adam: {fixed_big / 2**30:.1f} GiB, whatever the batch; "
      f"activations {big_computed['activations'] / BATCH / 2**10:.0f} KiB per sample")

# %% [markdown]
# Scaling the parameters by `SCALE` scales the fixed part by as much; the activations
# per sample grow only with the widths. A model that size trains on one large GPU, but
# its `16P` bytes no longer leave room for much else on a small one: this is where the
# rest of the lesson starts.
#
# ## Gradient accumulation: a large batch on a small device
#
# Backward **adds** into `.grad`. Run the model on `k` slices of the batch, call backward
# on each slice's loss divided by `k`, and only then step: the gradient is that of the
# whole batch (the mean over the batch is the mean of the slices' means), while only one
# slice's activations are alive at a time. Lightning does it with
# `Trainer(accumulate_grad_batches=k)`, and under DDP it skips the all-reduce of the
# micro-batches that do not end in a step (`DDP.no_sync`, through the strategy's
# `block_backward_sync`).

# %%
MICRO = 4
torch.manual_seed(1)
x, y = torch.randn(BATCH, N_X), torch.randn(BATCH, N_Y)
torch.manual_seed(0)
whole = mlp(N_X, HIDDEN, N_Y)


def accumulation_gap(whole, x, y):
    """The largest gradient difference between one batch and MICRO accumulated slices."""
    accumulated = copy.deepcopy(whole)  # the same weights
    torch.nn.functional.mse_loss(whole(x), y).backward()
    for x_part, y_part in zip(x.chunk(MICRO), y.chunk(MICRO)):
        (torch.nn.functional.mse_loss(accumulated(x_part), y_part) / MICRO).backward()
    return max((a.grad - b.grad).abs().max().item()
               for a, b in zip(whole.parameters(), accumulated.parameters()))


gap = forked(accumulation_gap, whole, x, y)
slice_activations = forked(measured_step, copy.deepcopy(whole), BATCH // MICRO)["activations"]
print(f"gradient of {MICRO} micro-batches of {BATCH // MICRO} vs one batch of {BATCH}: "
      f"largest difference {gap:.1e}")
print(f"activations alive at once: {mib(slice_activations)} instead of "
      f"{mib(computed['activations'])}")
assert gap < 1e-6 and slice_activations * MICRO == computed["activations"]

# %% [markdown]
# The price is time: `k` forward and backward passes of a smaller batch, each using the
# device less well. Accumulation changes the *effective* batch, not the number of samples
# per second — and with it the learning rate questions of lesson 4.
#
# ## bf16: what it halves
#
# `bfloat16` keeps float32's exponent range with fewer bits of mantissa: two bytes a
# number. With `--precision bf16-mixed` (Lightning's `MixedPrecision`, `torch.autocast`)
# the matrix products run in bf16, so their outputs — the activations — take two bytes a
# number instead of four. The parameters, the gradients and Adam's states stay float32:
# mixed precision halves the activations, not the `16P`. Autocast also keeps a bf16 copy of each weight
# it multiplies by, for backward. The measurement, the same step with autocast (on CPU
# too: bf16 is a CPU type as well):

# %%
torch.manual_seed(0)
mixed = forked(measured_step, mlp(N_X, HIDDEN, N_Y), BATCH, True)  # autocast
per_batch = [s for s in mixed["saved"] if s[0][0] == BATCH]
copies = [s for s in mixed["saved"] if s[0][0] != BATCH]
batch_bf16 = sum(n for _, dtype, n in per_batch if dtype == torch.bfloat16)
batch_fp32 = sum(n for _, dtype, n in per_batch if dtype == torch.float32)
print(f"fp32 step: activations {mib(measured['activations'])}")
print(f"bf16-mixed: activations {mib(batch_bf16 + batch_fp32)} ({mib(batch_bf16)} in bf16, "
      f"{mib(batch_fp32)} in float32: the loss's prediction and target), plus "
      f"{mib(sum(n for *_, n in copies))} of bf16 weight copies")
for part in ("parameters", "gradients", "Adam states"):
    assert mixed[part] == measured[part], part
expected_bf16 = 2 * BATCH * (N_X + 2 * sum(HIDDEN))
assert batch_bf16 == expected_bf16 and batch_fp32 == 4 * BATCH * 2 * N_Y
print(f"activations bf16-mixed / fp32: {(batch_bf16 + batch_fp32) / measured['activations']:.2f}")

# %% [markdown]
# With Lightning's `bf16-true` (the weights themselves in bf16) the parameters, the gradients
# and Adam's states (made like the parameters) halve too, at the cost of precision in the
# weights' updates; optimizers that keep a float32
# master copy of the weights give part of that back.

# %% [markdown]
# ## Activation recomputation: memory for time
#
# Autograd keeps what backward needs (the first section counted it). *Activation
# recomputation* — gradient checkpointing (Chen et al., 2016) — keeps only the input of
# each checkpointed block and runs the block's forward again during backward: the
# activations inside a block are alive one block at a time, for one more forward pass of
# it. In PyTorch it is `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`.
# Here each hidden layer (its `Linear` and its SiLU) is one block: what it no longer keeps
# is the SiLU's input, `4 × (sum of the hidden widths)` bytes a sample. The cell measures
# one step's peak memory — from the profiler's record of every allocation of the CPU
# allocator (`torch.profiler.profile(profile_memory=True)`; on a GPU,
# `torch.cuda.max_memory_allocated`), above what was allocated before the step — and its
# time (the median of a few steps), with and without, at two batch sizes.

# %%
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint


class Recomputed(torch.nn.Module):
    """The MLP, its hidden layers (Linear and SiLU each) recomputed during backward."""

    def __init__(self, net):
        super().__init__()
        layers = list(net)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(*layers[i:i + 2])
                                          for i in range(0, len(layers) - 1, 2))
        self.last = layers[-1]

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.last(x)


def peak_bytes(model, x, y):
    """The most bytes the CPU allocator held during one step, above what it held before."""
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        torch.nn.functional.mse_loss(model(x), y).backward()
    trace = scratch / "memory-trace.json"
    recorded.export_chrome_trace(str(trace))
    events = sorted((e for e in json.loads(trace.read_text())["traceEvents"]
                     if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    before = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in events) - before


def one_step_s(model, x, y):
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return time.perf_counter() - started


def paired_steps(first, second, x, y, repeats):
    """Median step of each, and the median of their ratio over steps taken in turn (a
    machine that slows down for a while slows both sides of a pair)."""
    one_step_s(first, x, y), one_step_s(second, x, y)  # a first step pays one-off set-ups
    pairs = [(one_step_s(first, x, y), one_step_s(second, x, y)) for _ in range(repeats)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(b / a for a, b in pairs))


REPEATS = 15  # pairs of steps: a few seconds, quick mode or not


def recomputation_trade(kept):
    """Peak memory and step time, kept and recomputed, at two batch sizes."""
    recomputed = Recomputed(kept)  # the same layers, the same weights
    trade = {}
    for batch in (BATCH, 8 * BATCH):
        xb, yb = torch.randn(batch, N_X), torch.randn(batch, N_Y)
        grads = []
        for net in (kept, recomputed):
            net.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            grads.append(torch.cat([p.grad.flatten() for p in kept.parameters()]))
        assert float((grads[0] - grads[1]).abs().max()) <= 1e-6 * float(grads[0].abs().max()), \
            "recomputation must not change the gradients"
        step_kept, step_recomputed, ratio = paired_steps(kept, recomputed, xb, yb, REPEATS)
        row = {"kept": peak_bytes(kept, xb, yb), "recomputed": peak_bytes(recomputed, xb, yb),
               "step_kept": step_kept, "step_recomputed": step_recomputed, "added": ratio - 1,
               "arithmetic": 4 * batch * sum(HIDDEN)}
        row["saved"] = row["kept"] - row["recomputed"]
        trade[batch] = row
    return trade


torch.manual_seed(0)
trade = forked(recomputation_trade, mlp(N_X, HIDDEN, N_Y))
for batch, row in trade.items():
    print(f"batch {batch:>5}: peak {mib(row['kept'])} kept, {mib(row['recomputed'])} "
          f"recomputed: {mib(row['saved'])} saved ({row['saved'] / row['kept']:.0%} of the "
          f"peak; the SiLU inputs are {mib(row['arithmetic'])}); step "
          f"{row['step_kept'] * 1e3:.1f} -> {row['step_recomputed'] * 1e3:.1f} ms "
          f"({row['added']:+.0%}, the median of {REPEATS} pairs)")
large = trade[8 * BATCH]
assert abs(large["saved"] - large["arithmetic"]) <= 0.1 * large["arithmetic"], \
    "at the large batch the peak falls by the SiLU inputs recomputation no longer keeps"

# %% [markdown]
# The cell below reads the trade from the measurements: what share of a step's peak the
# recomputation gives back, for what share of time more — beside the time it should add,
# counted in multiply-adds: one more forward pass of the hidden layers, against a step's
# forward and backward (backward costs two forwards, less the input's gradient, which no
# layer needs).

# %%
gradient_bytes = computed["gradients"]
widths = (N_X, *HIDDEN, N_Y)
macs_forward = sum(a * b for a, b in zip(widths, widths[1:]))
macs_recomputed = sum(a * b for a, b in zip(widths[:-2], widths[1:-1]))
expected_added = macs_recomputed / (3 * macs_forward - N_X * HIDDEN[0])
print(f"the recomputed forward is {expected_added:.0%} of a step's multiply-adds")
for batch, row in trade.items():
    share, gradient_share = row["saved"] / row["kept"], gradient_bytes / row["kept"]
    if row["saved"] < row["arithmetic"] / 2:
        verdict = (f"gives back {mib(max(row['saved'], 0))} of the {mib(row['arithmetic'])} it "
                   f"stops keeping; the gradients alone are {gradient_share:.0%} of the peak: "
                   "at this batch the activations are not what sets it, and the recomputation "
                   f"costs {row['added']:+.0%} of the step for nothing")
    else:
        verdict = (f"gives back {share:.0%} of the peak ({mib(row['saved'])}) for "
                   f"{row['added']:+.0%} of the step (the multiply-adds say "
                   f"{expected_added:+.0%}); the gradients are {gradient_share:.0%} of the peak")
    print(f"batch {batch:>5}: recomputation {verdict}")
assert all(row["saved"] <= 1.1 * row["arithmetic"] for row in trade.values()), \
    "recomputation cannot give back more than what it stops keeping"
print(f"what the hidden layers keep is {sum(HIDDEN) / (N_X + 2 * sum(HIDDEN) + 2 * N_Y):.0%} "
      "of what a sample's activations hold: the input column and the fluxes are the rest, "
      "and no checkpoint of a hidden layer removes them")

# %% [markdown]
# ## ZeRO-1: each rank keeps its share of the optimizer state
#
# Under DDP every rank holds the same Adam states: with `N` ranks, `N` copies of `8P`
# bytes. ZeRO-1, the first stage of ZeRO (Rajbhandari et al., 2020), shards them: each
# rank updates only its share of the parameters, with the states of that share, and then
# broadcasts them, so all ranks end with the same weights. PyTorch's
# `ZeroRedundancyOptimizer` wraps any optimizer that way. Two gloo ranks, DDP with Adam and DDP with
# `ZeroRedundancyOptimizer(Adam)`, three steps each from the same start on the same
# data; then the same with a model made of eight equal layers.


# %%
def state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for name, v in s.items() if name != "step")


def ddp_versus_zero(rank, world_size, port):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    models = {"MLP": lambda: mlp(N_X, HIDDEN, N_Y),
              "8 equal layers": lambda: torch.nn.Sequential(
                  *[torch.nn.Linear(256, 256) for _ in range(8)])}
    report = {}
    for name, build in models.items():
        weights, kept = {}, {}
        for kind in ("Adam", "ZeRO-1"):
            torch.manual_seed(0)
            net = build()
            ddp = DistributedDataParallel(net)
            if kind == "Adam":
                optimizer = local = torch.optim.Adam(ddp.parameters(), lr=1e-3)
            else:
                optimizer = ZeroRedundancyOptimizer(ddp.parameters(),
                                                    optimizer_class=torch.optim.Adam, lr=1e-3)
                local = optimizer.optim  # the Adam of this rank's share
            data = torch.Generator().manual_seed(rank)
            for _ in range(3):
                x = torch.randn(32, net[0].in_features, generator=data)
                y = torch.randn(32, net[-1].out_features, generator=data)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                optimizer.step()
            weights[kind] = torch.cat([p.detach().flatten() for p in net.parameters()])
            kept[kind] = state_bytes(local)
        report[name] = {"kept": kept, "largest": max(p.numel() for p in build().parameters()),
                        "difference": (weights["Adam"] - weights["ZeRO-1"]).abs().max().item()}
    (scratch / f"zero-rank{rank}.json").write_text(json.dumps(report))
    del ddp, optimizer, local  # DDP before its group (lesson 9 says why)
    gc.collect()
    dist.destroy_process_group()


on_ranks(ddp_versus_zero, 2)  # forked from this kernel, one OpenMP thread each (lesson 3)
zero = [json.loads((scratch / f"zero-rank{r}.json").read_text()) for r in range(2)]
for name in zero[0]:
    full = zero[0][name]["kept"]["Adam"]
    shares = [r[name]["kept"]["ZeRO-1"] for r in zero]
    print(f"{name}: Adam state per rank {mib(full)} with DDP; with ZeRO-1 rank 0 "
          f"{mib(shares[0])} ({shares[0] / full:.0%}), rank 1 {mib(shares[1])} "
          f"({shares[1] / full:.0%}); weights vs DDP's: largest difference "
          f"{max(r[name]['difference'] for r in zero):.1e}")
    assert sum(shares) == full and max(r[name]["difference"] for r in zero) == 0.0
equal = [r["8 equal layers"]["kept"]["ZeRO-1"] for r in zero]
assert equal[0] == equal[1] == zero[0]["8 equal layers"]["kept"]["Adam"] // 2
mlp_share = max(r["MLP"]["kept"]["ZeRO-1"] for r in zero) / zero[0]["MLP"]["kept"]["Adam"]
print(f"the MLP's largest rank keeps {mlp_share:.0%} of the state: its first layer's weight, "
      f"{zero[0]['MLP']['largest']:,} of {params_small:,} parameters, cannot be split")

# %% [markdown]
# The weights are bit for bit those of DDP with Adam: the same updates, computed once
# instead of on every rank. The states are halved exactly for the model of equal layers.
# For this MLP they are not: `ZeroRedundancyOptimizer` gives **whole parameters** to the
# ranks (largest first, each to the rank with the least so far), and the first layer's
# weight is most of the model. DeepSpeed's ZeRO and PyTorch's first FSDP flatten the
# parameters into one buffer and cut it evenly; FSDP2 (`fully_shard`) cuts every
# parameter along its first dimension, so each rank holds a slice of each — evenly
# spread too, whatever the sizes of the layers.
#
# ## FSDP: the parameters and gradients too
#
# ZeRO-2 also shards the gradients (each rank keeps the reduced gradients of its share:
# a reduce-scatter instead of an all-reduce), and ZeRO-3 — PyTorch's **Fully Sharded
# Data Parallel** — the parameters themselves: each layer's weights are all-gathered just
# before its forward and backward, and freed after. Per rank, the `16P` bytes become
# about `16P / N`, for more communication than DDP's (an all-gather of the parameters in
# forward and again in backward, and a reduce-scatter of the gradients). In Lightning it is
# `Trainer(strategy=FSDPStrategy(...))`. The cell runs only on a machine with a GPU, the
# setting FSDP is made for: a short FSDP run of the MLP, with
# `torch.cuda.max_memory_allocated` on each rank, and a plain step's peak against the
# arithmetic. This course has no recorded result of it yet.

# %%
import textwrap

from kosmoss.lessons import sh

gpus = torch.cuda.device_count()  # asks NVML first: no CUDA initialised where NVML answers
if gpus:
    fsdp_script = scratch / "fsdp_run.py"
    fsdp_script.write_text(textwrap.dedent(f"""
        import json, sys, torch, pytorch_lightning as pl
        from pytorch_lightning.strategies import FSDPStrategy
        from kosmoss.model import mlp

        class Net(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = mlp({N_X}, {HIDDEN}, {N_Y})
            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)
            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=1e-3)

        data = torch.utils.data.TensorDataset(torch.randn(4096, {N_X}), torch.randn(4096, {N_Y}))
        trainer = pl.Trainer(accelerator="gpu", devices={min(gpus, 2)}, max_steps=10,
                             strategy=FSDPStrategy(), logger=False, enable_checkpointing=False,
                             enable_progress_bar=False)
        trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size={BATCH}))
        print(json.dumps({{"rank": trainer.global_rank,
                           "max_memory_allocated": torch.cuda.max_memory_allocated()}}))
    """))
    sh([sys.executable, fsdp_script])

    def plain_step_on_gpu():
        torch.manual_seed(0)
        on_gpu = mlp(N_X, HIDDEN, N_Y).cuda()
        torch.cuda.reset_peak_memory_stats()
        measured_step(on_gpu, BATCH)
        return torch.cuda.max_memory_allocated()

    peak = forked(plain_step_on_gpu)  # CUDA starts there, never in the kernel
    print(f"one GPU, plain Adam step: max_memory_allocated {mib(peak)}"
          f", arithmetic {mib(total)} (plus the batch itself and the allocator's rounding)")
else:
    print("no GPU here: the FSDP run and torch.cuda.max_memory_allocated are skipped")

# %% [markdown]
# ## With a GPU
#
# Everything above holds on a GPU, where memory is scarcer: `torch.cuda.max_memory_allocated`
# measures the step (the cell above), bf16 runs on the tensor cores, and FSDP needs one GPU
# per rank. The arithmetic does not change; the device's memory sets which line of it
# matters first.
#
# ## When data parallelism is not enough
#
# Every method so far keeps a whole layer's computation on one device. When one layer's
# weights or activations do not fit, or the batch per device cannot shrink any more,
# the model itself is cut:
#
# ```
#  data parallel (DDP, ZeRO, FSDP)      tensor parallel                pipeline parallel
#  the batch is split                   each layer is split            the layers are split
#
#  GPU0: [L1 L2 L3 L4] ← batch 0       GPU0: [L1a L2a L3a L4a]        GPU0: [L1 L2] → GPU1: [L3 L4]
#  GPU1: [L1 L2 L3 L4] ← batch 1       GPU1: [L1b L2b L3b L4b]          micro-batches flow through
#   all-reduce of the gradients         all-reduce inside every         the stages; "bubbles" when
#   once per step                       layer, every step: needs        a stage waits for the one
#                                       NVLink-class links              before it
# ```
#
# *Model parallelism* is the general name for cutting the model; **tensor parallelism**
# (Megatron-LM) splits each matrix product across devices within a node, **pipeline
# parallelism** (GPipe) puts consecutive layers on consecutive devices. Large trainings
# combine all three with data parallelism ("3D parallelism").
#
# ## Tensor parallelism by hand: Megatron's pair of layers
#
# Megatron-LM (Shoeybi et al., 2019) splits an MLP's two layers so that they need one
# all-reduce in forward and one in backward. The first layer is split **by columns** (its
# output features): rank `r` holds the rows of `W₁` and `b₁` for its slice of the hidden
# features and computes that slice, `SiLU` included — an elementwise function needs no
# other rank's features. The second layer is split **by rows** (its input features): rank
# `r` holds the columns of `W₂` for the same slice, and its product with its slice of the
# hidden features is a *partial* output; the partial outputs add up to the whole, so one
# all-reduce gives every rank the layer's output, to which the bias is added once.
#
# ```
#          x (every rank)          column-parallel            row-parallel
#   f ───► x ─┬─► [W₁ rows of r0] ─► h_r0 ─► [W₂ cols of r0] ─► partial_r0 ─┐
#             └─► [W₁ rows of r1] ─► h_r1 ─► [W₂ cols of r1] ─► partial_r1 ─┴─ g: all-reduce
# ```
#
# In backward the roles swap: `g` passes the output's gradient to every rank as it is
# (each rank holds the same loss), and each rank's gradient of `x` is only its columns'
# part, so `f` all-reduces it. Two `torch.autograd.Function`s carry that. The cell runs
# the MLP's first two layers that way on two and three gloo processes (the hidden
# features do not divide by three: the slices it prints are uneven), counts every
# all-reduce and its elements, and compares the output and every gradient with the
# single-process layers.

# %%
import psutil
import torch.nn.functional as F


class CopyToRanks(torch.autograd.Function):
    """Megatron's f: forward, the input as it is; backward, the sum over the ranks of its
    gradient (each rank's columns give a part of it)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: forward, the sum of the ranks' partial outputs; backward, the gradient
    as it is. (torch.distributed.nn.functional.all_reduce all-reduces the gradient in
    backward too, as if the ranks' losses added up: its _AllReduce.backward; here every
    rank holds the same loss.)"""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def pair_problem(batch, dtype=torch.float32):
    """The MLP's first two layers (the course's seed), an input and a target."""
    torch.manual_seed(0)
    net = mlp(N_X, HIDDEN, N_Y).to(dtype)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(batch, N_X, generator=data).to(dtype)
    target = torch.randn(batch, HIDDEN[1], generator=data).to(dtype)
    return net[0], net[2], x, target


def pair_loss(first, second, x, target):
    return F.mse_loss(F.silu(second(F.silu(first(x)))), target)


def tensor_parallel_pair(rank, world_size, port, batch):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    first, second, x, target = pair_problem(batch)
    mine = torch.tensor_split(torch.arange(HIDDEN[0]), world_size)[rank]
    w1 = first.weight[mine].detach().clone().requires_grad_()  # rows: this rank's outputs
    b1 = first.bias[mine].detach().clone().requires_grad_()
    w2 = second.weight[:, mine].detach().clone().requires_grad_()  # the same features
    b2 = second.bias.detach().clone().requires_grad_()
    x.requires_grad_()  # a layer before this pair would need its gradient
    calls, phase, original = [], ["forward"], dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append((phase[0], tensor.numel()))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        hidden = F.silu(F.linear(CopyToRanks.apply(x), w1, b1))  # column-parallel: no message
        out = SumOverRanks.apply(F.linear(hidden, w2)) + b2  # row-parallel: one all-reduce
        loss = F.mse_loss(F.silu(out), target)
        phase[0] = "backward"
        loss.backward()
    finally:
        dist.all_reduce = original
    torch.save({"out": out.detach(), "loss": loss.item(), "calls": calls, "mine": mine,
                "x": x.grad, "w1": w1.grad, "b1": b1.grad, "w2": w2.grad, "b2": b2.grad},
               scratch / f"tp-{world_size}-rank{rank}.pt")
    dist.destroy_process_group()


def single_process(dtype):
    first, second, x, target = pair_problem(BATCH, dtype)
    x.requires_grad_()
    out = F.silu(first(x))
    out = second(out)
    F.mse_loss(F.silu(out), target).backward()
    return {"out": out.detach(), "x": x.grad, "w1": first.weight.grad, "b1": first.bias.grad,
            "w2": second.weight.grad, "b2": second.bias.grad}


exact, single = forked(single_process, torch.float64), forked(single_process, torch.float32)
# 8 times the float32 layers' own distance from float64 (the ranks sum in another order),
# and at least 8 float32 roundings of the largest value.
tolerance = {k: 8 * float((single[k].double() - exact[k]).abs().max())
             + 8 * 2**-24 * float(exact[k].abs().max()) for k in exact}
tensor_parallel = {}
for world_size in (2, 3):
    on_ranks(tensor_parallel_pair, world_size, BATCH)
    ranks = [torch.load(scratch / f"tp-{world_size}-rank{r}.pt") for r in range(world_size)]
    parts = {"out": lambda r: exact["out"], "x": lambda r: exact["x"], "b2": lambda r: exact["b2"],
             "w1": lambda r: exact["w1"][r["mine"]], "b1": lambda r: exact["b1"][r["mine"]],
             "w2": lambda r: exact["w2"][:, r["mine"]]}
    gaps = {k: max(float((r[k].double() - want(r)).abs().max()) for r in ranks)
            for k, want in parts.items()}
    assert all(gaps[k] <= tolerance[k] for k in gaps), (world_size, gaps, tolerance)
    calls = ranks[0]["calls"]
    assert calls == [("forward", BATCH * HIDDEN[1]), ("backward", BATCH * N_X)], calls
    tensor_parallel[world_size] = {"calls": calls, "slices": [len(r["mine"]) for r in ranks]}
    print(f"{world_size} ranks, hidden features {tensor_parallel[world_size]['slices']}: output "
          f"and every gradient equal to the single-process layers (largest gap "
          f"{max(gaps.values()):.1e}); all-reduces per step: " + ", ".join(
              f"{phase} {numel:,} elements" for phase, numel in calls))

# %% [markdown]
# Both all-reduces carry activations, not weights: the forward one the batch's hidden
# features, the backward one the batch's input gradient. So the pair's communication
# grows with the batch, while data parallelism all-reduces the gradients of every
# parameter, whatever the batch. A ring moves `2(n-1)/n` of each buffer per rank in both
# cases (lesson 9), so the comparison is of the buffers. The cell counts both per step at
# this lesson's batch, and where they cross.

# %%
params = params_small  # the course's MLP, from the first section
tp_bytes = {phase: 4 * numel for phase, numel in tensor_parallel[2]["calls"]}
dp_bytes = 4 * params
crossover = params / (HIDDEN[1] + N_X)  # columns a step where the pair's buffers equal DP's
forward_only = params / HIDDEN[1]  # ... when the pair is the first and x needs no gradient
print(f"per step at a batch of {BATCH}: tensor parallelism of the pair all-reduces "
      f"{mib(tp_bytes['forward'])} in forward and {mib(tp_bytes['backward'])} in backward; "
      f"data parallelism all-reduces {mib(dp_bytes)} of gradients for the whole model")
print(f"the pair's buffers pass data parallelism's above {crossover:,.0f} columns a step "
      f"({forward_only:,.0f} without the input's gradient, which the model's first layer "
      "does not need)")
# The course's pair is its first two layers: their input is the data, whose gradient no
# layer needs, so split there the pair all-reduces in forward only.
course_tp = tp_bytes["forward"]
fewer = "tensor parallelism" if course_tp < dp_bytes else "data parallelism"
print(f"for this {params:,}-parameter model at a batch of {BATCH}, split at its first two "
      f"layers: {fewer} all-reduces fewer bytes a step ({mib(course_tp)} against "
      f"{mib(dp_bytes)}); tensor parallelism's sits in forward, where no backward can hide it")
state, memory = 16 * params, psutil.virtual_memory().total
needs = "nothing needs splitting" if state < 0.01 * memory else "splitting the model pays"
print(f"what tensor parallelism splits, the weights with their gradients and Adam states, is "
      f"{mib(state)} in all, {state / memory:.3%} of this machine's memory: {needs}")
assert sum(tp_bytes.values()) == 4 * BATCH * (HIDDEN[1] + N_X)

# %% [markdown]
# Tensor parallelism pays where a layer's weights or activations do not fit one device
# and the devices are joined by links fast enough for an all-reduce inside every layer
# pair, in forward and in backward, on the critical path: nothing overlaps it, where
# DDP's buckets can overlap backward (lesson 9b measures how much). That is NVLink inside
# a node — and a model far larger than this one.
#
# ## Exercises
#
# 1. Run `measured_step` at a batch of one and at a large one: at which batch do the
#    activations pass the batch-independent part for this model?
# 2. In `ddp_versus_zero`, build `ZeroRedundancyOptimizer` with `parameters_as_bucket_view=True`.
#    Does the split of the MLP's state change, and why (or why not)?
# 3. With `N` ranks, how many bytes per rank does each ZeRO stage keep for the
#    `SCALE` times larger model (Adam, float32)?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. 16P = 7.8 MB; activations are 23,328 bytes a sample: from about 336 samples on.
# print(16 * params_small / (computed["activations"] / BATCH))
# # 2. No: bucket views change how the parameters are stored for the broadcasts, not how
# #    they are assigned to ranks (whole parameters, greedily by size).
# # 3. ZeRO-1: 4P + 4P + 8P/N; ZeRO-2: 4P + (4P + 8P)/N; ZeRO-3 (FSDP): 16P/N,
# #    plus the activations and the layer being gathered.
# for n in (2, 8, 64):
#     print(n, (8 + 8 / n) * params_big / 2**30, (4 + 12 / n) * params_big / 2**30,
#           16 * params_big / n / 2**30)
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 11` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Take one optimizer step on a large batch from micro-batches (gradient accumulation).**
#
# Write `accumulated_step(model, optimizer, x, y, micro_batches)`. It must take exactly the
# optimizer step that one forward and backward of the mean-squared-error loss on the whole
# batch `(x, y)` followed by `optimizer.step()` would take — but run the model on
# `micro_batches` slices of the batch, one after the other, so that only one slice's
# activations are in memory at a time. The slices are as equal as `torch.tensor_split`
# makes them: when the batch does not divide, some are one column longer, so weigh each
# slice by its share of the batch. The gradients may still hold the previous step's:
# zero them first. The checker compares your weights after the step with the full
# batch's (plain SGD, so that any scale error shows) to float32 rounding, and watches the
# size of every forward pass and every call of `optimizer.step`.

# %%
# exercise: 11.accumulate
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    """One optimizer step on (x, y), computed in micro_batches slices."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("11.accumulate", globals())

# %% [markdown]
# **Write a ZeRO-1 optimizer step: each rank keeps and updates only its share.**
#
# Write `zero1_step(params, state, lr)`. It is called on every rank after backward, when
# every parameter's `.grad` already holds the gradient averaged over the ranks (DDP did
# that), so all ranks hold the same parameters and gradients. It must apply SGD with
# momentum `0.9` — for each parameter, `buf = 0.9 * buf + grad` (`buf` starts at zero),
# then `param -= lr * buf` — but sharded as ZeRO stage 1 does: parameter `i` of `params`
# belongs to rank `i % world_size` (`params` come sorted by size, largest first, so that
# this spreads the bytes); a rank keeps the momentum buffers of its own
# parameters only (in `state`, a dict you fill, kept between calls), updates only those,
# and then every parameter is broadcast from the rank that owns it, so that all ranks end
# with the same weights. The checker runs three steps at 2, 3 and 4 gloo processes, `lr`
# changing between them as a scheduler's does, and compares with
# `torch.optim.SGD(momentum=0.9)` on one process to float32 rounding, and measures what
# each rank keeps in `state`.

# %%
# exercise: 11.zero1_step
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    """SGD with momentum 0.9, each rank owning parameters i % world_size == rank."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("11.zero1_step", globals())

# %% [markdown]
# **Write the forward of a row-parallel linear layer (Megatron-LM's second layer).**
#
# Write `row_parallel_forward(h_local, weight_local, bias)`. A linear layer `y = h Wᵀ + b`
# with `k` input features is split over the ranks by its *input* features: rank `r` holds
# the columns of `W` for its slice of the features (`weight_local`, shape `(out, k_r)`,
# the slices as `torch.tensor_split` cuts `k`: uneven, and possibly empty) and receives
# only that slice of the input (`h_local`, shape `(batch, k_r)`: what a column-parallel
# layer before it left on this rank). Every rank holds the whole `bias`. Return the whole
# output `h Wᵀ + b` (shape `(batch, out)`), the same on every rank, with one
# `dist.all_reduce` — the one all-reduce of the layer pair's forward. The checker runs your
# cell at 2, 3 and 4 gloo processes, on inputs whose features do not divide by the world
# size, a slice that is empty and a batch of one column, compares with the single-process
# layer to float32 rounding, counts your collectives, and checks that the tensors it gave
# come back unchanged.

# %%
# exercise: 11.row_parallel
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    """The whole output h @ W.T + bias, from this rank's slice of h and of W's columns."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("11.row_parallel", globals())
