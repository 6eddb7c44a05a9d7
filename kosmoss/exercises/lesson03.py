"""Lesson 03 (data parallelism): average gradients by hand and match DDP, in 2 gloo
processes; split a global batch over the ranks as ``kosmoss.scaling.arithmetic.plan`` does.

    kosmoss check 03
"""
from __future__ import annotations

from typing import List

from .core import Exercise, failed, learner, passed

TOLERANCE = 1e-6  # float32 sums in a different order differ by ~1e-8 here


# ---------------------------------------------------------------- 03.average_gradients

AVERAGE_STATEMENT = """\
**Average the gradients over the ranks by hand with `all_reduce`, and match DDP.**

Write `average_gradients(model)`. It is called on every rank after `loss.backward()` on
that rank's shard of the batch; it must replace every parameter's `.grad` by the average
of that gradient over all ranks, in place, with `torch.distributed.all_reduce` (the
process group is already initialised; `dist.get_world_size()` says how many ranks).
The checker runs your cell in two gloo processes and compares your gradients with those
DistributedDataParallel computes for the same model and shards, layer by layer.
"""

AVERAGE_SKELETON = '''
import torch
import torch.distributed as dist


def average_gradients(model):
    """After backward on this rank's shard: every parameter's .grad becomes its
    average over all ranks (in place)."""
    raise NotImplementedError("your code here")
'''

AVERAGE_REFERENCE = '''
import torch
import torch.distributed as dist


def average_gradients(model):
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad /= world_size
'''

AVERAGE_WRONG = {
    "sum, not average": '''
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
''',
    "divides, never reduces": '''
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        parameter.grad /= dist.get_world_size()
''',
    "weights only": '''
import torch.distributed as dist


def average_gradients(model):
    for name, parameter in model.named_parameters():
        if name.endswith("weight"):
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
''',
}


def _tiny_problem(rank: int, world_size: int):
    """The same small model and batch on every rank, and this rank's shard of it."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.SiLU(), nn.Linear(5, 3))
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=generator), torch.randn(8, 3, generator=generator)
    rows = slice(rank * 8 // world_size, (rank + 1) * 8 // world_size)
    return model, x[rows], y[rows]


def _gradients(model) -> List:
    return [parameter.grad.detach().clone() for parameter in model.parameters()]


def average_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    import copy

    import torch
    from torch.nn.functional import mse_loss
    from torch.nn.parallel import DistributedDataParallel

    model, x, y = _tiny_problem(rank, world_size)
    replica = copy.deepcopy(model)
    ddp = DistributedDataParallel(replica)  # the reference first: both ranks always reach it
    mse_loss(ddp(x), y).backward()
    expected = _gradients(replica)
    mine = copy.deepcopy(model)
    mse_loss(mine(x), y).backward()
    local = _gradients(mine)
    learner(namespace, "average_gradients")(mine)
    names = [name for name, _ in model.named_parameters()]
    return {"names": names, "mine": _gradients(mine), "ddp": expected, "local": local,
            "world_size": world_size, "dtype": str(torch.get_default_dtype())}


def _layer(name: str) -> str:
    module, _, kind = name.rpartition(".")
    return f"layer {module} ({kind})"


def average_judge(ranks: List[dict]) -> tuple:
    worst = (0.0, None, None)
    for rank, result in enumerate(ranks):
        for name, mine, ddp, local in zip(result["names"], result["mine"], result["ddp"],
                                          result["local"]):
            if mine.shape != ddp.shape:
                return failed(f"rank {rank}: your gradient of {_layer(name)} has shape "
                              f"{tuple(mine.shape)}, DDP's {tuple(ddp.shape)}")
            gap = float((mine - ddp).abs().max())
            if gap > TOLERANCE:
                return failed(f"your averaged gradient differs from DDP's by {gap:.1e} on "
                              f"{_layer(name)}, rank {rank}" + _why(mine, ddp, local,
                                                                     result["world_size"]))
            if gap >= worst[0]:
                worst = (gap, name, rank)
    return passed(f"your averaged gradients equal DDP's on every layer of both ranks "
                  f"(largest difference {worst[0]:.1e})")


def _why(mine, ddp, local, world_size: int) -> str:
    import torch

    def close(a, b):
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-7))

    if close(mine, ddp * world_size):
        return f": it is {world_size}x DDP's — the sum over the ranks; divide by the world size"
    if close(mine, local):
        return ": it is this rank's own gradient — it was not all-reduced"
    if close(mine, local / world_size):
        return (": it is this rank's own gradient divided by the world size — all-reduce "
                "it first")
    return ""


# ---------------------------------------------------------------- 03.per_device_batch

BATCH_STATEMENT = """\
**Split a global batch over the ranks, refusing what does not divide.**

