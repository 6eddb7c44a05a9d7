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
# # Lesson 9b — Write your own DDP: one all-reduce, then hooks that overlap backward, then buckets
#
# **What you will learn**
#
# - what `DistributedDataParallel` promises, written as a contract you can implement: the
#   same start on every rank, and after backward every gradient averaged over the ranks;
# - three ways to keep that promise, each written by you and checked against torch's DDP
#   at two, three and four gloo processes: one flat all-reduce after backward; one
#   asynchronous all-reduce per gradient, launched from a hook while backward goes on;
#   buckets filled in reverse order, each all-reduced as soon as it is full;
# - how to measure the communication a rank is *exposed* to (timestamps around the waits)
#   and how much of it an overlap *hid*, beside torch's DDP, over the loopback and over a
#   link of a set rate between two hosts (lesson 12's network namespaces);
# - why, on the course's MLP, the overlap hides little — read from the order in which its
#   gradients become ready — and on which model it hides more.
#
# Stanford's CS336 course has its learners write DDP the same way (its second
# assignment); lesson 9 showed DDP's buckets from the outside, in a profiler trace.
#
# Time: ~40 min; the cells run in ~1 min on 2 CPU cores

# %%
import statistics
import time

import torch
import torch.distributed as dist

from kosmoss.bench import own_ddp
from kosmoss.launch import hosts
from kosmoss.lessons import forked, on_ranks, quick, scratch_folder
from kosmoss.model import mlp

scratch = scratch_folder("lesson09b-")
N_X, HIDDEN, N_Y = 4128, (100, 100, 100), 552
# on_ranks(function, n) forks n processes from this kernel, each running
# function(rank, n, port) with one OpenMP thread, and fails with every rank's stack if
# they hang (lesson 9).

# %% [markdown]
# ## The contract
#
# Whatever happens inside, DDP keeps two promises, and a training loop relies on nothing
# else:
#
# 1. **The same start.** When it is built, DDP broadcasts rank 0's parameters to every
#    rank: ranks that initialised their models from different seeds still train one model.
# 2. **Averaged gradients.** When backward is over, every parameter's `.grad` holds the
#    average over the ranks of that gradient — each rank's share of the batch counts the
#    same, whatever its size (lesson 3b is about what that means for metrics).
#
# torch's DDP fulfils the second promise inside `loss.backward()` itself. The wrappers
# you write here get one more method, called after backward and before the optimizer —
# the interface of CS336's assignment:
#
# ```python
# ddp = FlatDDP(model)                     # broadcasts rank 0's weights
# for x, y in batches:
#     optimizer.zero_grad()
#     loss = loss_fn(ddp(x), y)
#     loss.backward()                      # your hooks may start all-reduces here
#     ddp.finish_gradient_synchronization()   # when it returns: averaged gradients
#     optimizer.step()
# ```
#
# Parameters that do not require a gradient (a frozen layer) get none; DDP skips them,
# and so will yours.
#
# ## When does backward make each gradient?
#
# Everything beyond the first wrapper depends on one fact: backward computes the
# gradients from the last layer to the first, and each parameter's gradient is complete
# at a known moment. `parameter.register_post_accumulate_grad_hook(hook)` calls
# `hook(parameter)` at that moment. The cell times it on the course's MLP, at the batch
# one rank gets in the benchmark below — in one process forked from the kernel, like every
# backward pass of this lesson (after a backward in the kernel, a GPU machine could not
# run one in the ranks forked later: lesson 3).

# %%
BATCH = own_ddp.Setup().batch  # one rank's batch in the benchmark below
torch.manual_seed(0)
model = mlp(N_X, HIDDEN, N_Y)


