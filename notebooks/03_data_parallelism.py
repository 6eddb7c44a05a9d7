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
# # Lesson 3 — Data parallelism
#
# **What you will learn**
#
# - how distributed data parallel (DDP) training works: one process per device (a
#   *rank*), each holding a full replica of the model, each reading its own shard of
#   every batch, and an all-reduce that averages the gradients so every replica takes the
#   same step;
# - the difference between the per-process batch and the effective (global) batch;
# - why PyTorch's older `DataParallel` (DP) lost to DDP, and why Lightning 2 dropped DP;
# - how to run two CPU processes from a notebook (Lightning's notebook launcher) and from
#   a terminal with `trainup_cpu.py`, and check that the ranks end with identical weights.
#
# Time: ~25 min; the cells run in ~1 min on 2 CPU cores

# %%
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kosmoss.data import presets
from kosmoss.devices.cpus import cores_per_process
from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.data.loading import FlattenedDataset, RankBatchSampler
from kosmoss.launch import free_port
from kosmoss.lessons import forked, one_thread_per_forked_rank, quiet_lightning, scratch_folder
from kosmoss.model import LitMLP
from kosmoss.run.callbacks import parameter_checksum
from kosmoss.scaling import plan

quiet_lightning()  # no banners or adverts; warnings a learner can act on, one line each

dataset = presets.resolve("tiny", log=print)
stats = dataset.statistics()
scratch = scratch_folder("lesson03-")

# %% [markdown]
# ## The mechanics
#
# With DDP, `N` processes train together. Each one:
#
# 1. builds the same model; when it wraps the model, DDP broadcasts rank 0's parameters
#    and buffers, so all replicas start identical;
# 2. reads **its own shard** of every global batch (no two ranks see the same column);
# 3. runs forward and backward on its shard, so it has *its own* gradients;
# 4. joins an **all-reduce**: the gradients are summed over the ranks and divided by
#    `N`, and every rank receives the result (DDP does this bucket by bucket, overlapped
#    with the backward pass);
# 5. takes the optimiser step with that average gradient — the same step on every rank,
#    so the replicas stay identical without sending weights again.
#
# Gradients are not all that moves: by default DDP also broadcasts rank 0's **buffers**
# at the start of every forward pass, for modules such as batch norm whose buffers change
# while training. `LitMLP`'s buffers are its normalisation statistics, which never
# change, so turning that broadcast off would save it here — with the flag the installed
# torch names for it, which the cell below reads from DDP's own signature (torch 2.13
# renamed it: the old spelling still works but warns, and, set to `False`, also skips
# the broadcast of buffers when DDP wraps the model, so replicas could start apart).
# Lightning passes any such keyword of `DDPStrategy` on to DDP.

# %%
import inspect

from torch.nn.parallel import DistributedDataParallel

ddp_flags = inspect.signature(DistributedDataParallel.__init__).parameters
buffer_flag = "forward_sync_buffers" if "forward_sync_buffers" in ddp_flags else "broadcast_buffers"
print(f"torch {torch.__version__}: DDPStrategy({buffer_flag}=False) stops the per-forward "
      "buffer broadcast")
if buffer_flag == "forward_sync_buffers":
    print("broadcast_buffers is its deprecated spelling: it warns, and =False also skips the "
          "start-up broadcast of the buffers")
assert buffer_flag in ddp_flags

# %% [markdown]
# Because the loss is a mean over the batch, the average of the shards' gradients *is*
# the gradient of the whole global batch. Let us check that by hand with
# `torch.distributed` and two CPU processes talking over gloo.
#
# Every gradient in this lesson is computed in a process forked from the kernel, even the
# whole-batch reference: the kernel itself never runs a backward pass. Where a GPU is
# visible, PyTorch's first backward starts an autograd thread per device, and from then
# on a process forked from that one fails at its own first backward ("Unable to handle
# autograd's threading in combination with fork-based multiprocessing", see
# [Autograd and Fork](https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork)). On a
# CPU-only machine no such thread starts and nothing fails, which is how this trap hides
# until the lesson runs on a GPU. Lightning's notebook launcher forks its ranks too, so
# train in the kernel *after* the last fork, or restart the kernel. Here is what this
# machine does, in a fresh process: a backward pass, then a fork whose child runs one.

