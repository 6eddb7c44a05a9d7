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
# - what `CUDA_VISIBLE_DEVICES` changes (what torch sees) and what it does not (what the
#   driver sees);
# - how two ranks share one GPU: gloo instead of NCCL, and a share of the memory each;
# - how to ask a machine what it has: `kosmoss env`.
#
# Time: ~20 min

# %%
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from kosmoss.devices import MachineGpu, decide, sharing, to_numpy
from kosmoss.environment import gpus as nvml_gpus
from kosmoss.errors import UsageError
from kosmoss.lessons import script, sh

scratch = Path(tempfile.mkdtemp(prefix="lesson05-"))
print(f"this machine: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
      f"{torch.cuda.device_count()} GPU(s) visible to torch, {len(nvml_gpus())} seen by the driver")

# %% [markdown]
# ## The device policy: who decides
#
# Two sides have a say, and `kosmoss.devices.decide` is the one place that combines
# them. The **machine** (`MachineGpu`) allows no GPU (`none`), offers one if the run asks
# (`offer`) or forces one whatever the run asks (`force`), and may pick one by index.
# The **run** asks for a GPU or not. The machine's setting wins. If what was wanted is
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
# ## `CUDA_VISIBLE_DEVICES`: what torch sees
#
# The CUDA runtime only shows a process the GPUs listed in `CUDA_VISIBLE_DEVICES`, and
# renumbers them from zero. The driver (NVML, which nvitop and `kosmoss env` read) still
# sees every GPU. Each line below is a fresh Python process, since the variable is read
# when CUDA starts:

# %%
probe = ("import torch; from kosmoss.environment import gpus; "
         "print(torch.cuda.device_count(), len(gpus()))")
for value in (None, "", "0", "1,0"):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if value is not None:
        env["CUDA_VISIBLE_DEVICES"] = value
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    shown = "unset" if value is None else repr(value)
    print(f"CUDA_VISIBLE_DEVICES={shown:6s}: torch sees {out[0]} GPU(s), the driver {out[1]}")
if not torch.cuda.is_available():
    print("\nno GPU here, so every count is 0. On a machine with GPUs, '' hides them all "
          "from torch, '0' shows one, and '1,0' shows two with their numbers swapped "
          "(cuda:0 is then physical GPU 1); the driver's count never changes.")

# %% [markdown]
# That renumbering is why `--gpu-ids 2,3` (local rank `r` uses id `ids[r]`) and
# `CUDA_VISIBLE_DEVICES=2,3` are two ways to say the same thing; do not combine them
# unless you mean the ids *after* the renumbering.
#
# ## Two ranks on one GPU
#
# DDP wants one rank per GPU. With more ranks than GPUs — a laptop with one GPU, or a
# lesson where everybody shares one card — NCCL refuses ("Duplicate GPU detected"). gloo
# accepts CUDA tensors for its all-reduce, so kosmoss's rule (`kosmoss.devices.sharing`)
# is: one rank per GPU, NCCL; more ranks than GPUs, gloo, and each rank may use only its
# share of the GPU's memory (`torch.cuda.set_per_process_memory_fraction`), so that one
# rank cannot starve the others.

# %%
for ranks, gpus in ((2, 0), (1, 1), (2, 2), (2, 1), (3, 1), (4, 2)):
    share = sharing(ranks, gpus)
    print(f"{ranks} rank(s), {gpus} GPU(s): {share.backend:5s} memory share "
          f"{share.memory_fraction:.2f}  ({share.reason})")

# %% [markdown]
# What the memory share does, on a GPU: an allocation beyond it fails in that process
# only, with an out-of-memory error, while the GPU itself still has room.

# %%
if torch.cuda.is_available():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    try:
        block = torch.empty(int(total * 0.6) // 4, dtype=torch.float32, device="cuda:0")
        print("allocated 60 % of the GPU despite a 50 % share?")
    except torch.cuda.OutOfMemoryError:
        print(f"a 60 % allocation failed under a 50 % share of {total / 2**30:.0f} GiB, as intended")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()
else:
    print("no GPU here: this step would cap this process at half of GPU 0 and show that an "
          "allocation of more than that fails with torch.cuda.OutOfMemoryError")

# %% [markdown]
# Now the real thing: `trainup_gpu.py --gpus 2`. With two GPUs it trains with NCCL, one
# rank per GPU; with one GPU the two ranks share it over gloo with half the memory each;
# with none it falls back to CPU, says so, and records the warning in `result.json`.

# %%
out = scratch / "gpu-run.json"
sh([sys.executable, script("trainup_gpu.py"), "--gpus", "2", "--dataset", "tiny",
    "--batch-size", "128", "--max-epochs", "1", "--no-progress", "--result-json", out])
result = json.loads(out.read_text())
print({k: result[k] for k in ("accelerator", "device", "world_size", "backend", "warnings")})

# %% [markdown]
# And with `--require-gpu`, the same command refuses to fall back when there is no GPU:
# exit code `2` and one line, before anything is prepared or written.

# %%
refused = sh([sys.executable, script("trainup_gpu.py"), "--gpus", "2", "--require-gpu",
              "--dataset", "tiny", "--max-epochs", "1", "--no-progress"], check=False)
print(f"exit code {refused.returncode}"
      + (" (a GPU was there, so it trained)" if refused.returncode == 0 else ""))

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
# 2. Use `decide` to find out what happens when the machine forces GPU `3` but only two
#    are visible.
# 3. Three ranks on two GPUs: which backend and which memory share does `sharing` give,
#    and why not a third of the memory?
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