def gradient_order():
    """When each gradient is ready during one backward: the start, the end, and for each
    gradient its name, when it was ready and its bytes."""
    names = {parameter: name for name, parameter in model.named_parameters()}
    x, y = torch.randn(BATCH, N_X), torch.randn(BATCH, N_Y)
    torch.nn.functional.mse_loss(model(x), y).backward()  # a first backward pays set-ups
    model.zero_grad(set_to_none=True)
    ready = []
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(
            lambda p: ready.append((names[p], time.perf_counter(), 4 * p.numel())))
    loss = torch.nn.functional.mse_loss(model(x), y)
    started = time.perf_counter()
    loss.backward()
    return started, time.perf_counter(), ready


started, ended, ready = forked(gradient_order)
total_bytes = sum(nbytes for *_, nbytes in ready)
print(f"backward: {(ended - started) * 1e3:.2f} ms; gradients in the order they were ready:")
for name, at, nbytes in ready:
    print(f"  {(at - started) * 1e3:6.2f} ms  {name:<9} {nbytes:>9,} bytes "
          f"({nbytes / total_bytes:5.1%})")
layers = [int(name.split(".")[0]) for name, *_ in ready]
assert layers == sorted(layers, reverse=True), "backward goes from the last layer to the first"
last_name, _, last_bytes = ready[-1]
assert last_name == "0.weight" and last_bytes > total_bytes / 2
early_share = 1 - last_bytes / total_bytes
print(f"the last gradient, {last_name}, is {last_bytes / total_bytes:.1%} of the bytes: "
      f"an all-reduce started before it is ready can carry at most {early_share:.1%}")

# %% [markdown]
# The order is the reverse of `model.parameters()`, and the first layer's weight — the
# one that multiplies the column's inputs — comes last, carrying most of the bytes. Keep
# that share in mind: it bounds what any overlap can hide on this model.
#
# ## An all-reduce that does not block
#
# `dist.all_reduce(tensor, async_op=True)` returns at once with a *work handle*; gloo
# reduces the tensor on a thread of its own, and `handle.wait()` returns when it is done.
# That is how an all-reduce overlaps backward, and how this lesson measures the
# communication a rank is exposed to: `time.perf_counter()` around the wait (on a GPU,
# CUDA events around the NCCL stream's work). Two ranks, a buffer the size of the MLP's
# gradients: first a blocking all-reduce, then an asynchronous one launched before a
# stretch of compute and waited on after it.

# %%
GRADIENT_ELEMENTS = sum(p.numel() for p in model.parameters())
REPEATS = 9  # medians: one timing on a busy laptop can be a moment the process was not running