# %%
from kosmoss.lessons.forks import backward_after_fork

probe = backward_after_fork()
if probe["threads"] is None:
    print("this system does not list thread names (no /proc): the autograd threads are unseen")
elif probe["threads"]:
    print(f"the first backward started autograd thread(s) {', '.join(probe['threads'])}")
else:
    print("the first backward started no autograd device thread: no GPU is visible here")
print("a backward in a process forked after it: "
      + ("ran" if probe["child_error"] is None else f"failed — {probe['child_error']}"))
if probe["threads"] is not None:
    assert bool(probe["threads"]) == (probe["child_error"] is not None), probe

# %%
x_batch, y_batch = FlattenedDataset(dataset)[np.arange(64)]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model.net(model.normalize_x(x)), model.normalize_y(y))


def ddp_gradient_by_hand(rank, world_size, port):
    """One rank: its shard of the batch, its gradient, then the all-reduce."""
    # A forked child must not reuse the kernel's OpenMP thread pool (it would hang as
    # soon as it computed on two threads or more): one thread per rank.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats)
    shard = slice(rank * len(x_batch) // world_size, (rank + 1) * len(x_batch) // world_size)
    loss_of(model, x_batch[shard], y_batch[shard]).backward()
    local = model.net[0].weight.grad.clone()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        parameter.grad /= world_size
    torch.save({"local": local, "averaged": [p.grad for p in model.parameters()],
                "rows": (shard.start, shard.stop)}, scratch / f"grads-rank{rank}.pt")
    dist.destroy_process_group()


def whole_batch_gradients():
    """One process, the whole batch: in float32, and exact (float64) to measure rounding."""
    torch.manual_seed(0)  # the ranks' initial weights
    single = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats)
    loss_of(single, x_batch, y_batch).backward()
    exact_model = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats)
    exact_model.load_state_dict(single.state_dict())
    exact_model = exact_model.double()
    loss_of(exact_model, x_batch.double(), y_batch.double()).backward()
    return [p.grad for p in single.parameters()], [p.grad for p in exact_model.parameters()]


# fork: the processes inherit the notebook's variables (the batch, the statistics).
mp.start_processes(ddp_gradient_by_hand, args=(2, free_port()), nprocs=2, start_method="fork")
ranks = [torch.load(scratch / f"grads-rank{r}.pt") for r in range(2)]
full, exact = forked(whole_batch_gradients)  # one process more: the kernel runs no backward


def farthest(grads, reference):
    return max(float((g.double() - r).abs().max()) for g, r in zip(grads, reference))


for r, grads in enumerate(ranks):
    print(f"rank {r}: rows {grads['rows'][0]}..{grads['rows'][1] - 1} of the batch")
own_gap = float((ranks[0]["local"] - ranks[1]["local"]).abs().max())
print(f"the ranks' own gradients differ: max |g0 - g1| = {own_gap:.3g}")
ranks_gap = max(float((a - b).abs().max()) for a, b in zip(*(g["averaged"] for g in ranks)))
print(f"after the all-reduce, rank 0 vs rank 1: max difference {ranks_gap:.3g}")
averaged_error, single_error = farthest(ranks[0]["averaged"], exact), farthest(full, exact)
print(f"from the exact (float64) whole-batch gradient: the averaged one is {averaged_error:.2g} "
      f"away, one process's float32 one {single_error:.2g}")
assert own_gap > 0 and ranks_gap == 0, "the all-reduce gives every rank the same gradient"
# Both sum the same 64 per-column terms in float32, grouped differently: a few times the
# single process's own rounding, no more.
assert averaged_error <= 4 * single_error + 1e-9, "averaged gradient != whole-batch gradient"

