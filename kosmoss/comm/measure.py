"""One ``kosmoss comm`` measurement: check the plan, start the ranks, turn their timings
into figures (comm.json's content).

    from kosmoss.comm.measure import make_plan, measure
    result = measure(make_plan(ranks=2, sizes=[2**20, 8 * 2**20]))
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterable, List, Optional

from ..core import memory
from ..core.errors import UsageError
from ..scaling import allreduce as figures
from .ranks import CommPlan, plan_as_dict, run

DEFAULT_REPEATS, DEFAULT_WARMUP = 10, 2
MAX_COMPUTE_S = 10.0  # --compute-s: a training step's compute, not a sleep of minutes


def make_plan(ranks: int, nodes: int = 1, backend: str = "auto", device: str = "auto",
              sizes: Optional[Iterable[int]] = None, max_size: Optional[int] = None,
              repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
              compute_s: float = 0.0) -> CommPlan:
    """The plan, or a UsageError naming the flag; ``sizes`` None: 4 KiB..256 MiB, the
    model's gradient and DDP's bucket; ``compute_s`` > 0: each all-reduce after that much
    model compute (kosmoss.comm.ranks). Every check that needs no torch comes first: a
    bad value is answered at once, not after torch's seconds of import."""
    _check_counts(ranks, nodes, repeats, warmup)
    if not 0 <= compute_s <= MAX_COMPUTE_S:
        raise UsageError(f"--compute-s {compute_s:g}: give 0 (back to back) up to "
                         f"{MAX_COMPUTE_S:g} seconds of compute before each all-reduce")
    chosen = _sizes(sizes, max_size)
    if device == "cpu" or (device == "auto" and not _nvidia_device()):
        _check_host_memory(chosen, ranks)
    import torch

    from ..devices.cpus import cores_per_process

    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if device == "auto" else device
    if device == "cuda" and not cuda:
        raise UsageError("--device cuda: no CUDA GPU here; use --device cpu")
    if device == "cpu":
        _check_host_memory(chosen, ranks)
    else:
        _check_gpu_memory(chosen, ranks, torch.cuda)
    # Every rank runs on this host, simulated nodes too: they share its GPUs.
    backend = _backend(backend, device, ranks, torch.cuda.device_count() if cuda else 0)
    return CommPlan(ranks=ranks, nodes=nodes, backend=backend, device=device, sizes=chosen,
                    repeats=repeats, warmup=warmup, threads_per_rank=cores_per_process(ranks),
                    compute_s=compute_s)


def on_hosts(plan: CommPlan, made) -> CommPlan:
    """The plan with its nodes on a host set (kosmoss.launch.hosts.host_set)."""
    from dataclasses import replace

    from ..launch.hosts import rate_name

    return replace(plan, host_namespaces=tuple(h.namespace for h in made.hosts),
                   master_addr=made.master_addr, link_rate=rate_name(made.rate_bps))


# Each rank holds its payload, and gloo (or NCCL) stages as much again while reducing it.
COPIES_PER_RANK = 2
# A rank is a Python process with torch and gloo loaded: 151-217 MiB of its own (USS) during
# a 4 KiB..64 MiB run on 2 CPU cores (2026-11-29), the payload's copies included.
RANK_PROCESS_BYTES = 192 * 2**20


def _check_host_memory(sizes: tuple, ranks: int) -> None:
    """Every rank of this host is a process, and holds the largest payload twice: more
    than the memory this process may take (its cgroup's limit included) is refused, not
    an allocation error in a rank or the OOM killer (--ranks 200 of 4 KiB was let through)."""
    payload = COPIES_PER_RANK * ranks * max(sizes)
    processes, have = ranks * RANK_PROCESS_BYTES, memory.available_bytes()
    need, size = payload + processes, figures.human_size(max(sizes))
    if need <= have:
        return
    if payload >= processes:
        raise UsageError(f"--sizes {size}: {ranks} ranks need about {figures.human_size(need)} "
                         f"for it ({COPIES_PER_RANK} copies each, and the rank processes) "
                         f"and this host has {figures.human_size(have)} available; give "
                         "smaller sizes or --max-size")
    raise UsageError(f"--ranks {ranks}: {ranks} rank processes need about "
                     f"{figures.human_size(need)} (about {figures.human_size(RANK_PROCESS_BYTES)}"
                     f" each with torch loaded, and {COPIES_PER_RANK} copies of {size}) and "
                     f"this host has {figures.human_size(have)} available; give fewer ranks")


