"""One ``kosmoss comm`` measurement: check the plan, start the ranks, turn their timings
into figures (comm.json's content).

    from kosmoss.comm.measure import make_plan, measure
    result = measure(make_plan(ranks=2, sizes=[2**20, 8 * 2**20]))
"""
from __future__ import annotations

from datetime import datetime
from typing import Iterable, List, Optional

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
    model compute (kosmoss.comm.ranks)."""
    import torch

    from ..devices.cpus import cores_per_process

    _check_counts(ranks, nodes, repeats, warmup)
    if not 0 <= compute_s <= MAX_COMPUTE_S:
        raise UsageError(f"--compute-s {compute_s:g}: give 0 (back to back) up to "
                         f"{MAX_COMPUTE_S:g} seconds of compute before each all-reduce")
    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if device == "auto" else device
    if device == "cuda" and not cuda:
        raise UsageError("--device cuda: no CUDA GPU here; use --device cpu")
    # Every rank runs on this host, simulated nodes too: they share its GPUs.
    backend = _backend(backend, device, ranks, torch.cuda.device_count() if cuda else 0)
    chosen = _sizes(sizes, max_size)
    return CommPlan(ranks=ranks, nodes=nodes, backend=backend, device=device, sizes=chosen,
                    repeats=repeats, warmup=warmup, threads_per_rank=cores_per_process(ranks),
                    compute_s=compute_s)


def on_hosts(plan: CommPlan, made) -> CommPlan:
    """The plan with its nodes on a host set (kosmoss.launch.hosts.host_set)."""
    from dataclasses import replace

    from ..launch.hosts import rate_name

    return replace(plan, host_namespaces=tuple(h.namespace for h in made.hosts),
                   master_addr=made.master_addr, link_rate=rate_name(made.rate_bps))


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