# %% [markdown]
# The ranks computed different gradients on their shards; after the all-reduce they
# hold the same one, equal to the gradient of the whole batch up to float32 rounding —
# no farther from the exact one than a single process's own float32 gradient, as the
# cell asserts.
#
# ## Sharding the data: per-process batch and effective batch
#
# Each rank must see a different part of every global batch, and all ranks must run the
# same number of steps (an all-reduce waits for everybody). kosmoss's
# `RankBatchSampler` cuts one shuffled order, the same on every rank (seed + epoch), into
# global batches and gives rank `r` its slice of each:

# %%
indices = np.arange(20)
for rank in range(2):
    sampler = RankBatchSampler(indices, batch_size=4, rank=rank, world_size=2, seed=0)
    print(f"rank {rank}: {[b.tolist() for b in sampler]}")
seen = np.concatenate([np.concatenate(list(RankBatchSampler(indices, 4, rank=r, world_size=2,
                                                             seed=0))) for r in range(2)])
print(f"every index exactly once over both ranks: {sorted(seen.tolist()) == indices.tolist()}")
assert sorted(seen.tolist()) == indices.tolist(), "an index missed or served twice"

# %% [markdown]
# So two numbers matter. The **per-process batch** is what one rank's forward pass
# sees (and what its memory must hold). The **effective batch** is what one optimiser
# step averages over: per-process batch × number of ranks. kosmoss's flags take the
# global (effective) batch and divide it, and refuse a batch that does not divide:

# %%
from kosmoss.core.errors import UsageError

split = plan(256, 1e-3, num_nodes=1, devices_per_node=2)
for line in split.lines():
    print(line)
assert split.per_device_batch_size * split.world_size == 256
try:
    plan(250, 1e-3, devices_per_node=4)
except UsageError as err:  # the one-line message a user sees
    print(f"\n{type(err).__name__}: {err}")
else:
    raise AssertionError("a global batch of 250 over 4 ranks was accepted")

# %% [markdown]
# ## DP versus DDP
#
# PyTorch's older `torch.nn.DataParallel` (DP) is *one* process: every step it copies
# the model from the first GPU to the others, scatters the batch, runs the replicas in
# threads, gathers the outputs back on the first GPU and computes the loss there, on the
# whole batch. In the backward pass the replicas' gradients flow back to the one
# original model and are **summed** there — and the sum is right, because the loss was
# already the mean over the whole batch. In DDP each rank's loss is the mean over *its*
# shard only, so the sum of the ranks' gradients would be `N` times too large: DDP
# **averages** (sums, then divides by `N`), as in the experiment above.
#
# The copies every step, the one overloaded GPU and Python's global interpreter lock
# make DP slow, and it cannot span several machines. DDP runs one process per device,
# sends the weights once, then gradients (overlapped with the backward pass) and
# buffers, and works the same on one host or many. PyTorch's documentation recommends
# DDP even on a single machine; Lightning 2 removed its DP strategy. What it has today
# (single device, DDP and its launchers, FSDP, DeepSpeed, XLA) its registry of strategies
# lists:

# %%
from pytorch_lightning.strategies import StrategyRegistry

registered = StrategyRegistry.available_strategies()
print("strategies:", ", ".join(sorted({name.split("_")[0] for name in registered})))
assert "dp" not in registered and {"ddp", "fsdp", "deepspeed"} <= set(registered)
try:
    pl.Trainer(strategy="dp", accelerator="cpu", devices=2)
except ValueError as err:
    print(f"ValueError: {err}")
else:
    raise AssertionError("Lightning accepted strategy='dp'")