def blocking_versus_async(rank, world_size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    buffer, x, w = torch.randn(GRADIENT_ELEMENTS), torch.randn(BATCH, N_X), torch.randn(N_X, 100)
    found = {"blocking": [], "launch": [], "compute": [], "wait": []}
    for _ in range(REPEATS):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(buffer)
        found["blocking"].append(time.perf_counter() - started)
        dist.barrier()
        started = time.perf_counter()
        handle = dist.all_reduce(buffer, async_op=True)
        launched = time.perf_counter()
        for _ in range(20):  # the compute the all-reduce may overlap: a first layer's forward
            x @ w
        computed = time.perf_counter()
        handle.wait()
        waited = time.perf_counter()
        found["launch"].append(launched - started)
        found["compute"].append(computed - launched)
        found["wait"].append(waited - computed)
    torch.save({name: statistics.median(values) for name, values in found.items()},
               scratch / f"async-rank{rank}.pt")
    dist.destroy_process_group()


on_ranks(blocking_versus_async, 2)
timing = torch.load(scratch / "async-rank0.pt")
print(f"{GRADIENT_ELEMENTS * 4 / 2**20:.2f} MiB on rank 0, medians of {REPEATS}: blocking "
      f"all-reduce {timing['blocking'] * 1e3:.2f} ms; asynchronous: launched in "
      f"{timing['launch'] * 1e3:.3f} ms, {timing['compute'] * 1e3:.2f} ms of compute, "
      f"then {timing['wait'] * 1e3:.2f} ms in wait()")
exposed_share = timing["wait"] / timing["blocking"]
print(f"time in wait() / the blocking all-reduce: {exposed_share:.2f} — the rest ran while "
      "this rank computed" if exposed_share < 1 else
      f"time in wait() / the blocking all-reduce: {exposed_share:.2f} — nothing was hidden: "
      "on a busy CPU gloo's thread and the compute share the cores")
assert timing["launch"] < timing["blocking"], "launching returns before the all-reduce ends"

# %% [markdown]
# Launching returns at once. Whether the wait that follows is short depends on the
# machine: gloo's thread needs a core too, and on a laptop whose cores all compute it gets
# one only in turns. On a GPU, NCCL's all-reduce runs on its own stream while the compute
# kernels run on theirs.
#
# ## Write it yourself, in three steps
#
# Three wrappers, each a small change of the one before; each checked by code at two,
# three and four gloo processes against `torch.nn.parallel.DistributedDataParallel` (the
# start, every step's gradients and the weights after several steps of SGD with
# momentum, with uneven shares of the batch), and each checker watches your
# all-reduces: how many, of what size, launched when, waited on. Write each answer in the
# cell that starts with `# exercise:` (keep that first line), run it, then run the
# checker cell under it: it prints `correct` or what differs. From a terminal,
# `kosmoss check 09b` checks all three in your saved notebook.
#
# **(a) One flat all-reduce after backward.** The simplest DDP: when backward is over,
# copy every gradient into one flat buffer, all-reduce it once — one collective, one
# latency — divide by the world size and copy the result back. Nothing overlaps: the
# whole all-reduce is added to the step.

# %% [markdown]
# **Write DDP with one flat all-reduce after backward.**
#
# Write a class `FlatDDP(module)`: a `torch.nn.Module` wrapped around the model on every
# rank, whose `forward` runs the model. The training loop calls, every step,
# `loss.backward()`, then `wrapper.finish_gradient_synchronization()`, then
# `optimizer.step()`. Like DDP, the wrapper starts every rank from rank `0`'s weights
# (broadcast every parameter in `__init__`), and once `finish_gradient_synchronization()`
# returns, every `.grad` holds the average over the ranks of that gradient, whatever the
# size of each rank's share of the batch. Here that is one `dist.all_reduce` a step, of
# every gradient at once in one flat buffer (`torch.cat`: one collective pays the latency
# once); `torch.cat` copies, so copy the reduced buffer back into the gradients. A frozen
# parameter (`requires_grad=False`; the model has one) has no `.grad`: skip it, as DDP
# does. The checker runs `3` steps of SGD with momentum at 2, 3 and 4 gloo processes (the
# shares are uneven at 3 and 4), compares the start, every step's gradients and the final
# weights with DDP's to float32 rounding, and counts your all-reduces.

# %%
# exercise: 09b.flat
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    """DDP by hand: every gradient averaged by one flat all-reduce after backward."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: start every rank from rank 0's weights")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        """Called after loss.backward(), before optimizer.step()."""
        raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("09b.flat", globals())

# %% [markdown]
# **(b) One asynchronous all-reduce per gradient, from its hook.** The hook of the first
# section runs the moment a gradient is complete: launch that gradient's all-reduce there,
# with `async_op=True`, and keep the handle. Backward goes on with the earlier layers
# while gloo reduces the later ones; `finish_gradient_synchronization()` only waits for
# what is still running. The price: one collective per parameter, each paying the
# latency.

# %% [markdown]
# **Overlap the all-reduces with backward: one asynchronous all-reduce per gradient.**
#
# Write a class `OverlapDDP(module)`, the same contract as `FlatDDP` (rank `0`'s weights
# at the start, the averaged gradients once `finish_gradient_synchronization()` returns,
# frozen parameters skipped), but with one `dist.all_reduce` per parameter, launched
# during backward as soon as that parameter's gradient is ready: register a hook with
# `parameter.register_post_accumulate_grad_hook(hook)` (it is called with the parameter,
# its `.grad` complete), and launch the all-reduce there with `async_op=True`, so that
# backward goes on computing the earlier layers' gradients while it runs. Keep the handle
# it returns; `finish_gradient_synchronization()` waits on every handle
# (`handle.wait()`) before the gradients are used, and divides them by the world size. The
# checker compares with DDP as for `FlatDDP`, and watches every all-reduce: launched
# during backward, asynchronous, waited on.

# %%
# exercise: 09b.overlap
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    """DDP by hand: each gradient's all-reduce starts, asynchronously, as soon as
    backward has computed it."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: broadcast, then register the hooks")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        """Called after loss.backward(), before optimizer.step()."""
        raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("09b.overlap", globals())

