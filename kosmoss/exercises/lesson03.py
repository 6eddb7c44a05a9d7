"""Lesson 03 (data parallelism): average gradients by hand and match DDP, at 2, 3 and 4
gloo processes; split a global batch over the ranks as ``kosmoss.scaling.arithmetic.plan`` does.

    kosmoss check 03
"""
from __future__ import annotations

import re

from typing import List

from .core import (Exercise, LearnerRaised, Mistake, failed, is_integer, learner,
                   number_hint, passed)
from .tolerance import gamma

ROWS = 10  # the batch: shards of 5 and 5, 3-3-4, 2-3-2-3 rows — uneven at 3 and 4 ranks


# ---------------------------------------------------------------- 03.average_gradients

AVERAGE_STATEMENT = """\
**Average the gradients over the ranks by hand with `all_reduce`, and match DDP.**

Write `average_gradients(model)`. It is called on every rank after `loss.backward()` on
that rank's shard of the batch; it must replace every parameter's `.grad` by the average
of that gradient over all ranks, in place, with `torch.distributed.all_reduce` (the
process group is already initialised; `dist.get_world_size()` says how many ranks).
The checker runs your cell at 2, 3 and 4 gloo processes (the shards are not all the
same size) and compares your gradients with those DistributedDataParallel computes for
the same model and shards, layer by layer, to float32 rounding.
"""

AVERAGE_SKELETON = """
import torch
import torch.distributed as dist


def average_gradients(model):
    \"\"\"After backward on this rank's shard: every parameter's .grad becomes its
    average over all ranks (in place).\"\"\"
    raise NotImplementedError("your code here")
"""

AVERAGE_REFERENCE = """
import torch
import torch.distributed as dist


def average_gradients(model):
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad /= world_size
"""

AVERAGE_WRONG = {
    "sum, not average": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
""", "the sum over the ranks"),
    "divides, never reduces": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        parameter.grad /= dist.get_world_size()
""", "all-reduce it first"),
    "weights only": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for name, parameter in model.named_parameters():
        if name.endswith("weight"):
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
""", "on layer 0 (bias)"),
    "divides by 2, the lesson's world size": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= 2
""", "divided by 2, not by the world size", wrong_at=(3, 4)),
    "reduces a copy": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        grad = parameter.grad.clone()
        dist.all_reduce(grad)
        grad = grad / dist.get_world_size()
""", "all_reduce writes into the tensor it is given"),
    "compresses to float16 for the all-reduce": Mistake("""
import torch
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        half = parameter.grad.to(torch.float16)  # half the bytes on the wire
        dist.all_reduce(half)
        parameter.grad.copy_(half.float() / dist.get_world_size())
""", "the rounding of a 16-bit float"),
    "reduce to rank 0 only": Mistake("""
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        dist.reduce(parameter.grad, dst=0)
        parameter.grad /= dist.get_world_size()
""", "every rank must end with the average"),
}


def _tiny_problem(rank: int, world_size: int):
    """The same small model and batch on every rank, and this rank's shard of it."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.SiLU(), nn.Linear(5, 3))
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(ROWS, 6, generator=generator), torch.randn(ROWS, 3, generator=generator)
    rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
    return model, x[rows], y[rows]


def _gradients(model) -> List:
    return [parameter.grad.detach().clone() for parameter in model.parameters()]


def _parameters(model) -> List:
    return [parameter.detach().clone() for parameter in model.parameters()]


def average_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    import copy

    from torch.nn.functional import mse_loss
    from torch.nn.parallel import DistributedDataParallel

    model, x, y = _tiny_problem(rank, world_size)
    replica = copy.deepcopy(model)
    ddp = DistributedDataParallel(replica)  # the reference first: every rank always reaches it
    mse_loss(ddp(x), y).backward()
    expected = _gradients(replica)
    mine = copy.deepcopy(model)
    mse_loss(mine(x), y).backward()
    local = _gradients(mine)
    holders = [p.grad for p in mine.parameters()]  # what DDP's buckets, or a hook, hold
    storages = [p.grad.data_ptr() for p in mine.parameters()]  # `.grad.data = ...` moves it
    learner(namespace, "average_gradients")(mine)
    return {"names": [name for name, _ in model.named_parameters()], "mine": _gradients(mine),
            "ddp": expected, "local": local,
            "moved": any(bool((a != b).any()) for a, b in zip(_parameters(mine),
                                                               _parameters(model))),
            "replaced": [name for (name, p), held, storage in zip(mine.named_parameters(),
                                                                  holders, storages)
                         if p.grad is not held or p.grad.data_ptr() != storage]}


def average_tolerance(locals_: List, index: int):
    """Per element: the float32 error of averaging n gradients, in any order — n − 1
    additions and one division, γ_n relative to Σ|g_r| / n (Higham 2002, §4.2) — and
    one rounding more for DDP's bucket, which divides before it sums."""
    import torch

    n = len(locals_)
    total = sum(local[index].double().abs() for local in locals_)
    return gamma(n + 1) * total / n + torch.finfo(torch.float32).tiny


