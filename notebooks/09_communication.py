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
# # Lesson 9 — Communication: the all-reduce, what it costs, and what DDP does with it
#
# **What you will learn**
#
# - how a ring all-reduce works, by writing one with `send` and `recv` on several gloo
#   processes (a reduce-scatter, then an all-gather) and checking it against
#   `dist.all_reduce`;
# - how many bytes each rank moves in a ring — `2(n-1)/n` of the buffer — and why that
#   factor turns the *algorithm* bandwidth into the *bus* bandwidth nccl-tests reports;
# - how to measure the all-reduce of a machine with `kosmoss comm`;
# - how DDP groups gradients into buckets (`bucket_cap_mb`) and starts their all-reduce
#   while backward is still running, seen in a `torch.profiler` trace;
# - how `kosmoss project` turns these measurements into a prediction for many devices on
#   many nodes, and how the prediction for two ranks compares with a real run here.
#
# Time: ~40 min; the cells run in ~1 min on 2 CPU cores

# %%
import gc
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from kosmoss.lessons import (on_ranks, quick, quiet_lightning, recorded_gpu, script, sh,
                             scratch_folder)
from kosmoss.model import mlp

quiet_lightning()
scratch = scratch_folder("lesson09-")
# on_ranks(function, n) forks n processes from this kernel, each running
# function(rank, n, port) with one OpenMP thread (lesson 3), and fails with every rank's
# stack if they hang.


def join(rank, world_size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)


# %% [markdown]
# ## A ring all-reduce, by hand
#
# An all-reduce leaves on every rank the sum of everybody's buffer. The obvious way —
# everybody sends everything to rank 0, which adds and sends the sum back — makes rank 0's
# link carry the whole buffer once per rank: it gets slower with every rank added. The
# **ring** (Patarasuk and Yuan's bandwidth-optimal all-reduce, made popular by Baidu for
# deep learning; NCCL's default for large buffers) keeps every link equally busy:
#
# ```
#   rank 0 ──► rank 1          the buffer cut into n chunks
#     ▲          │
#     │          ▼             reduce-scatter, n−1 steps: send one chunk to the right,
#   rank 3 ◄── rank 2          receive one from the left and add it to your own copy
#
#                              all-gather, n−1 steps: the finished chunks go round once more
# ```
#
# After the reduce-scatter each rank holds *one* chunk summed over all ranks; after the
# all-gather every rank holds all of them. Below, each rank writes its result and counts
# the bytes it sent; the same buffer then goes through `dist.all_reduce` for comparison.

# %%
ELEMENTS = 2**18 + 3  # an odd size: the chunks are not all equal


