"""In-process clean-up for the notebook case "my kernel still holds the GPU".

A kernel that trained keeps its tensors while anything refers to them (a ``trainer`` or
``model`` variable, IPython's ``Out`` history, a traceback in ``sys.last_traceback``), and
PyTorch's caching allocator keeps freed blocks reserved for reuse: ``nvidia-smi`` shows the
memory as used either way. :func:`release_memory` collects what is unreachable and hands
the cached blocks back to the driver; what is still referenced stays allocated, and the
answer says how much, so the user knows to ``del`` it.
"""
from __future__ import annotations

import gc
import sys
from typing import Dict, Optional

import psutil


def peak_host_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (current RSS where the OS keeps
    no peak). On Linux the peak of this process's own memory map (``VmHWM``): getrusage's
    ``ru_maxrss`` keeps the peak of the map replaced by exec, so a run started from a large
    process (a notebook kernel, pytest) would report its parent's memory as its own."""
    hwm = _vm_hwm_kib()
    if hwm is not None:
        return hwm / 2**10
    try:
        import resource
    except ImportError:  # Windows
        return psutil.Process().memory_info().rss / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def _vm_hwm_kib() -> Optional[int]:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_memory() -> Dict[str, Optional[int]]:
    """gc, then PyTorch's CUDA cache. Returns ``objects_collected``, ``cuda`` (whether CUDA
    was initialised in this process), ``cuda_reserved_before`` / ``cuda_reserved_after`` /
    ``cuda_freed`` and ``cuda_still_allocated`` (bytes over every device; None without CUDA)."""
    collected = gc.collect()
    torch = sys.modules.get("torch")  # a process that never imported torch holds no CUDA memory
    if torch is None or not torch.cuda.is_initialized():
        return {"objects_collected": collected, "cuda": False, "cuda_reserved_before": None,
                "cuda_reserved_after": None, "cuda_freed": None, "cuda_still_allocated": None}
    before = _over_devices(torch, torch.cuda.memory_reserved)
    torch.cuda.synchronize()  # blocks still used by queued kernels are not free yet
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()  # blocks shared with DataLoader workers that have exited
    after = _over_devices(torch, torch.cuda.memory_reserved)
    return {"objects_collected": collected, "cuda": True, "cuda_reserved_before": before,
            "cuda_reserved_after": after, "cuda_freed": before - after,
            "cuda_still_allocated": _over_devices(torch, torch.cuda.memory_allocated)}


def _over_devices(torch, measure) -> int:
    return sum(int(measure(index)) for index in range(torch.cuda.device_count()))