def average_judge(ranks: List[dict]) -> tuple:
    n = len(ranks)
    locals_ = [result["local"] for result in ranks]
    for index, name in enumerate(ranks[0]["names"]):
        exact = sum(local[index].double() for local in locals_) / n
        tolerance = average_tolerance(locals_, index)
        for rank, result in enumerate(ranks):
            if float((result["ddp"][index].double() - exact).abs().sub(tolerance).max()) > 0:
                return failed(f"the checker's reference, DDP, is outside its own tolerance on "
                              f"{_layer(name)}: please report it")
            mine = result["mine"][index]
            if mine.shape != exact.shape:
                return failed(f"rank {rank}: your gradient of {_layer(name)} has shape "
                              f"{tuple(mine.shape)}, DDP's {tuple(exact.shape)}")
            gap = (mine.double() - exact).abs()
            if float((gap - tolerance).max()) > 0:
                return failed(f"your averaged gradient differs from DDP's by "
                              f"{float(gap.max()):.1e} on {_layer(name)}, rank {rank}"
                              + _why(mine.double(), exact, result, index, n, ranks))
    replaced = next((r["replaced"] for r in ranks if r.get("replaced")), None)
    if replaced:
        return failed(f"the right averages, but {_layer(replaced[0])}'s .grad is a new tensor "
                      "(or new memory behind the old one: `.grad.data = ...`), not the one "
                      "backward filled: average it in place (all_reduce on p.grad, "
                      "then p.grad /= world size, or p.grad.copy_(...)) — whatever holds the "
                      "gradient tensor (DDP's buckets, a hook) would keep the unaveraged one")
    return passed(f"your averaged gradients equal DDP's on every layer of all {n} ranks, to "
                  "float32 rounding")


def _layer(name: str) -> str:
    module, _, kind = name.rpartition(".")
    return f"layer {module} ({kind})"


def _why(mine, exact, result: dict, index: int, n: int, ranks: List[dict]) -> str:
    import torch

    def close(a, b):
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-7))

    local = result["local"][index].double()
    if result["moved"]:
        return (": your code changed the parameters themselves — average each parameter's "
                ".grad, not the parameter")
    for divisor in range(1, 2 * n + 1):
        if close(mine, exact * n / divisor) and divisor != n:
            if divisor == 1:
                return (f": it is {n}x DDP's — the sum over the ranks; divide by the world "
                        "size")
            return (f": it is the sum over the ranks divided by {divisor}, not by the world "
                    f"size ({n}) — ask dist.get_world_size()")
    others = [r["mine"][index].double() for r in ranks]
    if any(close(other, exact) for other in others):
        return (": another rank holds the average, this one does not — every rank must end "
                "with the average (all_reduce, not reduce)")
    if close(mine, local):
        return (": it is this rank's own gradient — it was not all-reduced (all_reduce "
                "writes into the tensor it is given: reduce .grad itself)")
    if close(mine, local / n):
        return ": it is this rank's own gradient divided by the world size — all-reduce it first"
    relative = float((mine - exact).abs().max() / exact.abs().max())
    if relative < 1e-2:  # float16 keeps 11 bits: 5e-4, grown by the sum
        return (f": off by about {relative:.0e} of the gradient's size — the rounding of a "
                "16-bit float; DDP all-reduces float32 (a compression hook such as "
                "fp16_compress_hook trades that accuracy for bytes)")
    return ""


# ---------------------------------------------------------------- 03.per_device_batch

BATCH_STATEMENT = """\
**Split a global batch over the ranks, refusing what does not divide.**

Write `per_device_batch(global_batch_size, num_nodes, devices_per_node)`: the number of
columns (an integer) one rank's forward pass sees when `--batch-size` is the global
batch and the world is `num_nodes × devices_per_node` ranks. When the global batch
cannot be split evenly (not a multiple of the world size, or fewer columns than ranks:
zero and negative batches included), raise a `ValueError` whose message says why, instead
of training with another batch than the one asked for. The checker compares with what
`kosmoss.scaling.arithmetic.plan` accepts and refuses on a range of set-ups, without
calling it from your cell.
"""

BATCH_SKELETON = """
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    \"\"\"Columns per rank; ValueError when the global batch does not split evenly.\"\"\"
    raise NotImplementedError("your code here")
"""

BATCH_REFERENCE = """
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size < world_size or global_batch_size % world_size:
        raise ValueError(f"a global batch of {global_batch_size} does not split over "
                         f"{world_size} ranks: use a multiple of {world_size}")
    return global_batch_size // world_size
"""

BATCH_WRONG = {
    "floor division (the original course)": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    return global_batch_size // (num_nodes * devices_per_node)
""", "another batch than the one asked for"),
    "forgets the nodes": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    if global_batch_size % devices_per_node:
        raise ValueError("not divisible")
    return global_batch_size // devices_per_node
""", "the world is nodes × devices per node"),
    "true division": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size % world_size:
        raise ValueError(f"{global_batch_size} is not a multiple of {world_size}")
    return global_batch_size / world_size
