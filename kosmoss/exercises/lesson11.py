"""Lesson 11 (memory and beyond DDP): one optimizer step from micro-batches (gradient
accumulation), checked against the full batch's step; a ZeRO-1 step that keeps only this
rank's share of the optimizer state, checked in 2 gloo processes against plain SGD.

    kosmoss check 11
"""
from __future__ import annotations

from typing import List

from .core import Exercise, failed, learner, passed

TOLERANCE = 1e-6
LR, MOMENTUM = 0.1, 0.9

# ---------------------------------------------------------------- 11.accumulate

ACCUMULATE_STATEMENT = """\
**Take one optimizer step on a large batch from micro-batches (gradient accumulation).**

Write `accumulated_step(model, optimizer, x, y, micro_batches)`. It must take exactly the
optimizer step that one forward and backward of the mean-squared-error loss on the whole
batch `(x, y)` followed by `optimizer.step()` would take — but run the model on
`micro_batches` equal slices of the batch, one after the other, so that only one slice's
activations are in memory at a time. The batch size is a multiple of `micro_batches`.
Start from zeroed gradients. The checker compares your weights after the step with the
full batch's (plain SGD, so that any scale error shows), and watches the size of every
forward pass.
"""

ACCUMULATE_SKELETON = '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    """One optimizer step on (x, y), computed in micro_batches slices."""
    raise NotImplementedError("your code here")
'''

ACCUMULATE_REFERENCE = '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        # backward adds into .grad; the mean over the batch is the mean of the slices' means
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) / micro_batches
        loss.backward()
    optimizer.step()
'''

ACCUMULATE_WRONG = {
    "sums the slices' losses": '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        torch.nn.functional.mse_loss(model(x_part), y_part).backward()
    optimizer.step()
''',
    "zero_grad in the loop": '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    for x_part, y_part in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        optimizer.zero_grad()
        (torch.nn.functional.mse_loss(model(x_part), y_part) / micro_batches).backward()
    optimizer.step()
''',
    "the whole batch at once": '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
''',
}

ACCUMULATE_CASES = ((32, 4), (24, 3), (16, 1))  # (batch, micro-batches)


def _small_model(seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.SiLU(), nn.Linear(16, 5))


def accumulate_judge(namespace: dict) -> tuple:
    import copy

    import torch

    mine = learner(namespace, "accumulated_step")
    for batch, micro in ACCUMULATE_CASES:
        generator = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 12, generator=generator)
        y = torch.randn(batch, 5, generator=generator)
        reference, model = _small_model(), _small_model()
        start = copy.deepcopy(reference)
        full = torch.optim.SGD(reference.parameters(), lr=LR)
        full.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        full.step()
        seen = []
        hook = model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
        try:
            mine(model, torch.optim.SGD(model.parameters(), lr=LR), x, y, micro)
        finally:
            hook.remove()
        last = copy.deepcopy(start)  # what zeroing the gradients in the loop leaves
        torch.optim.SGD(last.parameters(), lr=LR).zero_grad()
        (torch.nn.functional.mse_loss(last(x[-(batch // micro):]), y[-(batch // micro):])
         / micro).backward()
        torch.optim.SGD(last.parameters(), lr=LR).step()
        message = _accumulate_mistake(model, reference, start, last, seen, batch, micro)
        if message:
            return failed(f"batch {batch} in {micro} micro-batch(es): {message}")
    return passed(f"the same step as the full batch in {len(ACCUMULATE_CASES)} cases, one "
                  "micro-batch in memory at a time")


def _accumulate_mistake(model, reference, start, last, seen: List[int], batch: int, micro: int):

    if seen != [batch // micro] * micro:
        return (f"your forward passes saw {seen} columns; accumulation runs {micro} of "
                f"{batch // micro} each, so that one slice's activations are in memory at a time")
    moved = [(p - s).detach() for p, s in zip(model.parameters(), start.parameters())]
    expected = [(r - s).detach() for r, s in zip(reference.parameters(), start.parameters())]
    gap = max(float((m - e).abs().max()) for m, e in zip(moved, expected))
    if gap <= TOLERANCE:
        return None
    ratio = float(sum((m * e).sum() for m, e in zip(moved, expected))
                  / sum((e * e).sum() for e in expected))
    if abs(ratio - micro) < 1e-3 * micro:
        return (f"your step is {micro}x the full batch's: each slice's loss is a mean over the "
                f"slice; divide it by micro_batches before backward")
    if max(float((m - l).detach().abs().max()) for m, l in zip(model.parameters(),
                                                                last.parameters())) <= TOLERANCE:
        return ("your step follows the last slice only: backward adds into .grad, so zero "
                "the gradients once, before the loop")
    return f"your weights differ from the full batch's step by {gap:.2g}"


# ---------------------------------------------------------------- 11.zero1_step

ZERO_STATEMENT = """\
**Write a ZeRO-1 optimizer step: each rank keeps and updates only its share.**

Write `zero1_step(params, state, lr)`. It is called on every rank after backward, when
every parameter's `.grad` already holds the gradient averaged over the ranks (DDP did
that), so all ranks hold the same parameters and gradients. It must apply SGD with
momentum `0.9` — for each parameter, `buf = 0.9 * buf + grad` (`buf` starts at zero),
then `param -= lr * buf` — but sharded as ZeRO stage 1 does: parameter `i` of `params`
belongs to rank `i % world_size` (`params` come sorted by size, largest first, so that
this spreads the bytes); a rank keeps the momentum buffers of its own
parameters only (in `state`, a dict you fill, kept between calls), updates only those,
and then every parameter is broadcast from the rank that owns it, so that all ranks end
with the same weights. The checker runs three steps in two gloo processes and compares
with `torch.optim.SGD(momentum=0.9)` on one process, and measures what each rank keeps
in `state`.
"""

ZERO_SKELETON = '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    """SGD with momentum 0.9, each rank owning parameters i % world_size == rank."""
    raise NotImplementedError("your code here")
'''

ZERO_REFERENCE = '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index, param in enumerate(params):
            owner = index % world_size
            if owner == rank:
                buf = state.setdefault(index, torch.zeros_like(param))
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
            dist.broadcast(param, src=owner)  # every rank calls it, in the same order
'''

ZERO_WRONG = {
    "every rank keeps every buffer": '''
import torch


def zero1_step(params, state, lr):
    with torch.no_grad():
        for index, param in enumerate(params):
            buf = state.setdefault(index, torch.zeros_like(param))
            buf.mul_(0.9).add_(param.grad)
            param.sub_(lr * buf)
''',
    "no broadcast": '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index, param in enumerate(params):
            if index % world_size == rank:
                buf = state.setdefault(index, torch.zeros_like(param))
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
''',
}

