"""How many CPU cores each training process may use, so N ranks on one host do not each
start a worker per core (the original course did, and the host thrashed)."""
from __future__ import annotations

import os

import psutil


def available_cores() -> int:
    # Affinity, not the machine's total: containers and Slurm allocations restrict it.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return psutil.cpu_count(logical=True) or 1


def cores_per_process(processes_on_host: int) -> int:
    return max(1, available_cores() // max(1, processes_on_host))


def default_num_workers(processes_on_host: int) -> int:
    """Data workers per process. Batched reads cost ~1 ms per batch, far less than a step,
    so workers only pay off when a process has cores to spare for them."""
    spare = cores_per_process(processes_on_host) - 2
    return max(0, min(4, spare))