""", "a batch size is an integer"),
    "checks the remainder only": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size % world_size:
        raise ValueError(f"{global_batch_size} is not a multiple of {world_size}")
    return global_batch_size // world_size
""", "no column"),
    "an assert instead of a ValueError": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    assert global_batch_size >= world_size and global_batch_size % world_size == 0
    return global_batch_size // world_size
""", "raise a ValueError"),
    "rounds up": Mistake("""
import math


def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    return math.ceil(global_batch_size / (num_nodes * devices_per_node))
""", "another batch than the one asked for"),
    "refuses one column per rank": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size <= world_size or global_batch_size % world_size:
        raise ValueError(f"a global batch of {global_batch_size} does not split over "
                         f"{world_size} ranks")
    return global_batch_size // world_size
""", "but it splits evenly"),
    "a refusal that does not say why": Mistake("""
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size < world_size or global_batch_size % world_size:
        raise ValueError()
    return global_batch_size // world_size
""", "says why"),
}

BATCH_CASES = ((256, 1, 2), (512, 2, 2), (96, 3, 4), (12, 2, 3), (64, 1, 1), (2, 1, 2),
               (250, 1, 4), (130, 2, 2), (3, 1, 4), (0, 1, 2), (126, 1, 2))
BATCH_CASES += ((-4, 1, 2),)  # after 0: a test for == 0 misses a negative batch


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
            message = _refused(mine, setup, refusal, (global_batch, nodes, per_node))
            if message:
                return failed(message)
            continue
        try:
            got = mine(global_batch, nodes, per_node)
        except LearnerRaised as raised:
            if not isinstance(raised.original, ValueError):
                raise
            return failed(f"for {setup} yours refused ({raised.original}), but it splits "
                          f"evenly: {expected} columns per device")
        if not is_integer(got):
            return failed(f"for {setup} yours returned {got!r}: " + number_hint(
                got, "a batch size is an integer (a DataLoader refuses a float); use // once "
                "you know it divides"))
        if got != expected:
            hint = (": the world is nodes × devices per node"
                    if got == global_batch // per_node and nodes > 1 else "")
            return failed(f"for {setup} yours returned {got!r}, the per-device batch is "
                          f"{expected}{hint}")
    return passed(f"your split matches kosmoss.scaling.arithmetic.plan on {len(BATCH_CASES)} "
                  "set-ups, refusals included")


def _refused(mine, setup: str, refusal, args):
    """None when the learner refused as the statement asks, else what is wrong."""
    try:
        got = mine(*args)
    except LearnerRaised as raised:
        err = raised.original
        if isinstance(err, ValueError) and _says_why(str(err), args):
            return None
        if isinstance(err, ValueError) and str(err).strip():
            return (f"for {setup} yours refused with {str(err).strip()!r}, which does not say "
                    "why: name the numbers (the batch and the world size) or what is wrong "
                    "(not a multiple of the ranks, fewer columns than ranks)")
        if isinstance(err, ValueError):
            return (f"for {setup} yours raised a ValueError with no message: a refusal says "
                    "why (and what to use instead)")
        return (f"for {setup} yours raised {type(err).__name__}; raise a ValueError that says "
                "why (an assert disappears under python -O, and is no message for a user)")
    hint = (" — a rank with no column to train on" if got == 0 else
            " — a negative batch is fewer columns than ranks too" if is_integer(got) and got < 0
            else "")
    return (f"for {setup} yours returned {got!r}{hint}; kosmoss refuses it ({refusal}) — "
            "training on another batch than the one asked for, without a word, was the "
            "original course's bug")


# Words of a reason why a batch does not split; a message with none of them, and neither
# the batch nor the world size, does not say why ("oops", "must be a power of two").
REASONS = ("divid", "multiple", "split", "even", "world", "rank", "device", "process", "node",
           "fewer", "less", "small", "positive", "zero", "negative", "at least", "remainder")


def _says_why(message: str, args) -> bool:
    global_batch, nodes, per_node = args
    numbers = set(re.findall(r"-?\d+", message))
    named = {str(global_batch), str(nodes * per_node)} & numbers
    return bool(named) or any(word in message.lower() for word in REASONS)


EXERCISES = [
    Exercise("03.average_gradients", AVERAGE_STATEMENT, AVERAGE_SKELETON, AVERAGE_REFERENCE,
             AVERAGE_WRONG, average_judge, rank_task=average_rank_task,
             names=("average_gradients",), forbidden=("torch.nn.parallel",)),
    Exercise("03.per_device_batch", BATCH_STATEMENT, BATCH_SKELETON, BATCH_REFERENCE,
             BATCH_WRONG, batch_judge, names=("per_device_batch",),
             forbidden=("kosmoss.scaling",)),
]