ZERO_STEPS = 3


def _zero_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 8), nn.SiLU(), nn.Linear(8, 6), nn.SiLU(), nn.Linear(6, 3))


def _set_gradients(model, step: int) -> None:
    """The averaged gradient DDP would leave: the same on every rank, new each step."""
    import torch

    generator = torch.Generator().manual_seed(step)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=generator)


def _tensor_elements(value) -> int:
    import torch

    if torch.is_tensor(value):
        return value.numel()
    if isinstance(value, dict):
        return sum(_tensor_elements(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_elements(v) for v in value)
    return 0


def zero_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    import torch

    reference = _zero_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    model = _zero_model()
    # Largest first, as ZeroRedundancyOptimizer sorts them: i % world_size then spreads bytes.
    params = sorted(model.parameters(), key=lambda p: p.numel(), reverse=True)
    state: dict = {}
    step = learner(namespace, "zero1_step")
    for index in range(ZERO_STEPS):
        _set_gradients(reference, index)
        optimizer.step()
        _set_gradients(model, index)
        step(params, state, LR)
    owned = sum(p.numel() for i, p in enumerate(params) if i % world_size == rank)
    return {"weights": torch.cat([p.detach().flatten() for p in model.parameters()]),
            "expected": torch.cat([p.detach().flatten() for p in reference.parameters()]),
            "kept": _tensor_elements(state), "owned": owned,
            "all": sum(p.numel() for p in params)}


def zero_judge(ranks: List[dict]) -> tuple:
    first, second = ranks[0]["weights"], ranks[1]["weights"]
    if float((first - second).abs().max()) > TOLERANCE:
        return failed("rank 0 and rank 1 hold different weights after the steps: each rank "
                      "updated only its own parameters; broadcast every parameter from the "
                      "rank that owns it")
    gap = float((first - ranks[0]["expected"]).abs().max())
    if gap > TOLERANCE:
        return failed(f"your weights differ from torch.optim.SGD(momentum=0.9) by {gap:.2g} "
                      f"after {ZERO_STEPS} steps")
    for rank, result in enumerate(ranks):
        if result["kept"] != result["owned"]:
            return failed(f"rank {rank} keeps {result['kept']} elements of optimizer state for "
                          f"the {result['owned']} of the parameters it owns (all of them: "
                          f"{result['all']}); ZeRO-1 keeps only the owner's share on each rank")
    return passed(f"the weights of torch's SGD with momentum after {ZERO_STEPS} steps, with "
                  f"{ranks[0]['kept']} and {ranks[1]['kept']} elements of state on the two "
                  f"ranks instead of {ranks[0]['all']} on each")


EXERCISES = [
    Exercise("11.accumulate", ACCUMULATE_STATEMENT, ACCUMULATE_SKELETON, ACCUMULATE_REFERENCE,
             ACCUMULATE_WRONG, accumulate_judge, names=("accumulated_step",)),
    Exercise("11.zero1_step", ZERO_STATEMENT, ZERO_SKELETON, ZERO_REFERENCE, ZERO_WRONG,
             zero_judge, rank_task=zero_rank_task, names=("zero1_step",)),
]