# %% [markdown]
# ## Two processes from the notebook
#
# A notebook cannot re-run itself as a script, which is how Lightning normally starts
# extra ranks. Its notebook launcher, `strategy="ddp_notebook"`, **forks** the kernel
# instead: the processes inherit everything defined so far. On CPU the ranks talk
# through gloo. The forked ranks live and die inside `fit`, so a small callback leaves
# a note from each: what it read, how many steps it took, and a checksum of its final
# weights (kosmoss's `parameter_checksum`).
#
# A fork copies the kernel's memory but not its threads: the OpenMP thread pool the
# kernel computed with is gone in the ranks, and a rank that asks for two threads or more
# waits forever for threads that do not exist. Lightning's launcher gives each rank
# cores ÷ ranks threads (rounded down, never fewer than one) unless `OMP_NUM_THREADS` is
# set: wherever that gives a rank several threads, both ranks would hang in their first
# step (the cell prints what Lightning would give them here). `one_thread_per_forked_rank()` sets one thread for
# the fork and gives the kernel its own back afterwards (the cell prints both).


# %%
class ReportRank(pl.Callback):
    """Each rank leaves a note in the scratch folder; the notebook reads them after fit."""

    def on_train_end(self, trainer, pl_module):
        note = {"rank": trainer.global_rank, "world_size": trainer.world_size,
                "batches_per_epoch": trainer.num_training_batches,
                "batch_size": trainer.datamodule.batch_size, "steps": trainer.global_step,
                "threads": torch.get_num_threads(), "checksum": parameter_checksum(pl_module)}
        (scratch / f"rank{trainer.global_rank}.json").write_text(json.dumps(note))


pl.seed_everything(42, verbose=False)
model = LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", max_epochs=2,
                     callbacks=[ReportRank()], logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     use_distributed_sampler=False)  # the DataModule shards by itself
started = time.perf_counter()
kernel_threads = torch.get_num_threads()
with one_thread_per_forked_rank():  # one OpenMP thread in each forked rank (above)
    trainer.fit(model, datamodule=FlattenedDataModule(dataset, batch_size=64))
print(f"fit took {time.perf_counter() - started:.1f} s; the kernel is back on "
      f"{torch.get_num_threads()} thread(s) (it had {kernel_threads})")
unguarded = cores_per_process(2)  # what Lightning's launcher would give each rank here
print(f"without the guard each rank would get {unguarded} thread(s) on this machine: "
      + ("it would hang" if unguarded > 1 else "safe here, a hang on a machine with more cores"))
assert torch.get_num_threads() == kernel_threads

notes = [json.loads((scratch / f"rank{r}.json").read_text()) for r in range(2)]
for note in notes:
    print(f"rank {note['rank']} of {note['world_size']}: {note['batches_per_epoch']} batches "
          f"of {note['batch_size']} columns per epoch, {note['steps']} steps on "
          f"{note['threads']} thread(s), final weights {note['checksum']}")
print(f"identical replicas: {notes[0]['checksum'] == notes[1]['checksum']}")
print(f"the notebook's model got rank 0's weights back: "
      f"{parameter_checksum(model) == notes[0]['checksum']}")
print(f"validation loss (reduced over both ranks' columns, lesson 3b): "
      f"{float(trainer.callback_metrics['val_loss']):.4f}")
assert notes[0]["checksum"] == notes[1]["checksum"] == parameter_checksum(model)

# %% [markdown]
# ## Two processes from a terminal: `trainup_cpu.py`
#
# In a terminal, Lightning's default launcher starts rank 0 as your command and
# **re-runs the same command** for the other ranks (with `LOCAL_RANK` set).
# `trainup_cpu.py --num-processes 2` does that with gloo; `--batch-size` is the global
# batch. kosmoss gathers every rank's weight checksum at the end and writes them to
# `result.json`. We run the same set-up with one process to compare.

# %%
from kosmoss.lessons import script, sh

