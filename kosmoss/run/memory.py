"""Will the run fit in memory? Each rank's need, counted as the run will spend it, against
what the host (or the GPU) has left, before anything is allocated: a model that cannot fit
is a one-line error, not the kernel's OOM killer an hour in.

Per rank, on CPU (float32 training with Adam, the only optimizer of kosmoss.model):

- weights, gradients and Adam's two moments: 16 bytes per parameter;
- Adam's step: its foreach path makes one float32 temporary per parameter
  (torch/optim/adam.py, ``_multi_tensor_adam``: ``torch._foreach_sqrt`` of the second moment);
- activations at the per-device batch: every layer's output and its SiLU kept for backward,
  the input batch, and backward's gradients of as many: 2 x batch x (inputs + 2 x every
  hidden width + 2 x outputs) x 4 bytes;
- the dataset's copy when the data is held in RAM (``--mode controlled``);
- what this process already holds (torch, Lightning, the statistics): its RSS now;
- slack: 15 % of what training allocates (glibc's arenas, fragments), at least 192 MiB for
  what Lightning's Trainer, its loggers and the loaders add after this check: 78 MiB above
  the check's RSS for a 16-unit model on the tiny preset (2 CPU cores, 2026-11-26); for
  `--hidden 2000 2000` 63-93 MiB above the parts counted here in seven runs, and 134 MiB in
  a CI run inside a 1,280 MiB cgroup (2026-11-27), which a 128 MiB floor missed.

The data workers are counted apart (``check_workers``), so that the line names
``--num-workers``, not the model.

Measured against runs: ``tests/reliability/test_memory_limit.py`` runs what this accepts
inside a cgroup of that size, and shows that what it refuses peaks above it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import psutil

from ..core import memory
from ..core.errors import ConfigError

STATE_BYTES = 4 * 4  # float32 weights, gradients, Adam's exp_avg and exp_avg_sq
ADAM_STEP_BYTES = 4  # one float32 temporary per parameter during Adam's foreach step
ACTIVATION_COPIES = 2  # the outputs kept for backward, and backward's gradients of them
SLACK = 0.15
MIN_SLACK = 192 * 2**20
# A data worker's own pages (USS): 15-20 MiB on the tiny preset (2 CPU cores, 2026-11-29),
# rounded up for Python's arenas; its read-ahead batches (DataLoader's prefetch_factor) on
# top. The training and validation loaders keep theirs alive together (persistent_workers).
WORKER_BYTES = 32 * 2**20
PREFETCH = 2
LOADERS = 2


def parameter_count(n_x: int, hidden: Tuple[int, ...], n_y: int) -> int:
    sizes = [n_x, *hidden, n_y]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


@dataclass(frozen=True)
class MemoryNeed:
    """One rank's memory, part by part (bytes)."""

    params: int
    batch: int
    states: int
    step: int
    activations: int
    data: int
    runtime: int

    @property
    def slack(self) -> int:
        allocated = self.states + self.step + self.activations + self.data
        return max(int(SLACK * allocated), MIN_SLACK)

    @property
    def total(self) -> int:
        return (self.states + self.step + self.activations + self.data + self.runtime
                + self.slack)

    def words(self) -> str:
        parts = [("weights, gradients and Adam's moments", self.states),
                 ("Adam's step", self.step), (f"activations at batch {self.batch}",
                                              self.activations),
                 ("the dataset's copy", self.data), ("this process now", self.runtime),
                 ("slack", self.slack)]
        return ", ".join(f"{name} {gib(value)}" for name, value in parts if value)


def need(n_x: int, hidden: Tuple[int, ...], n_y: int, batch: int, *, data_bytes: int = 0,
         runtime_bytes: Optional[int] = None) -> MemoryNeed:
    params = parameter_count(n_x, hidden, n_y)
    widths = n_x + 2 * sum(hidden) + 2 * n_y
    runtime = psutil.Process().memory_info().rss if runtime_bytes is None else runtime_bytes
    return MemoryNeed(params, batch, params * STATE_BYTES, params * ADAM_STEP_BYTES,
                      ACTIVATION_COPIES * batch * widths * 4, data_bytes, runtime)


def check_host(rank_need: MemoryNeed, hidden: Tuple[int, ...], ranks_on_host: int) -> None:
    """Every rank on this host against the memory this process may still take (its
    cgroup's limit included)."""
    have = memory.available_bytes() + rank_need.runtime  # what this process holds is its own
    if rank_need.total * ranks_on_host > have:
        room = memory.cgroup_room()
        within = " (its cgroup's limit)" if room is not None and room < \
            psutil.virtual_memory().available else ""
        _refuse(rank_need, hidden, f"this host has {gib(have)} for {ranks_on_host} rank(s)"
                                   f"{within}")


def workers_bytes(num_workers: int, batch: int, n_x: int, n_y: int) -> int:
    """What one rank's data workers take on the host: each a fork of the rank, with its own
    pages and the batches it reads ahead."""
    per_worker = WORKER_BYTES + PREFETCH * batch * (n_x + n_y) * 4
    return LOADERS * num_workers * per_worker


def check_workers(num_workers: int, workers: int, rank_host: int, runtime: int,
                  ranks_on_host: int) -> None:
    """``--num-workers 100000`` forked until the OOM killer came (2 CPU cores, 24 GiB, it took
    the shell's other jobs too): workers that cannot fit are a one-line error."""
    have = memory.available_bytes() + runtime  # what this process holds is its own
    if (rank_host + workers) * ranks_on_host > have:
        raise ConfigError("num_workers", f"{{field}} {num_workers}: {LOADERS} loaders x "
                          f"{num_workers} data workers need about {gib(workers)} per rank "
                          f"({ranks_on_host} rank(s) here, each {gib(rank_host)} itself) and "
                          f"this host has {gib(have)}: give fewer (workers beyond the cores add "
                          "no speed; without the flag they are sized from the cores)")


def check_gpu(rank_need: MemoryNeed, hidden: Tuple[int, ...], have: float, index: int) -> None:
    """On the GPU: what training allocates there and the caching allocator's slack (this
    process's host memory and Lightning's are on the host)."""
    allocated = rank_need.states + rank_need.step + rank_need.activations + rank_need.data
    if allocated * (1 + SLACK) > have:
        _refuse(rank_need, hidden, f"GPU {index} has {gib(have)} for each rank")


def _refuse(rank_need: MemoryNeed, hidden: Tuple[int, ...], where: str) -> None:
    raise ConfigError("hidden", f"{{field}} {' '.join(map(str, hidden))}: "
                      f"{rank_need.params:,} parameters need about {gib(rank_need.total)} per "
                      f"rank ({rank_need.words()}) and {where}: give smaller layers or a "
                      "smaller --batch-size")


def gib(value: float) -> str:
    return f"{value / 2**30:,.2f} GiB"