def ring_all_reduce(tensor):
    """Sum tensor over all ranks in place with send/recv; returns the bytes this rank sent."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = torch.tensor_split(tensor.view(-1), n)  # views into the tensor
    sent = 0
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            # reduce-scatter: pass chunk r-step on, add chunk r-step-1; at the end chunk
            # r+1 is complete here, and the all-gather passes the complete ones round.
            offset = 0 if phase == "reduce-scatter" else 1
            outgoing = chunks[(rank + offset - step) % n]
            incoming = chunks[(rank + offset - step - 1) % n]
            request = dist.isend(outgoing.clone(), right)  # isend: no deadlock when all send
            received = torch.empty_like(incoming)
            dist.recv(received, left)
            request.wait()
            sent += outgoing.numel() * outgoing.element_size()
            if phase == "reduce-scatter":
                incoming += received
            else:
                incoming.copy_(received)
    return sent


def ring_versus_all_reduce(rank, world_size, port):
    join(rank, world_size, port)
    mine = torch.randn(ELEMENTS, generator=torch.Generator().manual_seed(rank))
    by_hand, reference = mine.clone(), mine.clone()
    started = time.perf_counter()
    sent = ring_all_reduce(by_hand)
    ring_s = time.perf_counter() - started
    started = time.perf_counter()
    dist.all_reduce(reference)
    gloo_s = time.perf_counter() - started
    torch.save({"sent": sent, "difference": (by_hand - reference).abs().max().item(),
                "ring_s": ring_s, "gloo_s": gloo_s},
               scratch / f"ring-{world_size}-rank{rank}.pt")
    dist.destroy_process_group()


buffer_bytes = ELEMENTS * 4
ring = {}
for world_size in (2, 4):
    on_ranks(ring_versus_all_reduce, world_size)
    ring[world_size] = [torch.load(scratch / f"ring-{world_size}-rank{r}.pt")
                        for r in range(world_size)]
print(f"buffer: {ELEMENTS:,} float32 = {buffer_bytes / 2**20:.2f} MiB on every rank")
for world_size, ranks in ring.items():
    factor = 2 * (world_size - 1) / world_size
    worst = max(r["difference"] for r in ranks)
    print(f"{world_size} ranks: each sent {[r['sent'] for r in ranks]} bytes = "
          f"{ranks[0]['sent'] / buffer_bytes:.3f} x the buffer (2(n-1)/n = {factor:.3f}); "
          f"largest difference from dist.all_reduce {worst:.1e}")
    assert worst < 1e-5
    for r in ranks:
        assert abs(r["sent"] / buffer_bytes - factor) < world_size / ELEMENTS
print("time of one all-reduce on rank 0, by hand / gloo's: "
      + ", ".join(f"{n} ranks {v[0]['ring_s'] * 1e3:.1f} / {v[0]['gloo_s'] * 1e3:.1f} ms"
                  for n, v in ring.items()))

# %% [markdown]
# The sums agree with `dist.all_reduce` to float rounding (the additions happen in
# another order). The traffic per rank is `2(n-1)/n` of the buffer: each of the
# `2(n-1)` steps sends one chunk of `1/n` of it. That share **grows with `n` toward its
# limit, two buffers' worth as `n` grows, and never beyond**, whatever the number of ranks
# — which is why the ring scales.
# (Gloo has a ring of its own, written in C++; the timings above say how the Python one
# compares on this machine. NCCL chooses an all-reduce's algorithm — ring, tree, NVLS or
# CollNet — by message size and topology; its `NCCL_ALGO` variable names them.)
#
# ## Why `2(n-1)/n` is the "busbw" factor
#
# Time an all-reduce of `S` bytes and you get the **algorithm bandwidth**, `algbw = S / t`.
# It does not compare between two ranks and eight: with more ranks each link carries more of
# the buffer. nccl-tests (its `PERFORMANCE.md`) therefore also reports the **bus
# bandwidth** `busbw = algbw × 2(n-1)/n`: the bytes each link actually carried per second,
# the number to hold against a link's rated speed. With two ranks the factor is one, and
# both are the same; the cell prints it for a few more.

# %%
for n in (2, 4, 8, 64):
    print(f"n = {n:>2}: each rank sends and receives {2 * (n - 1) / n:.3f} x the buffer; "
          f"busbw = {2 * (n - 1) / n:.3f} x algbw")

# %% [markdown]
# ## Measured: `kosmoss comm`
#
# `kosmoss comm` starts its own ranks, all-reduces buffers of several sizes back to back
# (nccl-tests' loop: warm-up, then timed repeats), prints time, algbw and busbw per size,
# and fits `t(S) = α + β·S`: a latency and a bandwidth. Its time is the slowest rank's,
# since a collective ends when its last rank does; nccl-tests reports the average over the
# ranks by default (its `-a` option picks rank 0, the average, the minimum or the
# maximum), so compare with `-a 3` there.
# A few sizes here (without `--sizes`, `kosmoss comm` sweeps its default range), around
# the size of the MLP's gradients, where the cell below also evaluates the fit. Smaller
# sizes are left out: on a busy laptop the time of a loopback all-reduce of well under a
# megabyte is mostly noise, and one stalled repeat there once made it slower than the
# largest size, which left no bandwidth to fit.

# %%
comm_dir = scratch / "comm"
sizes = ["1M", "4M", "16M"]
sh([sys.executable, "-m", "kosmoss", "comm", "--ranks", "2", "--sizes", *sizes,
    "--repeats", "3" if quick() else "7", "--out", comm_dir])
comm = json.loads((comm_dir / "comm.json").read_text())

# %%
world = comm["groups"]["world"]
n = world["ranks"]
for row in world["rows"]:
    assert abs(row["busbw_Bps"] - row["algbw_Bps"] * 2 * (n - 1) / n) <= 1e-6 * row["busbw_Bps"]
    assert abs(row["algbw_Bps"] - row["bytes"] / row["time_s"]) <= 1e-6 * row["algbw_Bps"]
fit = world["fit"]
gradients = comm["model_gradient_bytes"]
predicted_gradients_s = fit["alpha_s"] + fit["beta_s_per_byte"] * gradients
print(f"{n} ranks over {comm['plan']['backend']}: busbw = algbw x {2 * (n - 1) / n:g} in every row "
      f"(checked); fit: alpha = {fit['alpha_s'] * 1e6:.0f} us, "
      f"{1 / fit['beta_s_per_byte'] / 1e9:.2f} GB/s")
print(f"the MLP's gradients, {gradients / 2**20:.2f} MiB: "
      f"{predicted_gradients_s * 1e3:.2f} ms per all-reduce by the fit")

# %% [markdown]
# Between two processes on one machine the "link" is a loopback socket and a memory copy,
# and on a busy laptop the small sizes swing from one run to the next (see the min..max
# column). The fit is what `kosmoss project` reads below.
#
# ## DDP's buckets, and the overlap with backward
#
# DDP does not wait for the end of backward to all-reduce the gradients, and it does not
# all-reduce them one tensor at a time either (one collective per tensor pays the latency
# `α` for each). It packs them into **buckets** of about `bucket_cap_mb` (its default is
# printed below) in the order backward produces them — the last layer first — and starts a
# bucket's all-reduce as soon as its last gradient is ready, while backward goes on with
# the earlier layers. The first step has no such buckets yet: with the default
# `find_unused_parameters=False`, DDP puts every gradient in one bucket, notes the order
# the gradients come in, and after the first step builds the buckets in that order
# (`rebuilt_bucket_sizes` below). While `bucket_cap_mb` is left at its default, the first
# bucket has a cap of its own, `dist._DEFAULT_FIRST_BUCKET_BYTES` (one MiB), so that the
# first all-reduce starts early.
#
# Two ranks, the MLP with the default cap and with `bucket_cap_mb=0.25`, three steps each; the
# third step of the small-cap run is recorded with `torch.profiler` and its trace
# exported (open it in `chrome://tracing` or Perfetto).

# %%
N_X, HIDDEN, N_Y = 4128, (100, 100, 100), 552


def ddp_steps(rank, world_size, port):
    from torch.nn.parallel import DistributedDataParallel

    join(rank, world_size, port)
    x, y = torch.randn(64, N_X), torch.randn(64, N_Y)
    for cap in (None, 0.25):
        torch.manual_seed(0)
        ddp = DistributedDataParallel(mlp(N_X, HIDDEN, N_Y), bucket_cap_mb=cap)
        optimizer = torch.optim.Adam(ddp.parameters())
        for step in range(3):
            optimizer.zero_grad()
            if step == 2 and cap:
                with torch.profiler.profile() as profile:
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
        if rank == 0:
            logged = ddp._get_ddp_logging_data()
            (scratch / f"buckets-{cap}.json").write_text(json.dumps(
                {k: logged[k] for k in ("bucket_cap_bytes", "rebuilt_bucket_sizes",
                                        "rebuilt_per_bucket_param_indices")}))
            if cap:
                profile.export_chrome_trace(str(scratch / "ddp-trace.json"))
    # DDP before its group: torch's Reducer holds the group, and as its last owner it would
    # destroy it holding the GIL while gloo's thread waits for the GIL (a deadlock: a
    # destructor that blocks, bound without releasing the GIL, pytorch/pytorch#56297).
    del ddp
    gc.collect()
    dist.destroy_process_group()


on_ranks(ddp_steps, 2)
buckets = {cap: json.loads((scratch / f"buckets-{cap}.json").read_text()) for cap in (None, 0.25)}
names = [name for name, _ in mlp(N_X, HIDDEN, N_Y).named_parameters()]
for cap, logged in buckets.items():
    sizes = [int(s) for s in logged["rebuilt_bucket_sizes"].split(",")]
    members = [[names[int(i)] for i in part.split()]
               for part in logged["rebuilt_per_bucket_param_indices"].split(",")]
    print(f"bucket_cap_mb={cap} (cap {logged['bucket_cap_bytes']:,} bytes): {len(sizes)} "
          f"bucket(s) of {sizes} bytes")
    for size, bucket in zip(sizes, members):
        print(f"   {size:>9,} bytes: {', '.join(bucket)}")

# %% [markdown]
# With the default cap the whole model fits in one bucket: its first layer's weight alone
# is most of the gradients, and it comes last. With the small cap the later layers get a
# bucket of their own. Now the trace: when did each bucket's all-reduce run, against the
# backward pass?

# %%
trace = json.loads((scratch / "ddp-trace.json").read_text())
events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
start = events[0]["ts"]
gradient_ops = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function")
                and "AccumulateGrad" not in e["name"]]
backward_end = max(e["ts"] + e["dur"] for e in gradient_ops)  # the last gradient computed
launches = [e for e in events if e["name"] == "c10d::allreduce_"]
transfers = [e for e in events if e["name"] == "gloo:all_reduce"]
print(f"backward: {len(gradient_ops)} gradient functions, "
      f"{(gradient_ops[0]['ts'] - start) / 1e3:.2f} .. {(backward_end - start) / 1e3:.2f} ms")
for bucket, (launch, transfer) in enumerate(zip(launches, transfers)):
    end = transfer["ts"] + transfer["dur"]
    hidden_ms = max(0.0, min(end, backward_end) - transfer["ts"]) / 1e3
    print(f"bucket {bucket}: all-reduce launched at {(launch['ts'] - start) / 1e3:.2f} ms, "
          f"ran {(transfer['ts'] - start) / 1e3:.2f} .. {(end - start) / 1e3:.2f} ms on gloo's "
          f"thread; {hidden_ms:.2f} ms of it while backward was still computing")
overlapped = launches[0]["ts"] < backward_end
print(f"the first bucket's all-reduce was launched before backward's last gradient: {overlapped}")
assert len(launches) == len(transfers) == len(buckets[0.25]["rebuilt_bucket_sizes"].split(","))
assert overlapped

# %% [markdown]
# The first bucket's all-reduce starts while backward still computes the first layers'
# gradients, on gloo's own thread; the last bucket — the one holding the first layer,
# whose gradient comes last — cannot start before backward ends, and whatever it takes
# is added to the step. Smaller buckets start earlier but pay `α` more often; NCCL on a
# GPU runs the all-reduce on its own stream, and there the overlap is what makes DDP
# scale. On this MLP the first layer is most of the bytes, so overlap buys little:
# `kosmoss project` models exactly this (docs/scaling.md).
#
# ## Predicted, then measured: two ranks here
#
# `kosmoss project` predicts a DDP step for `N` devices per node × `M` nodes: one device's
# compute at the per-device batch, plus the all-reduce of each bucket over the links
# (a ring inside the node, then across nodes), minus what hides behind backward. It
# measures one device's step here (on CPU, on one thread) and takes the links from
# `kosmoss comm`'s file (`--comm`) or from presets. First the set-up we can check: two
# ranks on this machine, then a real two-rank run of `trainup_cpu.py` at the same
# global batch.

# %%
from kosmoss.scaling import projection

BATCH, STEPS = 256, 20 if quick() else 60
sh([sys.executable, "-m", "kosmoss", "project", "--batch-size", str(BATCH), "--devices", "1",
    "2", "--nodes", "1", "--comm", comm_dir / "comm.json", "--out", scratch / "project"])
answer = json.loads((scratch / "project" / "project.json").read_text())
predicted = {r["world"]: r for r in answer["rows"]}[2]
run = sh([sys.executable, script("trainup_cpu.py"), "--num-processes", "2", "--dataset", "tiny",
          "--batch-size", str(BATCH), "--max-steps", str(STEPS), "--no-progress",
          "--result-json", scratch / "two-ranks.json"])
measured = json.loads((scratch / "two-ranks.json").read_text())

# %%
ratio = predicted["samples_per_s"] / measured["train_samples_per_s"]
measured_step_s = BATCH / measured["train_samples_per_s"]
load = os.getloadavg()[0]
print(f"2 ranks, global batch {BATCH}: predicted {predicted['samples_per_s']:,.0f} samples/s "
      f"(step {predicted['step_s'] * 1e3:.1f} ms, of which {predicted['exposed_comm_s'] * 1e3:.2f} "
      f"ms all-reduce), measured {measured['train_samples_per_s']:,.0f} samples/s "
      f"(step {measured_step_s * 1e3:.1f} ms): predicted / measured = {ratio:.2f}")
print(f"load average now {load:.1f} on {os.cpu_count()} cores")
if 0.75 <= ratio <= 1.25:
    print("within 25 %: the cost model holds here.")
else:
    print(f"off by {max(ratio, 1 / ratio):.1f}x. The all-reduce is "
          f"{predicted['exposed_comm_s'] / measured_step_s:.0%} of the measured step, so the gap "
          "is the compute: the model assumes each rank gets the core it measured, and "
          + ("other programs took the cores (load above the core count)."
             if load > (os.cpu_count() or 1) else
             "the measured run also spent time outside the model (start-up, data, logging)."))
assert measured["world_size"] == 2 and measured["global_batch_size"] == BATCH
assert predicted_gradients_s < measured_step_s / 2, "the all-reduce would dominate the step"

# %% [markdown]
# Whatever the ratio says on your machine, the second assertion is what this lesson's
# measurements establish: on two ranks here the all-reduce of the gradients takes a small
# part of a step, so this model's two-rank speed is set by compute. docs/scaling.md has
# the longer story of predicted against measured on a machine that others share.
#
# ## What would eight GPUs × four nodes buy this model?
#
# The same cost model, with the links of a typical GPU cluster — `nvlink4` inside a node,
# InfiniBand NDR (`ib-ndr`) between nodes with eight network cards — and the global batch
# the cell sets. This machine has no GPU, so the device is *one core of this machine*,
# the step `kosmoss project` measured above; the cell replays the model for devices from
# as fast as that core to far faster (the factors are printed). The question is how the
# answer moves as the device gets faster.

# %%
core = projection.StepProfile(**answer["profile"])
shape = projection.mlp_shape()
cluster = projection.Cluster(1, 1, projection.preset("nvlink4", "--intra"),
                             projection.preset("ib-ndr", "--inter"), nics=8)
print(f"one core here: {core.forward_backward_s * 1e3:.1f} ms forward+backward and "
      f"{core.optimizer_s * 1e3:.2f} ms Adam at batch {core.batch}")
GLOBAL_BATCH = 1024
print(f"global batch {GLOBAL_BATCH}")
outlook = {}
for faster in (1, 30, 1000):
    device = replace(core, device="cuda", forward_backward_s=core.forward_backward_s / faster,
                     optimizer_s=core.optimizer_s / faster, fixed_s=core.fixed_s / faster)
    rows = projection.grid(device, shape, cluster, [1, 8], [1, 4], GLOBAL_BATCH)
    outlook[faster] = {(r["devices_per_node"], r["nodes"]): r for r in rows}
    big = outlook[faster][(8, 4)]
    print(f"a device {faster:>4}x one core: 8 x 4 = {big['world']} devices, batch "
          f"{big['per_device_batch']:.0f} each: speedup {big['speedup']:5.1f}, efficiency "
          f"{big['efficiency']:.2f}, communication {big['comm_share']:.0%} of the step, "
          f"dominant: {big['dominant']}")
fastest = max(outlook)
one_node, four_nodes = outlook[fastest][(8, 1)], outlook[fastest][(8, 4)]
print(f"for the fastest device the prediction hangs most on {four_nodes['dominant']!r}; "
      f"four nodes instead of one: speedup {one_node['speedup']:.1f} -> "
      f"{four_nodes['speedup']:.1f} "
      f"({'a loss' if four_nodes['speedup'] < one_node['speedup'] else 'a gain'})")
assert four_nodes["dominant"] in projection.KNOBS

# %% [markdown]
# Read the three lines from top to bottom: the faster each device, the less time its share
# of the global batch takes to compute, while the links stay as fast as they were — so the
# share of the step that is communication grows; the "dominant" column names the input
# the prediction hangs on, and the last line what a faster device leaves: a global batch
# shared by many devices gives each only a few columns, and the step is then the links'
# latency — microseconds per ring hop — and bandwidth more than the compute. Weak scaling
# (`--weak`: the same per-device batch, a larger global batch) is the other answer, with
# the learning-rate questions of lesson 4.
#
# ## With a GPU
#
# On GPUs the all-reduce runs over NCCL, on its own CUDA stream: `kosmoss comm` picks NCCL
# when every rank has a GPU, and `kosmoss project --device cuda` measures the step on the
# GPU, so the question of the section above gets a GPU's answer instead of a core's. With
# a single GPU, two ranks can only share it over gloo (NCCL refuses two ranks on one GPU,
# lesson 5), and the all-reduce then goes through host memory: each rank copies its
# gradients out of the GPU, once the GPU has finished the work queued before them. The cell
# runs on a GPU machine; without one it shows what kosmoss's GPU check recorded on one
# (its device and date are printed): the raw training loop on two ranks sharing one GPU,
# first with nothing exchanged, then with one gloo all-reduce of the gradients after
# backward, then with DDP — the gap between the second and third lines is what a
# host-staged all-reduce costs a step there, waiting on the GPU included.

# %%
gpus = torch.cuda.device_count()  # asks NVML first: no CUDA initialised where NVML answers
if gpus >= 2:
    sh([sys.executable, "-m", "kosmoss", "comm", "--ranks", str(gpus), "--max-size", "256M",
        "--out", scratch / "comm-gpu"])
if gpus >= 1:
    sh([sys.executable, "-m", "kosmoss", "project", "--device", "cuda", "--batch-size", "1024",
        "--intra", "nvlink4", "--inter", "ib-ndr", "--nics", "8", "--devices", "1", "8",
        "--nodes", "1", "4"])
else:
    print("no GPU here: the GPU measurements are skipped")
    record = recorded_gpu("anatomy")
    if record:
        print(f"recorded on an {record['device']}, {record['date']} ({record['command']}):")
        single = record["figures"][0]["samples_per_s"]
        for line in record["figures"]:
            print(f"  {line['variant']:<44} {line['samples_per_s'] / 1e6:5.2f} M samples/s "
                  f"{line['samples_per_s'] / single:5.2f} x 1 process")

# %% [markdown]
# ## Exercises
#
# 1. Run the ring with five ranks. What share of the buffer does each rank send, and what
#    would it be with `n = 1000`?
# 2. In `ddp_steps`, set `bucket_cap_mb=0.01`. How many buckets do you get, and why does
#    the first layer's weight share its bucket with nothing but its own bias?
# 3. Replay the outlook with the `25gbe` preset between the nodes instead of InfiniBand:
#    what does the "dominant" column now say for the fastest device?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. on_ranks(ring_versus_all_reduce, 5): 2(n-1)/n = 1.6 of the buffer; with 1000
# #    ranks 1.998 — the ring's traffic per rank stays below two buffers' worth.
# # 2. One bucket per layer: each bias is ready just before its weight and, far below the
# #    cap, waits for it; a bucket closes when it reaches the cap, and no gradient is ever
# #    split, so the 1.6 MB weight goes with its bias alone, however far over the cap.
# # 3. The inter-node all-reduce is 16x slower per byte: for the fast devices the step
# #    is now mostly the all-reduce across nodes, and a link's bandwidth or latency
# #    becomes the dominant input.
# cluster = replace(cluster, inter=projection.preset("25gbe", "--inter"))  # then rerun the loop
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 09` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Write a ring all-reduce with `send` and `recv`: reduce-scatter, then all-gather.**
#
# Write `ring_all_reduce(tensor)`: on every rank, replace `tensor` (any shape, float32) in
# place by the sum of that tensor over all ranks, as `dist.all_reduce(tensor)` does — but
# with point-to-point messages only (`dist.send`/`dist.recv` or `dist.isend`/`dist.irecv`),
# around a ring: rank `r` sends to rank `(r + 1) % n` and receives from rank `(r - 1) % n`.
# Cut the tensor into `n` chunks (`torch.tensor_split`; some may be one element shorter,
# or empty when the tensor has fewer elements than ranks); in the reduce-scatter phase
# (`n - 1` steps) each rank sends one chunk and adds the one it receives, so that it ends
# with one chunk summed over all ranks; in the all-gather phase (`n - 1` steps) the summed
# chunks go round once more. The checker runs your cell at 2, 3 and 4 gloo processes on
# tensors of several shapes, compares with the exact sum to float32 rounding, and counts
# the messages each rank sends: a ring sends `2(n-1)` messages of one chunk each,
# `2(n-1)/n` of the buffer in all. Collectives are not allowed.

# %%
# exercise: 09.ring_all_reduce
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place, with send/recv around a ring."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("09.ring_all_reduce", globals())

# %% [markdown]
# **Put gradients into DDP's buckets.**
#
# Write `ddp_buckets(grad_bytes, first_cap, cap)`. `grad_bytes` lists the sizes (bytes) of
# the gradients in the order backward makes them ready. DDP fills a bucket with them in
# that order and closes it as soon as its size reaches the cap (a gradient is never split,
# so a bucket may go over the cap); the first bucket has cap `first_cap`, every later one
# `cap`; the last bucket holds what is left. Return the buckets as lists of indices into
# `grad_bytes` (left as it was). The checker compares with the function
# DistributedDataParallel itself calls on several cases — the sizes of kosmoss's MLP
# among them, a bucket that reaches its cap exactly, a gradient larger than any cap —
# without calling it from your cell.

# %%
# exercise: 09.buckets
def ddp_buckets(grad_bytes, first_cap, cap):
    """Lists of indices into grad_bytes, one per bucket, in order."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("09.buckets", globals())
