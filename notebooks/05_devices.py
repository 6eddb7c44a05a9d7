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
# # Lesson 5 — Devices
#
# **What you will learn**
#
# - who decides whether a run computes on a CPU or a GPU, and on which GPU: kosmoss's
#   device policy, its decision table, and the fallback to CPU with a warning;
# - what `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` change (which GPUs torch sees, and
#   in which order) and what they do not (what the driver sees), and how `--gpu-ids`
#   differs;
# - how two ranks share one GPU: gloo instead of NCCL, and a share of the memory each;
# - how to ask a machine what it has: `kosmoss env`.
#
# Time: ~15 min; the cells run in ~2 min on 2 CPU cores

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from kosmoss.devices import MachineGpu, decide, sharing, to_numpy
from kosmoss.devices.environment import gpus as nvml_gpus
from kosmoss.core.errors import UsageError
from kosmoss.lessons import quiet_lightning, script, sh, scratch_folder

quiet_lightning()
scratch = scratch_folder("lesson05-")
print(f"this machine: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
      f"{torch.cuda.device_count()} GPU(s) visible to torch, {len(nvml_gpus())} seen by the driver")

# %% [markdown]
# ## The device policy: who decides
#
# Two sides have a say, and `kosmoss.devices.decide` is the one place that combines
# them. The **machine** (`MachineGpu`) allows no GPU (`none`), offers one if the run asks
# (`offer`) or forces one whatever the run asks (`force`), and may pick one by index.
# The **run** asks for a GPU or not. The machine's setting takes precedence. If what was wanted is
# not there, the run falls back to CPU with a warning — or, with `require=True`
# (`--require-gpu`), stops with a one-line error instead.
#
# `trainup_cpu.py` is machine `none`, run asks no: always CPU. `trainup_gpu.py` is
# machine `offer`, run asks yes. `decide` takes the number of visible GPUs as an argument,
# so we can print the whole table on any machine — this is docs/devices.md, computed:

# %%
rows = []
for setting in ("none", "offer", "force"):
    for index in (None, 1, 5):
        if setting == "none" and index is not None:
            continue  # a machine that offers no GPU has none to pick
        for asks in (False, True):
            for visible in (0, 2):
                policy = decide(MachineGpu(setting, index), asks, gpu_count=visible)
                try:
                    decide(MachineGpu(setting, index), asks, require=True, gpu_count=visible)
                    required = "same"
                except UsageError:
                    required = "error"
                rows.append((setting, "-" if index is None else index, "yes" if asks else "no",
                             visible, str(policy.device), required, "; ".join(policy.warnings)))
header = ("machine", "index", "run asks", "GPUs", "result", "--require-gpu", "warning")
widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
for row in [header] + rows:
    print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)) + "  " + str(row[-1]))

# %% [markdown]
# The result is one `DevicePolicy` that everything else follows: `policy.device` for
# tensors, `policy.to(x)`, `policy.load(path)` for a checkpoint saved anywhere (a GPU
# run, another node), and `to_numpy` for any tensor on any device, bfloat16 included.
# This machine's own decision, as `trainup_gpu.py` makes it:

# %%
policy = decide(MachineGpu("offer"), use_gpu=True)
print(f"trainup_gpu.py here: {policy.device}, warnings: {list(policy.warnings) or 'none'}")
weights = policy.to(torch.randn(3, 2, dtype=torch.bfloat16))
torch.save({"w": weights}, scratch / "checkpoint.pt")
restored = policy.load(scratch / "checkpoint.pt")["w"]
print(f"checkpoint restored on {restored.device}; as numpy: {to_numpy(restored).dtype}, "
      f"shape {to_numpy(restored).shape}")

# %% [markdown]
# ## `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`: what torch sees
#
# The CUDA runtime shows a process only the GPUs listed in `CUDA_VISIBLE_DEVICES`, and
# numbers them from zero in the order listed. *Which* physical GPU an index in that list
# means depends on `CUDA_DEVICE_ORDER`: by default (`FASTEST_FIRST`) the runtime puts the
# fastest GPU first, while the driver's tools (NVML, which `nvidia-smi`, nvitop and
# `kosmoss env` read) number GPUs by PCI bus. On a machine with two different GPUs,
# `cuda:0` may then not be `nvidia-smi`'s first GPU; `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes
# both agree. The driver still sees every GPU whatever these say. Each line below is a
# fresh Python process, since both variables are read when CUDA starts:

# %%
probe = ("import torch; from kosmoss.devices.environment import gpus; "
         "print(torch.cuda.device_count(), len(gpus()))")