results = {}
for processes in (2, 1):
    out = scratch / f"result-{processes}.json"
    sh([sys.executable, script("trainup_cpu.py"), "--num-processes", str(processes),
        "--dataset", "tiny", "--batch-size", "128", "--max-epochs", "3", "--no-progress",
        "--result-json", out])
    results[processes] = json.loads(out.read_text())

# %%
for processes, result in results.items():
    print(f"{processes} process(es): world size {result['world_size']}, backend "
          f"{result['backend']}, per-device batch {result['per_device_batch_size']} of "
          f"{result['global_batch_size']}, {result['global_step']} steps, test loss "
          f"{result['test_loss']:.4f}, {result['train_samples_per_s']:,.0f} samples/s")
two = results[2]
print(f"\nreplica checksums {two['replica_checksums']}: identical = {two['replicas_identical']}")
ratio = two["train_samples_per_s"] / results[1]["train_samples_per_s"]
print(f"throughput of 2 processes / 1 process: {ratio:.2f}")
apart = abs(two["test_loss"] - results[1]["test_loss"]) / results[1]["test_loss"]
print(f"test losses {two['test_loss']:.4f} and {results[1]['test_loss']:.4f}: {apart:.2%} apart")
assert two["global_step"] == results[1]["global_step"], "the same steps on the same data"

# %% [markdown]
# Read the two lines: the same global batch and number of steps (the cell checks it), so
# both runs see the same data and take the same steps; their losses differ by what the
# cell prints, not by nothing: the order of the floating-point sums differs, and training
# carries that difference along. The throughput ratio says little about DDP here, since
# both runs share the same cores; the cell below says what decided it on this machine.

# %%
from kosmoss.devices.cpus import available_cores

cores = available_cores()
print(f"{cores} core(s); one process computes with {cores_per_process(1)} thread(s), each of "
      f"the two ranks with {cores_per_process(2)} (Lightning sets OMP_NUM_THREADS to the "
      "cores divided by the ranks, where it is not set)")
for processes, result in results.items():
    assert result["global_batch_size"] == 128 and result["world_size"] == processes
assert two["replicas_identical"]
if ratio > 1.05:
    print(f"more than one process's worth ({ratio:.2f}x): the single process splits every small "
          f"matrix product over {cores_per_process(1)} threads that wait for each other at "
          "the end of each one — costly for a small model, and much more so when other "
          "programs take the cores — while each rank computes alone on its core. The gain "
          "comes from the thread counts, not from DDP.")
elif ratio < 0.95:
    print(f"less than one process ({ratio:.2f}x): the ranks share the cores the single "
          "process already used, and add the all-reduce and a second training loop.")
else:
    print(f"about the same ({ratio:.2f}x): two ranks on the cores one process already used.")
print("DDP pays off when each rank has a device of its own.")

# %% [markdown]
# ## With a GPU
#
# One process per GPU: `accelerator="gpu"`, `devices=N`, and NCCL instead of gloo
# (`trainup_gpu.py --gpus N`). The notebook launcher forks, so CUDA must not be
# initialised in the kernel before the fork: a forked rank that then uses CUDA stops with
# torch's "Cannot re-initialize CUDA in forked subprocess". Lightning 2.6 no longer refuses
# such a fork itself: its check (`_check_bad_cuda_fork`) asks torch whether the kernel is
# a bad fork, which it never is. Counting GPUs with `torch.cuda.device_count()` is safe
# where NVML answers: torch asks NVML first, and its docstring says the call does not
# poison the fork when NVML discovery succeeds. With fewer GPUs than ranks, NCCL refuses
# to put two ranks on one GPU, so kosmoss's `sharing` picks gloo and a memory share
# (lesson 5). The cell below uses the GPUs when there are any.

# %%
from pytorch_lightning.strategies import DDPStrategy

from kosmoss.devices import sharing

gpus = torch.cuda.device_count()  # asks NVML first: no CUDA initialised where NVML answers
if gpus >= 2:
    accelerator, share = "gpu", sharing(2, gpus)
    print(f"{gpus} GPUs: 2 ranks, one per GPU, backend {share.backend} ({share.reason})")
