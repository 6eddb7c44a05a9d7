"""Lesson 08 (benchmarks): a model's training memory, checked against a measurement;
algorithm bandwidth against bus bandwidth of an all-reduce.

    kosmoss check 08
"""
from __future__ import annotations

import math
from typing import Dict

from .core import Exercise, failed, learner, number, passed, show

# ---------------------------------------------------------------- 08.training_memory

MEMORY_STATEMENT = """\
**Compute a model's training memory and check it against a measurement.**

Write `training_memory(model, batch_size)`: the bytes one training step with Adam needs
for `model` (an `nn.Sequential` of `nn.Linear` and activation layers, float32) on a batch
of `batch_size` columns: parameters + gradients + Adam's two states per parameter +
activations, the tensors autograd keeps for the backward pass — here the input batch,
the output of every layer (each `Linear` and each activation) and the loss's targets
(as large as the last output). The checker measures a real step (tensor sizes,
autograd's saved tensors, the optimizer's state) on two models and compares (within one percent).
"""

MEMORY_SKELETON = '''
import torch
from torch import nn


def training_memory(model, batch_size):
    """Bytes: parameters + gradients + Adam states + activations, float32."""
    raise NotImplementedError("your code here")
'''

MEMORY_REFERENCE = '''
import torch
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features  # the input batch
    features = linears[0].in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            features = layer.out_features
        width += features  # every layer's output, activations keep their input's size
    width += linears[-1].out_features  # the targets
    return 4 * (params * (1 + 1 + 2) + batch_size * width)
'''

MEMORY_WRONG = {
    "no Adam states": '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features + linears[-1].out_features
    features = linears[0].in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            features = layer.out_features
        width += features
    return 4 * (2 * params + batch_size * width)
''',
    "activations of one column": '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features + linears[-1].out_features
    features = linears[0].in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            features = layer.out_features
        width += features
    return 4 * (4 * params + width)
''',
}

MODELS = (((300, 100, 100, 100, 552), 64), ((40, 64, 16), 200))


def build(sizes, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers = []
    for size_in, size_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(size_in, size_out), nn.SiLU()]
    return nn.Sequential(*layers[:-1])  # no activation after the last Linear


def measure(model, batch_size: int) -> Dict[str, int]:
    """Bytes of one Adam step: parameters, gradients, optimizer state, and the tensors
    autograd saved for backward (parameters excluded, each storage counted once)."""
    import torch
    from torch.nn.functional import mse_loss

    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    x = torch.randn(batch_size, linears[0].in_features)
    y = torch.randn(batch_size, linears[-1].out_features)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: Dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = mse_loss(model(x), y)
    loss.backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    return {
        "parameters": sum(p.nbytes for p in model.parameters()),
        "gradients": sum(p.grad.nbytes for p in model.parameters()),
        "Adam states": sum(value.nbytes for state in optimizer.state.values()
                           for value in state.values() if torch.is_tensor(value)),
        "activations": sum(saved.values()),
    }


def _mb(value: float) -> str:
    return f"{value / 1e6:.3f} MB"


def memory_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "training_memory")
    for sizes, batch in MODELS:
        parts = measure(build(sizes), batch)
        measured = sum(parts.values())
        got = number(mine(build(sizes), batch))
        model = " -> ".join(map(str, sizes))
        if got is None:
            return failed("training_memory returned no number: return the bytes")
        if abs(got - measured) > 0.01 * measured:
            breakdown = ", ".join(f"{name} {_mb(value)}" for name, value in parts.items())
            return failed(f"for the MLP {model} at batch {batch} yours is {_mb(got)}, the "
                          f"measurement {_mb(measured)} ({breakdown})"
                          + _missing(measured - got, parts))
    return passed(f"within 1 % of the measurement for {len(MODELS)} models "
                  f"({' and '.join(' -> '.join(map(str, s)) for s, _ in MODELS)})")


def _missing(gap: float, parts: Dict[str, int]) -> str:
    """Name the part (or parts) of the measurement the gap matches."""
    for name, value in parts.items():
        if math.isclose(abs(gap), value, rel_tol=0.02):
            return f": {'short of' if gap > 0 else 'over'} it by about the {name}"
    return f": {'short' if gap > 0 else 'over'} by {_mb(abs(gap))}"


# ---------------------------------------------------------------- 08.bandwidths

BANDWIDTH_STATEMENT = """\
**Tell algorithm bandwidth from bus bandwidth for an all-reduce.**

Write `bandwidths(nbytes, seconds, world_size)` returning `(algbw, busbw)` in bytes per
second for an all-reduce of a buffer of `nbytes` bytes that took `seconds` on
`world_size` ranks. The algorithm bandwidth is the buffer size over the time; the bus
bandwidth (nccl-tests' convention) corrects it by the share of the data every rank must
send and receive in an all-reduce, so that it compares with the hardware's link speed
whatever the number of ranks. The checker compares on several sizes and world sizes.
"""

BANDWIDTH_SKELETON = '''
def bandwidths(nbytes, seconds, world_size):
    """(algbw, busbw) of an all-reduce, bytes/s."""
    raise NotImplementedError("your code here")
'''

BANDWIDTH_REFERENCE = '''
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (world_size - 1) / world_size
'''

BANDWIDTH_WRONG = {
    "busbw is algbw": '''
def bandwidths(nbytes, seconds, world_size):
    return nbytes / seconds, nbytes / seconds
''',
    "reduce-scatter factor": '''
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds
    return algbw, algbw * (world_size - 1) / world_size
''',
}

BANDWIDTH_CASES = ((4e8, 0.1, 2), (1e9, 0.5, 8), (2.5e7, 3e-3, 4), (1e6, 1e-3, 1))


def bus_factor(world_size: int) -> float:
    """nccl-tests' PERFORMANCE.md: an all-reduce moves 2(n-1)/n of the buffer per rank."""
    return 2 * (world_size - 1) / world_size


def bandwidth_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "bandwidths")
    for nbytes, seconds, world in BANDWIDTH_CASES:
        got = mine(nbytes, seconds, world)
        try:
            algbw, busbw = (number(v) for v in got)
        except (TypeError, ValueError):
            return failed(f"bandwidths returned {got!r}: return (algbw, busbw)")
        expected = (nbytes / seconds, nbytes / seconds * bus_factor(world))
        for name, value, right in (("algbw", algbw, expected[0]), ("busbw", busbw, expected[1])):
            if value is None or not math.isclose(value, right, rel_tol=1e-9, abs_tol=1e-9):
                return failed(f"{nbytes:.3g} bytes in {seconds:g} s on {world} rank(s): your "
                              f"{name} is {show(value)}, expected {right:.4g} B/s")
    return passed(f"algbw and busbw right in {len(BANDWIDTH_CASES)} cases, one rank included")


EXERCISES = [
    Exercise("08.training_memory", MEMORY_STATEMENT, MEMORY_SKELETON, MEMORY_REFERENCE,
             MEMORY_WRONG, memory_judge, names=("training_memory",)),
    Exercise("08.bandwidths", BANDWIDTH_STATEMENT, BANDWIDTH_SKELETON, BANDWIDTH_REFERENCE,
             BANDWIDTH_WRONG, bandwidth_judge, names=("bandwidths",)),
]