for value in (None, "", "0", "1,0"):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indices as nvidia-smi numbers them
    if value is not None:
        env["CUDA_VISIBLE_DEVICES"] = value
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    shown = "unset" if value is None else repr(value)
    print(f"CUDA_VISIBLE_DEVICES={shown:6s}: torch sees {out[0]} GPU(s), the driver {out[1]}")
if not torch.cuda.is_available():
    print("(no GPU here, so every count is 0: GPU only; no recorded result yet)")

# %% [markdown]
# `--gpu-ids 2,3` is not the same as `CUDA_VISIBLE_DEVICES=2,3`. With `--gpu-ids`, local
# rank `r` uses the CUDA id `ids[r]`, but every rank still sees every GPU. Lightning's
# CUDA accelerator calls `torch.cuda.set_device` on the rank's GPU when it sets the rank
# up, so from then on a stray `.cuda()` lands on the rank's own GPU. What still lands on
# `cuda:0`, another job's GPU perhaps: whatever names it (`device="cuda:0"`), whatever
# touches CUDA before the Trainer's set-up (at import, in the script before `fit`), and
# processes the rank starts (data-loading workers, tools), which begin on `cuda:0`.
# `CUDA_VISIBLE_DEVICES=2,3` hides the other GPUs from the process altogether, and its
# ranks then say `cuda:0` and `cuda:1`. The two compose: the ids of
# `--gpu-ids` count *after* the renumbering, so `CUDA_VISIBLE_DEVICES=2,3` with
# `--gpu-ids 1` is the second GPU of that list (in the order `CUDA_DEVICE_ORDER` sets).
# Schedulers such
# as Slurm set `CUDA_VISIBLE_DEVICES` for you: there, use the ids from zero.
#
# ## Two ranks on one GPU
#
# DDP wants one rank per GPU. With more ranks than GPUs — a laptop with one GPU, or a
# lesson where everybody shares one card — NCCL refuses ("Duplicate GPU detected"). gloo
# accepts CUDA tensors for its all-reduce, so kosmoss's rule (`kosmoss.devices.sharing`)
# is: one rank per GPU, NCCL; more ranks than GPUs, gloo, and each rank's PyTorch
# allocations are capped at its share of the GPU's memory
# (`torch.cuda.set_per_process_memory_fraction`), so that one rank's tensors cannot starve
# the others. The cap covers only PyTorch's caching allocator: the CUDA context each
# process creates (its size depends on the GPU and the libraries loaded), and memory that
# other libraries (NCCL's buffers,
# cuDNN or cuBLAS workspaces) allocate outside PyTorch, are not counted in it. Leave room
# for them.

# %%
for ranks, gpus in ((2, 0), (1, 1), (2, 2), (2, 1), (3, 1), (4, 2)):
    share = sharing(ranks, gpus)
    print(f"{ranks} rank(s), {gpus} GPU(s): {share.backend:5s} memory share "
          f"{share.memory_fraction:.2f}  ({share.reason})")

# %% [markdown]
# What the memory share does, on a GPU: an allocation through PyTorch beyond it fails in
# that process only, with an out-of-memory error, while the GPU itself still has room.