Write `per_device_batch(global_batch_size, num_nodes, devices_per_node)`: the number of
columns one rank's forward pass sees when `--batch-size` is the global batch and the
world is `num_nodes × devices_per_node` ranks. When the global batch cannot be split
evenly (not a multiple of the world size, or fewer columns than ranks), raise a
`ValueError` that says why, instead of training with another batch than the one asked
for. The checker compares with `kosmoss.scaling.arithmetic.plan` on a range of set-ups.
"""

BATCH_SKELETON = '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    """Columns per rank; ValueError when the global batch does not split evenly."""
    raise NotImplementedError("your code here")
'''

BATCH_REFERENCE = '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size < world_size or global_batch_size % world_size:
        raise ValueError(f"a global batch of {global_batch_size} does not split over "
                         f"{world_size} ranks: use a multiple of {world_size}")
    return global_batch_size // world_size
'''

BATCH_WRONG = {
    "floor division (the original course)": '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    return global_batch_size // (num_nodes * devices_per_node)
''',
    "forgets the nodes": '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    if global_batch_size % devices_per_node:
        raise ValueError("not divisible")
    return global_batch_size // devices_per_node
''',
}

BATCH_CASES = ((256, 1, 2), (512, 2, 2), (96, 3, 4), (64, 1, 1), (250, 1, 4), (130, 2, 2),
               (3, 1, 4), (126, 1, 2))


def batch_judge(namespace: dict) -> tuple:
    from ..core.errors import UsageError
    from ..scaling.arithmetic import plan

    mine = learner(namespace, "per_device_batch")
    for global_batch, nodes, per_node in BATCH_CASES:
        setup = f"a global batch of {global_batch} on {nodes} node(s) x {per_node} device(s)"
        try:
            expected = plan(global_batch, 1e-3, num_nodes=nodes,
                            devices_per_node=per_node).per_device_batch_size
        except UsageError as refusal:
            try:
                got = mine.raw(global_batch, nodes, per_node)
            except NotImplementedError:
                mine(global_batch, nodes, per_node)  # reports "not answered yet"
            except Exception:
                continue  # refused, as it should
            return failed(f"for {setup} yours returned {got!r}; kosmoss refuses it "
                          f"({refusal}) — training on another batch than the one asked for, "
                          "without a word, was the original course's bug")
        got = mine(global_batch, nodes, per_node)
        if got != expected:
            return failed(f"for {setup} yours returned {got!r}, the per-device batch is "
                          f"{expected}")
    return passed(f"your split matches kosmoss.scaling.arithmetic.plan on {len(BATCH_CASES)} set-ups, "
                  "refusals included")


EXERCISES = [
    Exercise("03.average_gradients", AVERAGE_STATEMENT, AVERAGE_SKELETON, AVERAGE_REFERENCE,
             AVERAGE_WRONG, average_judge, rank_task=average_rank_task,
             names=("average_gradients",)),
    Exercise("03.per_device_batch", BATCH_STATEMENT, BATCH_SKELETON, BATCH_REFERENCE,
             BATCH_WRONG, batch_judge, names=("per_device_batch",)),
]