# %% [markdown]
# **(c) Buckets.** DDP's answer to both: group the gradients into buckets of about
# `bucket_cap_mb`, in the order backward makes them (the reverse of
# `model.parameters()`), and launch a bucket's all-reduce when its last gradient is
# ready: few collectives, and still overlapped with backward. Lesson 9's `09.buckets`
# computed DDP's assignment; here there is one cap for every bucket.
#
# ```
#  backward:  [layer 4 grads][layer 3][layer 2][ layer 1 ................ ]
#  bucket 0:   └─ full ─► all-reduce ═════════╗
#  bucket 1:                    └─ full ─► all-reduce ═══╗
#  bucket 2:                                     (full at the end) ─► all-reduce ═══╗
#  finish_gradient_synchronization():                                  wait ────────┘
# ```

# %% [markdown]
# **Bucket the gradients, last layer first; all-reduce each bucket as soon as it is full.**
#
# Write a class `BucketDDP(module, bucket_cap_mb)`, the same contract as `FlatDDP`, with
# one all-reduce per bucket. In `__init__`, put the parameters that require a gradient into
# buckets in *reverse* order of `module.parameters()` (the order backward makes their
# gradients ready): a bucket closes as soon as its size in bytes reaches the cap,
# `bucket_cap_mb × 1024 × 1024` (a gradient is never split, so a bucket may go over it);
# the last bucket holds what is left. During backward, when a bucket's last gradient is
# ready (a post-accumulate-grad hook on each parameter), flatten the bucket's gradients
# into one buffer and launch its all-reduce with `async_op=True`.
# `finish_gradient_synchronization()` waits on every handle, copies the averaged buffers
# back into the gradients, and gets ready for the next step. The checker compares with
# DDP as for `FlatDDP`, with caps that a bucket reaches exactly, that one gradient alone
# exceeds, and that hold every gradient, and checks each all-reduce: its size, launched
# during backward as soon as its bucket is full, asynchronous, waited on.