# %%
if torch.cuda.is_available():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    try:
        block = torch.empty(int(total * 0.6) // 4, dtype=torch.float32, device="cuda:0")
    except torch.cuda.OutOfMemoryError:
        print(f"a 60 % allocation failed under a 50 % share of {total / 2**30:.0f} GiB, as intended")
    else:
        raise AssertionError("allocated 60 % of the GPU despite a 50 % share")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()
else:
    print("GPU only; no recorded result yet (no GPU here: the cell caps this process's PyTorch "
          "allocations at half of GPU 0 and tries to allocate more than that)")

# %% [markdown]
# Now the real thing: `trainup_gpu.py --gpus 2`. With two GPUs it trains with NCCL, one
# rank per GPU; with one GPU the two ranks share it over gloo, each capped at its share
# of the memory (the `sharing` rule above);
# with none it falls back to CPU, says so, and records the warning in `result.json`.

# %%
out = scratch / "gpu-run.json"
sh([sys.executable, script("trainup_gpu.py"), "--gpus", "2", "--dataset", "tiny",
    "--batch-size", "128", "--max-epochs", "1", "--no-progress", "--result-json", out])
result = json.loads(out.read_text())
print({k: result[k] for k in ("accelerator", "device", "world_size", "backend", "warnings")})
if not torch.cuda.is_available():  # "falls back to CPU, says so, and records the warning"
    assert result["accelerator"] == "cpu" and result["warnings"]

# %% [markdown]
# And with `--require-gpu`, the same command refuses to fall back when there is no GPU:
# the exit code of bad input and one line (the cell prints both), before anything is
# prepared or written.

# %%
refused = sh([sys.executable, script("trainup_gpu.py"), "--gpus", "2", "--require-gpu",
              "--dataset", "tiny", "--max-epochs", "1", "--no-progress"], check=False)
print(f"exit code {refused.returncode}"
      + (" (a GPU was there, so it trained)" if refused.returncode == 0 else ""))
assert refused.returncode == (0 if torch.cuda.is_available() else 2)

# %% [markdown]
# ## `kosmoss env`: what this machine has
#
# Before a course or a benchmark, ask the machine: versions, cores, GPUs and their
# memory (through nvitop's API, not by parsing `nvidia-smi`), the distributed backends,
# and which launcher started the process. `--json` is for scripts.

# %%
sh([sys.executable, "-m", "kosmoss", "env"])
facts = json.loads(subprocess.run([sys.executable, "-m", "kosmoss", "env", "--json"],
                                  capture_output=True, text=True, check=True).stdout)
print("backends:", {k: v for k, v in facts["backends"].items()},
      "| cores available:", facts["cpu"]["cores_available"])

# %% [markdown]
# ## With a GPU
#
# This whole lesson runs differently: the decision for this machine says `cuda:0`, the
# `CUDA_VISIBLE_DEVICES` probe shows the renumbering, the memory-share cell allocates
# for real, `trainup_gpu.py --gpus 2` runs on the GPU(s) with NCCL or shared over gloo,
# `--require-gpu` trains instead of refusing, and `kosmoss env` lists each GPU with its
# memory.
#
# ## Exercises
#
# 1. Which row of the decision table does `trainup_gpu.py --require-gpu` on a laptop
#    without a GPU fall in, and what exactly does it print?
# 2. Use `decide` to find out what happens when the machine forces a GPU index that does
#    not exist (`MachineGpu("force", 3)` with `gpu_count=2`).
# 3. Three ranks on two GPUs: which backend and which memory share does `sharing` give,
#    and why is the share not the GPUs divided by the ranks?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. machine offer, run asks yes, no GPU visible: the row that ends on CPU with
# #    "none visible"; with require=True it is the error printed above (exit code 2):
# #    "--require-gpu: a GPU was wanted but none is visible ...; run without --require-gpu
# #    to train on CPU".
# # 2.
# p = decide(MachineGpu("force", 3), use_gpu=False, gpu_count=2)
# print(p.device, p.warnings)  # cuda:0, "GPU 3 does not exist (2 visible): using GPU 0"
# # 3.
# print(sharing(3, 2))  # gloo; two ranks end up on one of the GPUs, so each takes half
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 05` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Decide where a run computes, as `kosmoss.devices.policy.decide` does.**
#
# Write `device_for(machine, machine_index, run_asks_gpu, visible_gpus)` returning
# `"cpu"` or `"cuda:N"`. `machine` is the machine's setting: `"none"` (CPU only),
# `"offer"` (a GPU if the run asks) or `"force"` (a GPU whatever the run asks);
# `machine_index` picks a GPU (`None`: the first); `visible_gpus` is how many GPUs torch
# sees. A GPU that is wanted but absent means CPU; an index that does not exist (negative,
# or not below `visible_gpus`) means GPU 0. The checker compares with `decide` on every
# row of the decision table, indexes at the edges included.

# %%
# exercise: 05.device_for
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    """Returns "cpu" or "cuda:N"."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("05.device_for", globals())

# %% [markdown]
# **Pick the backend and memory share for ranks on a host's GPUs.**
#
# Write `memory_share(ranks_on_host, gpus_on_host)` returning `(backend, fraction)`: the
# process-group backend (`"nccl"` or `"gloo"`) and the fraction of one GPU's memory each
# rank may use, when the ranks are spread as evenly as possible over the GPUs (the busiest
# GPU sets the share). NCCL refuses two ranks on one GPU; gloo accepts CUDA tensors; with
# no GPU, gloo and a fraction of `1.0`. The checker compares with
# `kosmoss.devices.policy.sharing`, as many ranks as GPUs, fewer, and ranks that do not
# divide included.

# %%
# exercise: 05.memory_share
def memory_share(ranks_on_host, gpus_on_host):
    """(backend, fraction of a GPU's memory per rank)."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("05.memory_share", globals())
