"""Keep glibc from handing batch-sized buffers back to the system every step.

glibc's malloc serves a block above its mmap threshold with a fresh mapping and unmaps it
on free; below it, it trims the heap's free top once that exceeds the trim threshold. Both
thresholds move with the process's history (a freed mapping raises them), so the same run
either reuses its batch, gradient and Adam buffers or faults them in again every step:
measured here, 1,000+ minor page faults a step and runs that fall into a fast and a slow
group (docs/bench/2026-11-22.md). PyTorch's CPU tuning guide answers with jemalloc or tcmalloc through
LD_PRELOAD, which a learner's laptop does not have; ``mallopt`` fixes glibc's two
thresholds instead, which also ends their drift. The cost: memory freed below 32 MiB stays
in the process for its next batch, bounded by the peak it already reached.
"""
from __future__ import annotations

import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling for it on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 2**30
USER_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                 "LD_PRELOAD")  # the user chose an allocator, or glibc's settings: keep theirs

_pinned = False


def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process and the processes it forks
    (data workers inherit them). True when they are pinned; False off glibc, or where the
    user's environment already decides (``GLIBC_TUNABLES``, ``MALLOC_*_``, ``LD_PRELOAD``)."""
    global _pinned
    if _pinned:
        return True
    if not sys.platform.startswith("linux") or any(os.environ.get(n) for n in USER_SETTINGS):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # absent from musl: its malloc has no thresholds
    except AttributeError:
        return False
    _pinned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _pinned