def _check_gpu_memory(sizes: tuple, ranks: int, cuda) -> None:
    gpus = max(1, cuda.device_count())
    sharing = -(-ranks // gpus)  # ranks per GPU, rounded up
    have = min(cuda.get_device_properties(i).total_memory for i in range(gpus))
    need = COPIES_PER_RANK * sharing * max(sizes)
    if need > have:
        raise UsageError(f"--sizes {figures.human_size(max(sizes))}: {sharing} rank(s) per GPU "
                         f"need about {figures.human_size(need)} for it and a GPU has "
                         f"{figures.human_size(have)}; give smaller sizes or --max-size")


def _nvidia_device() -> bool:
    """Whether the NVIDIA driver shows a GPU, without importing torch (its device files)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _check_counts(ranks: int, nodes: int, repeats: int, warmup: int) -> None:
    if ranks < 2:
        raise UsageError(f"--ranks {ranks}: an all-reduce needs at least 2 ranks")
    if nodes < 1 or ranks % nodes:
        raise UsageError(f"--nodes {nodes}: must be >= 1 and divide --ranks {ranks} "
                         "(ranks are spread evenly over the simulated nodes)")
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: must be >= 1")
    if warmup < 0:
        raise UsageError(f"--warmup {warmup}: must be >= 0")


def _backend(backend: str, device: str, ranks: int, gpus: int) -> str:
    if backend == "auto":
        # NCCL refuses two ranks on one GPU: ranks sharing GPUs use gloo.
        return "nccl" if device == "cuda" and ranks <= gpus else "gloo"
    if backend == "nccl" and device != "cuda":
        raise UsageError("--backend nccl: NCCL reduces CUDA tensors only; use --device cuda "
                         "on a GPU machine, or --backend gloo")
    if backend == "nccl" and ranks > gpus:
        raise UsageError(f"--backend nccl: {ranks} ranks on this host but {gpus} GPU(s); NCCL "
                         "refuses two ranks on one GPU, use --backend gloo to share them")
    return backend


def _sizes(sizes: Optional[Iterable[int]], max_size: Optional[int]) -> tuple:
    if sizes is None:
        extra = (figures.model_gradient_bytes(), figures.DDP_BUCKET_BYTES)
        chosen = figures.default_sizes(extra, max_size)
    else:
        chosen = sorted({s for s in sizes if max_size is None or s <= max_size})
    if not chosen:
        raise UsageError(f"--max-size {figures.human_size(max_size or 0)}: smaller than every "
                         "size; raise it or give --sizes")
    return tuple(chosen)


def measure(plan: CommPlan, master_port: Optional[int] = None) -> dict:
    """Run the ranks; comm.json: the plan, each group's sizes with their figures, its fit."""
    from ..launch.ports import free_port

    started = datetime.now().astimezone()
    times = run(plan, master_port or free_port())
    return {
        "kosmoss_comm": 1,
        "date": started.isoformat(timespec="seconds"),
        "plan": plan_as_dict(plan),
        "model_gradient_bytes": figures.model_gradient_bytes(),
        "ddp_bucket_bytes": figures.DDP_BUCKET_BYTES,
        "groups": {name: group_figures(name, plan, times[name]) for name in plan.groups},
    }


def _times_and_waits(repeats) -> tuple:
    """A size's repeats: a list of times (back to back), or times, waits and the compute
    steps' times side by side and alone (after compute)."""
    if not isinstance(repeats, dict):
        return repeats, None, None
    return repeats["times"], repeats["waits"], (repeats["compute_s"], repeats["compute_alone_s"])


def group_figures(name: str, plan: CommPlan, times: List) -> dict:
    """One collective's rows (a size each) and its α–β fit."""
    ranks = {"world": plan.ranks, "intra": plan.ranks_per_node, "inter": plan.nodes}[name]
    rows = []
    for size, repeats in zip(plan.sizes, times):
        taken, waits, compute = _times_and_waits(repeats)
        rows.append(figures.size_row(size, taken, ranks, waits, compute))
    fit, fit_mean = figures.fit_rows(rows, ranks), figures.fit_rows(rows, ranks, "mean_time_s")
    return {"ranks": ranks, "rows": rows, "fit": fit.as_dict() if fit else None,
            "fit_mean": fit_mean.as_dict() if fit_mean else None}
