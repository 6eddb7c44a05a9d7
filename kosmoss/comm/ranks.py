"""Start the ranks of an all-reduce benchmark on this host and time each payload size.

``torch.multiprocessing.start_processes`` starts them (its children set PR_SET_PDEATHSIG,
so none outlives this process); each rank joins one process group through
``init_process_group("env://")`` with MASTER_ADDR 127.0.0.1 and a free port, as kosmoss's
simulated nodes do: ``nodes`` node groups of ``ranks // nodes`` ranks, NODE_RANK set in
each. With hosts (``--hosts netns``) each node's ranks first enter the node's network
namespace, and meet at host 0's address over the shaped links.

With more than one node and more than one rank per node, the ranks also time the
two halves of a hierarchical all-reduce: inside each node (``intra``) and across nodes
between ranks of the same local rank (``inter``), all node groups at once.

Per size: ``warmup`` all-reduces, then ``repeats`` timed repeats; a repeat is a barrier,
then ``iters`` back-to-back all-reduces (nccl-tests' loop: enough to last about
``MIN_REPEAT_S``, agreed by all ranks), divided by ``iters``. A repeat's time is the
slowest rank's.

With ``compute_s`` > 0 the all-reduces are timed as a training step meets them: each
follows a training step of kosmoss's MLP (forward, backward, Adam) lasting about
``compute_s`` on one rank alone, run on every rank, with no barrier. A repeat is then one
all-reduce; its time is the last rank's to arrive (the others also waited for it), and the
ranks' spread in arrival is kept as ``wait_s`` (the time a step loses to the slowest rank:
each rank's wait is its own time minus the last one's, as all end together). The steps'
mean time side by side against alone (``compute_s`` / ``compute_alone_s``, alone timed
just before and after each size's repeats) is what ranks sharing a host's memory and caches
cost each other.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Tuple

MIN_REPEAT_S = 0.005
GROUP_TIMEOUT_S = 120  # a rank that never arrives fails the run instead of hanging it
MAX_COMPUTE_ROWS = 65536  # --compute-s: the rows of one compute step at most


@dataclass(frozen=True)
class CommPlan:
    ranks: int  # the whole world
    nodes: int
    backend: str  # gloo | nccl
    device: str  # cpu | cuda
    sizes: Tuple[int, ...]
    repeats: int
    warmup: int
    threads_per_rank: int
    compute_s: float = 0.0  # > 0: each all-reduce follows this much model compute
    # --hosts netns: node n's ranks run in host_namespaces[n] (kosmoss.launch.hosts), over
    # its interface, MASTER_ADDR host 0's address; the link's rate as set ("" unshaped).
    host_namespaces: Tuple[str, ...] = ()
    master_addr: str = "127.0.0.1"
    link_rate: str = ""

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def groups(self) -> Tuple[str, ...]:
        """The collectives timed: the world's, then a hierarchical all-reduce's two halves."""
        hierarchical = self.nodes > 1 and self.ranks_per_node > 1
        return ("world", "intra", "inter") if hierarchical else ("world",)


def run(plan: CommPlan, master_port: int) -> Dict[str, List[List[float]]]:
    """Start the ranks, wait for them; per group, per size, the repeats' times (seconds)."""
    from ..launch.spawn import spawn_for_result

    with tempfile.TemporaryDirectory(prefix="kosmoss-comm-") as scratch:
        result = str(Path(scratch) / "times.json")
        return spawn_for_result(_rank_main, (plan, master_port, result), plan.ranks, result)


def _rank_main(rank: int, plan: CommPlan, master_port: int, result: str) -> None:
    import torch
    import torch.distributed as dist

    from ..launch.spawn import leave_rank, write_result

    local_rank, node_rank = rank % plan.ranks_per_node, rank // plan.ranks_per_node
    if plan.host_namespaces:  # before any socket: the rank lives on its node's host
        from ..launch.hosts import INTERFACE, SOCKET_VARIABLES, enter

        enter(plan.host_namespaces[node_rank])
        os.environ.update({name: INTERFACE for name in SOCKET_VARIABLES})
    os.environ.update(MASTER_ADDR=plan.master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(plan.ranks), LOCAL_RANK=str(local_rank),
                      NODE_RANK=str(node_rank), OMP_NUM_THREADS=str(plan.threads_per_rank))
    torch.set_num_threads(plan.threads_per_rank)  # torch is imported already: env is too late
    device = _device(plan, rank)
    dist.init_process_group(plan.backend, init_method="env://", rank=rank,
                            world_size=plan.ranks, timeout=timedelta(seconds=GROUP_TIMEOUT_S),
                            **({"device_id": device} if plan.backend == "nccl" else {}))
    try:
        groups = _groups(plan, rank)
        # One compute step per group, sized once: every size then follows the same compute.
        steps = {name: _model_step(plan.compute_s, device, groups[name])
                 for name in plan.groups} if plan.compute_s > 0 else {}
        times = {name: [_time_size(size, plan, device, groups[name], steps.get(name))
                        for size in plan.sizes] for name in plan.groups}
        if rank == 0:  # every collective has completed: the figures are whole
            write_result(result, times)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave_rank()