else:
    accelerator, share = "cpu", sharing(2, 0)
    print(f"{gpus} GPU(s): " + ("two ranks on one GPU is lesson 5's shared-GPU set-up; "
                                if gpus else "no GPU here; ")
          + f"this cell trains 2 CPU processes over {share.backend}")
gpu_trainer = pl.Trainer(accelerator=accelerator, devices=2,
                         strategy=DDPStrategy(start_method="fork",  # what "ddp_notebook" is
                                              process_group_backend=share.backend),
                         max_steps=10, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False)
with one_thread_per_forked_rank():
    gpu_trainer.fit(LitMLP(dataset.n_x, out_channels=dataset.n_y, stats=stats),
                    datamodule=FlattenedDataModule(dataset, batch_size=64))
print(f"2 ranks on {accelerator} over {share.backend}: train loss "
      f"{float(gpu_trainer.callback_metrics['train_loss']):.3f} after the last step")

# %% [markdown]
# ## Exercises
#
# 1. Change the by-hand experiment to four ranks. Which rows does each rank get, and is
#    the averaged gradient still that of the whole batch?
# 2. In the by-hand experiment, give rank 1 a different seed before building the model.
#    What does that break, and which step of real DDP prevents it?
# 3. Run `trainup_cpu.py --num-processes 2 --batch-size 127`. What happens, and why
#    is that better than silently training with the largest multiple of the ranks below it?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. args=(4, free_port()), nprocs=4: rows 0-15, 16-31, 32-47, 48-63; yes, since
# #    the loss is a mean and the shards have the same size.
# # 2. torch.manual_seed(rank): the replicas start different, so the same averaged
# #    gradient moves them to different places; they never agree. DDP broadcasts rank
# #    0's weights when it wraps the model, so all replicas start identical.
# # 3. exit code 2 and one line: "--batch-size 127 is not divisible by the world size 2:
# #    use a multiple of 2, e.g. 126 or 128". The original course divided with // and
# #    trained with a different batch than the one asked for, without a word.
# sh([sys.executable, script("trainup_cpu.py"), "--num-processes", "2", "--batch-size", "127",
#     "--dataset", "tiny"], check=False)
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 03` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Average the gradients over the ranks by hand with `all_reduce`, and match DDP.**
#
# Write `average_gradients(model)`. It is called on every rank after `loss.backward()` on
# that rank's shard of the batch; it must replace every parameter's `.grad` by the average
# of that gradient over all ranks, in place, with `torch.distributed.all_reduce` (the
# process group is already initialised; `dist.get_world_size()` says how many ranks).
# The checker runs your cell at 2, 3 and 4 gloo processes (the shards are not all the
# same size) and compares your gradients with those DistributedDataParallel computes for
# the same model and shards, layer by layer, to float32 rounding.

# %%
# exercise: 03.average_gradients
import torch
import torch.distributed as dist


def average_gradients(model):
    """After backward on this rank's shard: every parameter's .grad becomes its
    average over all ranks (in place)."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("03.average_gradients", globals())

# %% [markdown]
# **Split a global batch over the ranks, refusing what does not divide.**
#
# Write `per_device_batch(global_batch_size, num_nodes, devices_per_node)`: the number of
# columns (an integer) one rank's forward pass sees when `--batch-size` is the global
# batch and the world is `num_nodes × devices_per_node` ranks. When the global batch
# cannot be split evenly (not a multiple of the world size, or fewer columns than ranks:
# zero and negative batches included), raise a `ValueError` whose message says why, instead
# of training with another batch than the one asked for. The checker compares with what
# `kosmoss.scaling.arithmetic.plan` accepts and refuses on a range of set-ups, without
# calling it from your cell.

# %%
# exercise: 03.per_device_batch
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    """Columns per rank; ValueError when the global batch does not split evenly."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("03.per_device_batch", globals())