# %%
# exercise: 09b.buckets
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    """DDP by hand: gradients in buckets, last layer first; each bucket's all-reduce
    starts, asynchronously, as soon as its last gradient is ready."""

    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: broadcast, buckets, hooks")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        """Called after loss.backward(), before optimizer.step()."""
        raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("09b.buckets", globals())

# %% [markdown]
# ## Timed beside torch's DDP
#
# `kosmoss.bench.own_ddp` times each wrapper — yours where you have written it, else the
# course's answer (the cell says whose) — and torch's DDP, on two ranks, from the same
# weights on the same data. For every step each rank takes `time.perf_counter()` before
# forward, after backward and after `finish_gradient_synchronization()`; a step's time is
# its slowest rank's (a collective ends when its last rank does), and the table gives the
# median over the steps:
#
# - **step**: forward, backward and the synchronisation (the optimizer, the same for all,
#   is left out);
# - **exposed**: the time in `finish_gradient_synchronization()`, where the wrappers wait
#   on their all-reduces; torch's DDP waits inside backward, so for it, its step less the
#   step of the model alone;
# - **alone**: the same all-reduces, launched the same way, with nothing else running;
# - **hidden**: what a step would take if nothing overlapped — the model alone plus its
#   all-reduces alone — less the step measured.
#
# Three settings: the course's MLP over the loopback; the same over a link of a set rate
# between two hosts (two network namespaces, one rank in each: lesson 12); and a model of
# equal layers over that link, where most gradients are ready long before the last one.
# Where hosts cannot be made (they need root and iproute2), the cell says why, skips the
# link and runs the model of equal layers over the loopback.
# torch's DDP and `BucketDDP` use the same cap, a small one, so that the MLP gets several
# buckets (lesson 9 printed DDP's buckets at it); DDP launches its all-reduces in C++, out
# of the benchmark's sight, so its "alone" replays the buckets it reports having rebuilt
# after its first step.

# %%
wrappers, whose = own_ddp.wrappers_for(globals())
print("timing " + ", ".join(f"{key}: {who}" for key, who in whose.items()))
missing = hosts.support_missing()
settings = own_ddp.lesson_settings(missing, quick())
EQUAL = next(label for label in settings if label.startswith("equal layers"))
if missing:
    print(f"no hosts here ({missing}): the course MLP over a {own_ddp.LINK} link is skipped, "
          "and the model of equal layers runs over the loopback")
else:
    print(f"hosts here: two network namespaces joined by a {own_ddp.LINK} link, one rank in each")
measured = {}
for label, (setup, link) in settings.items():
    folder = scratch / label.replace(" ", "-").replace(",", "")
    folder.mkdir()
    if link:
        rate = hosts.parse_rate(link, "--link-rate")
        with hosts.host_set(2, rate, purpose="lesson 9b") as made:
            on_ranks(own_ddp.bench_rank, 2, wrappers, setup, folder, made)
    else:
        on_ranks(own_ddp.bench_rank, 2, wrappers, setup, folder)
    figures = own_ddp.read(folder, 2)
    measured[label] = {"table": own_ddp.summary(figures), "gaps": own_ddp.weight_gaps(folder),
                       "elements": figures, "setup": setup}
    gaps = measured[label]["gaps"]
    assert all(gap < 1e-5 for gap in gaps.values()), \
        f"{label}: a wrapper ends with other weights than torch's DDP ({gaps}): " \
        "run its checker above"
print("every wrapper ends each setting with torch DDP's weights, to float32 rounding "
      f"(largest difference {max(max(m['gaps'].values()) for m in measured.values()):.1e} "
      "of the largest weight)")

# %%
def show(label):
    table = measured[label]["table"]
    print(f"{label}: the model alone {table['model alone']['step_s'] * 1e3:.2f} ms a step")
    print(f"  {'':<10} {'all-reduces':>11} {'step':>9} {'exposed':>9} {'alone':>9} "
          f"{'hidden':>9}")
    for name in own_ddp.VARIANTS[1:]:
        row = table[name]
        print(f"  {name:<10} {row['all_reduces']:>11} {row['step_s'] * 1e3:>7.2f}ms "
              f"{row['exposed_s'] * 1e3:>7.2f}ms {row['alone_s'] * 1e3:>7.2f}ms "
              f"{row['hidden_s'] * 1e3:>7.2f}ms"
              + (f"  ({row['hidden_s'] / row['alone_s']:.0%} of its all-reduces)"
                 if row["hidden_s"] > 0 else ""))


for label in measured:
    show(label)
counts = {name: measured["course MLP, loopback"]["table"][name]["all_reduces"]
          for name in own_ddp.WRAPPERS}
assert counts["flat"] == 1 and counts["overlap"] == len(list(model.parameters()))
ddp_buckets = measured["course MLP, loopback"]["elements"]["torch DDP"]["all_reduce_elements"][0]
mine = measured["course MLP, loopback"]["elements"]["buckets"]["all_reduce_elements"][0]
print(f"torch DDP's buckets after its rebuild hold {ddp_buckets} elements; BucketDDP's "
      f"all-reduces {mine}")
assert ddp_buckets == mine, "at one cap, DDP and BucketDDP make the same buckets"

# %% [markdown]
# How much a bucket can hide is set by when its gradients are ready, and the first
# section measured that: the cell below sets each setting's largest "hidden" beside the
# share of the bytes whose all-reduce can start before backward's last gradient, and
# writes what the table says.

# %%
OVERLAPPING = ("torch DDP", "overlap", "buckets")
for label, result in measured.items():
    table, buckets = result["table"], own_ddp.bucket_bytes(result["setup"])
    share = 1 - buckets[-1] / sum(buckets)  # every bucket but the one the last gradient fills
    best = max(OVERLAPPING, key=lambda name: table[name]["hidden_s"])
    hidden, alone = table[best]["hidden_s"], table[best]["alone_s"]
    noise = abs(table["flat"]["hidden_s"])  # flat overlaps nothing: its "hidden" is noise
    verdict = (f"hid {hidden * 1e3:.2f} ms of {alone * 1e3:.2f} ms of all-reduce "
               f"({hidden / alone:.0%}), more than the flat wrapper's noise "
               f"({noise * 1e3:.2f} ms)" if hidden > 2 * noise else
               f"hid nothing measurable: {hidden * 1e3:.2f} ms, within the flat wrapper's "
               f"noise ({noise * 1e3:.2f} ms)")
    print(f"{label}: {len(buckets)} buckets; {share:.0%} of the bytes can start before the "
          f"last gradient; the best overlap ({best}) {verdict}")
    result["early_share"] = share
assert measured[EQUAL]["early_share"] > 0.5 > \
    measured["course MLP, loopback"]["early_share"]

# %% [markdown]
# The share of the bytes that can start early is a property of the model: the course's
# MLP makes its first layer's weight, most of its bytes, last, whatever the wrapper; the
# model of equal layers makes most of its bytes early. What an overlap actually hides
# also depends on the link and on the cores — the all-reduce must take long enough to be
# worth hiding, and gloo's thread needs a core while backward computes — and the lines
# above say what it hid here. `kosmoss project` (lesson 9) models the same trade.
#
# ## With a GPU
#
# The wrappers run unchanged on a GPU with NCCL (`dist.init_process_group("nccl")`, the
# model and data on `cuda`): NCCL's all-reduce runs on its own CUDA stream, so an overlap
# costs the compute nothing, and what a rank is exposed to is measured with CUDA events
# (`torch.cuda.Event(enable_timing=True)`) around the wait, since `time.perf_counter()`
# only sees when kernels are queued. torch's DDP adds what these wrappers leave out: it
# rebuilds its buckets in the order gradients actually arrived, lets gradients be views
# into the buckets (`gradient_as_bucket_view`, no copy), and runs communication hooks
# (compression, `fp16_compress_hook`). This course has no recorded GPU run of this
# benchmark yet.
#
# ## Exercises
#
# 1. Time the wrappers at a larger batch (`Setup(batch=1024)`) over the loopback. Does the
#    per-parameter wrapper still lose to the flat one, and why?
# 2. Give `BucketDDP` and torch's DDP a cap of one gigabyte (`bucket_cap_mb=1024`): what
#    becomes of the overlap, and which wrapper does it now behave like?
# 3. In `OverlapDDP`, divide each gradient by the world size in its hook, *before*
#    launching its all-reduce (as DDP does). Does the checker still say `correct`, and
#    what does the division cost?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. The compute grows with the batch, the all-reduces do not: each latency weighs less,
# #    and the step is the compute's.
# on_ranks(own_ddp.bench_rank, 2, wrappers, own_ddp.Setup(batch=1024), scratch)
# # 2. One bucket holding every gradient, ready only with the last one: the flat wrapper,
# #    launched from a hook.
# on_ranks(own_ddp.bench_rank, 2, wrappers, own_ddp.Setup(bucket_cap_mb=1024), scratch)
# # 3. Yes: the average is the same, summed in another order (within float32 rounding); the
# #    division moves from after the wait to the hook, still one pass over the gradients.
# ```
#
# </details>