def _device(plan: CommPlan, rank: int):
    import torch

    if plan.device == "cpu":
        return torch.device("cpu")
    # All ranks are on this host. NCCL needs a GPU per rank; gloo ranks may share one.
    index = rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _groups(plan: CommPlan, rank: int) -> dict:
    """This rank's process group for each collective. Every rank creates every subgroup
    (torch.distributed requires it), in the same order."""
    import torch.distributed as dist

    groups = {"world": dist.group.WORLD}
    if "intra" in plan.groups:
        per_node = plan.ranks_per_node
        nodes = [list(range(n * per_node, (n + 1) * per_node)) for n in range(plan.nodes)]
        across = [list(range(local, plan.ranks, per_node)) for local in range(per_node)]
        groups["intra"] = _member_group(nodes, rank)
        groups["inter"] = _member_group(across, rank)
    return groups


def _member_group(rank_lists: List[List[int]], rank: int):
    import torch.distributed as dist

    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def _time_size(size: int, plan: CommPlan, device, group, step=None):
    """The repeats' times of one size, each the slowest rank's (seconds per all-reduce);
    after ``step`` (a compute step, :func:`_model_step`), with the ranks'
    waits (:func:`_after_compute`)."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
    if step is not None:
        return _after_compute(tensor, plan, device, group, step)
    warm = [_timed_loop(tensor, 1, device, group) for _ in range(max(1, plan.warmup))]
    iters = _agreed_iters(min(warm), device)
    times = torch.tensor([_timed_loop(tensor, iters, device, group) / iters
                          for _ in range(plan.repeats)], dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    return times.tolist()


def _after_compute(tensor, plan: CommPlan, device, group, step) -> dict:
    """Repeats of (a training step, all-reduce): the last rank's all-reduce time of each,
    the mean rank's wait for it (mean of the ranks' times − the last one's), and how long
    the steps took side by side against one rank alone. Alone is timed just before and
    after the repeats: a shared host's speed drifts by tens of percent within a run, and
    the ratio must compare steps of the same moment."""
    import torch.distributed as dist

    for _ in range(plan.warmup):
        step()
        dist.all_reduce(tensor, group=group)
    alone_before = _alone(step, device, group)
    mine, computed = [], []
    for _ in range(plan.repeats):
        start = time.perf_counter()
        step()
        _sync(device)
        computed.append(time.perf_counter() - start)
        dist.all_reduce(tensor, group=group)
        _sync(device)
        mine.append(time.perf_counter() - start - computed[-1])
    alone_after = _alone(step, device, group)
    times = _gathered(mine, device, group)  # ranks x repeats
    last = times.min(dim=0).values
    return {"times": last.tolist(), "waits": (times.mean(dim=0) - last).tolist(),
            "compute_s": float(_gathered(computed, device, group).mean()),
            "compute_alone_s": float(_gathered([alone_before, alone_after], device,
                                               group).mean())}


def _gathered(values: List[float], device, group):
    """Every rank's ``values``, as a (ranks, len) CPU tensor."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).cpu()


def _model_step(compute_s: float, device, group):
    """A training step of kosmoss's MLP (forward, backward, Adam) on as many rows as last
    about ``compute_s`` on one rank alone (the same rows on every rank: the slowest
    rank's count). Each rank times itself while the others wait, so the repeats show what
    ranks computing side by side cost each other (memory, caches)."""
    import torch
    import torch.distributed as dist

    from ..model import mlp
    from ..scaling.allreduce import MODEL_SHAPE

    n_x, hidden, n_y = MODEL_SHAPE
    model = mlp(n_x, hidden, n_y).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-6)

    def run(rows: int):
        inputs = torch.randn(rows, n_x, device=device)

        def step():
            optimizer.zero_grad(set_to_none=True)
            model(inputs).square().mean().backward()
            optimizer.step()
        return step

    rows, alone = 64, 0.0
    for _ in range(2):  # from 64 rows, then once more from the first guess: Adam's cost
        step = run(rows)  # does not grow with the rows, so one guess undershoots
        alone = _alone(step, device, group)
        guess = torch.tensor([rows * compute_s / alone], dtype=torch.float64, device=device)
        dist.all_reduce(guess, op=dist.ReduceOp.MIN, group=group)
        rows = max(1, min(MAX_COMPUTE_ROWS, int(float(guess))))
    return run(rows)  # timed alone beside each size's repeats (_after_compute)


def _alone(step, device, group, times: int = 3) -> float:
    """Seconds of one ``step`` on this rank while every other rank waits (a warm-up step,
    then the median of ``times``)."""
    import statistics

    import torch.distributed as dist

    taken = []
    for turn in range(dist.get_world_size(group)):
        dist.barrier(group=group)
        if turn == dist.get_rank(group):
            step()
            for _ in range(times):
                start = time.perf_counter()
                step()
                _sync(device)
                taken.append(time.perf_counter() - start)
    dist.barrier(group=group)
    return statistics.median(taken)


def _timed_loop(tensor, iters: int, device, group) -> float:
    import torch.distributed as dist

    dist.barrier(group=group)
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    _sync(device)
    return time.perf_counter() - start


def _agreed_iters(warm_s: float, device) -> int:
    """Enough back-to-back all-reduces to last MIN_REPEAT_S; every rank must use the same."""
    import torch
    import torch.distributed as dist

    slowest = torch.tensor([warm_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return max(1, min(1000, math.ceil(MIN_REPEAT_S / max(float(slowest), 1e-7))))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plan_as_dict(plan: CommPlan) -> dict:
    return {**asdict(plan), "sizes": list(plan.sizes), "ranks_per_node": plan.ranks_per_node,
            "groups": list(plan.groups)}
