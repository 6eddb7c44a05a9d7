"""Lesson 08 (benchmarks): a model's training memory, checked against a measurement;
algorithm bandwidth against bus bandwidth of an all-reduce.

    kosmoss check 08
"""
from __future__ import annotations

import functools
import math
from typing import Dict

from .core import Exercise, Mistake, failed, learner, number, passed, show
from .tolerance import FLOAT32_UNIT, float64_close

# ---------------------------------------------------------------- 08.training_memory

MEMORY_STATEMENT = """\
**Compute a model's training memory and check it against a measurement.**

Write `training_memory(model, batch_size)`: the bytes one training step with Adam needs
for `model` (an `nn.Sequential` of `nn.Linear` and `nn.SiLU` layers, float32) on a batch
of `batch_size` columns: parameters + gradients + Adam's two states per parameter (its
step counter, one number per tensor, is not counted) + activations, the tensors autograd
keeps for the backward pass — here the input batch, the output of every layer (each
`Linear` and each activation) and the loss's targets (as large as the last output). The
checker measures a real step (tensor sizes, autograd's saved tensors, the optimizer's
state) on several models, a single `Linear`, layers without a bias and a batch of one
among them, and compares exactly: bytes are counted, not estimated.
"""

MEMORY_SKELETON = """
import torch
from torch import nn


def training_memory(model, batch_size):
    \"\"\"Bytes: parameters + gradients + Adam states + activations, float32.\"\"\"
    raise NotImplementedError("your code here")
"""

MEMORY_REFERENCE = """
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
"""

_WIDTH = """
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features + linears[-1].out_features
    features = linears[0].in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            features = layer.out_features
        width += features
"""


def _memory(params: str, width: str, total: str) -> str:
    return ("\nfrom torch import nn\n\n\ndef training_memory(model, batch_size):\n"
            f"    params = {params}\n{width}    return {total}\n")


_ALL = "sum(p.numel() for p in model.parameters())"
_WEIGHTS = "sum(m.weight.numel() for m in model if isinstance(m, nn.Linear))"

MEMORY_WRONG = {
    "no Adam states": Mistake(_memory(_ALL, _WIDTH, "4 * (2 * params + batch_size * width)"),
                              "Adam's two states"),
    "activations of one column": Mistake(_memory(_ALL, _WIDTH, "4 * (4 * params + width)"),
                                         "every column of the batch"),
    "every bias forgotten": Mistake(_memory(_WEIGHTS, _WIDTH,
                                            "4 * (4 * params + batch_size * width)"),
                                    "the biases"),
    "activation layers keep nothing": Mistake(_memory(_ALL, _WIDTH.replace(
        "        width += features\n", "            width += features\n"),
        "4 * (4 * params + batch_size * width)"), "each activation's output"),
    "no targets": Mistake(_memory(_ALL, _WIDTH.replace(" + linears[-1].out_features", ""),
                                  "4 * (4 * params + batch_size * width)"), "the targets"),
    "float64 sizes": Mistake(_memory(_ALL, _WIDTH, "8 * (4 * params + batch_size * width)"),
                             "4 bytes per float32"),
    "counts Adam's step counter": Mistake(_memory(_ALL, _WIDTH.replace(
        "    width = linears[0]",
        "    tensors = len(list(model.parameters()))\n    width = linears[0]"),
        "4 * (4 * params + tensors + batch_size * width)"), "Adam's step counters"),
    "one Adam state": Mistake(_memory(_ALL, _WIDTH, "4 * (3 * params + batch_size * width)"),
                              "one of Adam's two states"),
    "a bias assumed in every layer": Mistake(_memory(
        "sum(m.in_features * m.out_features + m.out_features for m in model\n"
        "                 if isinstance(m, nn.Linear))", _WIDTH,
        "4 * (4 * params + batch_size * width)"), "these layers have none"),
}

MODELS = (((300, 100, 100, 100, 552), 64), ((40, 64, 16), 200), ((10, 4), 3),
          ((300, 100, 100, 100, 552), 1))
# An MLP that ends with an activation (fluxes are positive): read the layers, assume no shape.
ENDING_IN_SILU = ((40, 64, 16), 8)
# Layers without a bias (nn.Linear(..., bias=False)): count the parameters there are.
WITHOUT_BIASES = ((40, 64, 16), 8)


def build(sizes, seed: int = 0, last_activation: bool = False, bias: bool = True):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers = []
    for size_in, size_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(size_in, size_out, bias=bias), nn.SiLU()]
    return nn.Sequential(*(layers if last_activation else layers[:-1]))


def _judged_models():
    """(what the message calls it, how to build it, batch) for every model judged."""
    cases = [(" -> ".join(map(str, sizes)), functools.partial(build, sizes), batch)
             for sizes, batch in MODELS]
    sizes, batch = ENDING_IN_SILU
    cases.append((" -> ".join(map(str, sizes)) + " -> SiLU",
                  functools.partial(build, sizes, last_activation=True), batch))
    sizes, batch = WITHOUT_BIASES
    return cases + [(" -> ".join(map(str, sizes)) + " without biases",
                     functools.partial(build, sizes, bias=False), batch)]


def measure(model, batch_size: int) -> Dict[str, int]:
    """Bytes of one Adam step: parameters, gradients, Adam's two states per parameter
    (not its step counter), and the tensors autograd saved for backward (parameters
    excluded, each storage counted once)."""
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
        "Adam states": sum(state[name].nbytes for state in optimizer.state.values()
                           for name in ("exp_avg", "exp_avg_sq")),
        "activations": sum(saved.values()),
    }


def _mb(value: float) -> str:
    return f"{value / 1e6:.3f} MB"


def _model_left_changed(model, before: dict):
    """What a measurement by a real training step leaves on the caller's model."""
    import torch

    moved = [name for name, value in model.state_dict().items()
             if not torch.equal(value, before[name])]
    if moved:
        return (f"your training_memory changed the caller's model ({moved[0]} moved): "
                "a real optimizer step on it trains it — measure on a copy "
                "(copy.deepcopy(model)), or count")
    if any(p.grad is not None for p in model.parameters()):
        return ("your training_memory left gradients on the caller's model (.grad filled): "
                "measure on a copy (copy.deepcopy(model)), or count")
    return None


def memory_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "training_memory")
    models = _judged_models()
    for model, made, batch in models:
        parts = measure(made(), batch)
        measured = sum(parts.values())
        given = made()
        before = {name: value.clone() for name, value in given.state_dict().items()}
        got = number(mine(given, batch))
        if got is None:
            return failed("training_memory returned no number: return the bytes")
        if got != measured:
            breakdown = ", ".join(f"{name} {value}" for name, value in parts.items())
            return failed(f"for the MLP {model} at batch {batch} yours is {got:.0f} bytes, the "
                          f"measurement {measured} ({breakdown})"
                          + _missing(got, measured, made(), batch))
        left = _model_left_changed(given, before)
        if left:
            return failed(f"for the MLP {model}: the right bytes, but {left}")
    return passed(f"exactly the measured bytes for {len(models)} models "
                  f"({', '.join(model for model, _, _ in models)})")


def _named_parts(model, batch: int) -> Dict[str, int]:
    """Bytes of the terms a learner may forget, each named."""
    from torch import nn

    linears = [m for m in model if isinstance(m, nn.Linear)]
    params = sum(p.numel() for p in model.parameters())
    biases = sum(m.bias.numel() for m in linears if m.bias is not None)
    hidden = sum(m.out_features for m in linears[:-1])
    return {"Adam's step counters (one number per parameter tensor, which the statement "
            "leaves out)": 4 * len(list(model.parameters())),
            "Adam's two states": 8 * params,
            "one of Adam's two states (or the gradients)": 4 * params,
            "the biases (their values, gradients and Adam's two states)": 16 * biases,
            "each activation's output (as large as its input)": 4 * batch * hidden,
            "the targets": 4 * batch * linears[-1].out_features,
            "the input batch": 4 * batch * linears[0].in_features}


def _out_features(model) -> int:
    from torch import nn

    return [m for m in model if isinstance(m, nn.Linear)][-1].out_features


def _missing(got: float, measured: int, model, batch: int) -> str:
    """Name the term the gap is, when it is one."""
    from torch import nn

    gap = measured - got
    if got == 2 * measured:
        return ": twice the measurement — 4 bytes per float32 number, not 8"
    for unit, size in (("MB", 1e6), ("MiB", 2 ** 20), ("kB", 1e3)):
        if math.isclose(got * size, measured, rel_tol=1e-3):
            return f": that is the measurement in {unit} — return bytes"
    last = list(model)[-1]
    if not isinstance(last, nn.Linear) and gap == 4 * batch * _out_features(model):
        return (": short by the output of the last layer, an activation: autograd keeps it "
                "too — count the outputs of the layers there are, not those of an assumed shape")
    assumed = sum(16 * m.out_features for m in model
                  if isinstance(m, nn.Linear) and m.bias is None)
    if assumed and -gap == assumed:
        return (": over it by a bias for every layer, and these layers have none "
                "(nn.Linear(..., bias=False)) — count the parameters there are "
                "(model.parameters())")
    names = [name for name, value in _named_parts(model, batch).items() if abs(gap) == value]
    if names:
        same = " (the same size here)" if len(names) > 1 else ""
        return f": {'short of' if gap > 0 else 'over'} it by exactly {' or '.join(names)}{same}"
    activations = measure(model, batch)["activations"]
    if batch > 1 and gap == activations * (batch - 1) / batch:
        return ": your activations are one column's — count every column of the batch"
    return f": {'short' if gap > 0 else 'over'} by {abs(gap):.0f} bytes"


# ---------------------------------------------------------------- 08.bandwidths

BANDWIDTH_STATEMENT = """\
**Tell algorithm bandwidth from bus bandwidth for an all-reduce.**

Write `bandwidths(nbytes, seconds, world_size)` returning `(algbw, busbw)` in bytes per
second for an all-reduce of a buffer of `nbytes` bytes that took `seconds` on
`world_size` ranks. The algorithm bandwidth is the buffer size over the time; the bus
bandwidth (nccl-tests' convention) corrects it by the share of the data every rank must
send and receive in an all-reduce, so that it compares with the hardware's link speed
whatever the number of ranks. The checker compares on several sizes and world sizes,
one rank and an odd number of ranks included, to float64 rounding.
"""

BANDWIDTH_SKELETON = """
def bandwidths(nbytes, seconds, world_size):
    \"\"\"(algbw, busbw) of an all-reduce, bytes/s.\"\"\"
    raise NotImplementedError("your code here")
"""

BANDWIDTH_REFERENCE = """
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (world_size - 1) / world_size
"""


def _bandwidth(busbw: str, algbw: str = "nbytes / seconds") -> str:
    return ("\ndef bandwidths(nbytes, seconds, world_size):\n"
            f"    algbw = {algbw}\n    return algbw, {busbw}\n")


BANDWIDTH_WRONG = {
    "busbw is algbw": Mistake(_bandwidth("algbw"), "2(n-1)/n"),
    "reduce-scatter factor": Mistake(_bandwidth("algbw * (world_size - 1) / world_size"),
                                     "both phases"),
    "forgets the 1/n": Mistake(_bandwidth("algbw * 2 * (world_size - 1)"),
                               "each of the 2(n-1) steps"),
    "factor upside down": Mistake(_bandwidth("algbw * world_size / (2 * (world_size - 1))"),
                                  "upside down"),
    "bits, not bytes": Mistake(_bandwidth("algbw * 2 * (world_size - 1) / world_size",
                                          "8 * nbytes / seconds"), "bytes per second"),
    "twice algbw, whatever the ranks": Mistake(_bandwidth("2 * algbw"),
                                               "which depends on the ranks"),
    "float32 arithmetic": Mistake("\nimport numpy as np\n" + _bandwidth(
        "algbw * 2 * (world_size - 1) / world_size",
        "np.float32(nbytes) / np.float32(seconds)"), "float32's precision"),
}

BANDWIDTH_CASES = ((1e9, 0.5, 8), (4e8, 0.1, 2), (2.5e7, 3e-3, 3), (2.5e7, 3e-3, 4),
                   (3e9, 0.25, 16), (1e6, 1e-3, 1))
# nbytes / seconds, then × 2(n-1) / n: 3 roundings for the checker, at most 4 in a learner's
# order (no subtraction of rounded values, so relative to the result): γ_7 < γ_8.
BANDWIDTH_ROUNDINGS = 8


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
            if value is None or not float64_close(value, right, BANDWIDTH_ROUNDINGS):
                return failed(f"{nbytes:.3g} bytes in {seconds:g} s on {world} rank(s): your "
                              f"{name} is {show(value)}, expected {right:.4g} B/s"
                              + _bandwidth_hint(name, value, right, expected[0], world))
    return passed(f"algbw and busbw right in {len(BANDWIDTH_CASES)} cases, one rank included")


def _bandwidth_hint(name: str, value, right: float, algbw: float, world: int) -> str:
    if value is None:
        return ": return numbers"
    if math.isclose(value, right, rel_tol=FLOAT32_UNIT * 8):
        return (": right to float32's precision, not float64's — compute with Python floats "
                "(a float32 of about 1e9 is off by tens)")
    if name == "algbw":
        if math.isclose(value, 8 * algbw, rel_tol=1e-9):
            return ": bandwidths here are in bytes per second, not bits"
        return ": algbw is the buffer's bytes over the seconds"
    factor = value / algbw
    for candidate, hint in ((1.0, "an all-reduce moves 2(n-1)/n of the buffer per rank (not a "
                             "whole number: divide with /)"),
                            ((world - 1) / world, "that is one phase; an all-reduce has both "
                             "phases (reduce-scatter and all-gather): 2(n-1)/n"),
                            (2 * (world - 1), "each of the 2(n-1) steps moves 1/n of the "
                             "buffer: 2(n-1)/n"),
                            (world / (2 * (world - 1)) if world > 1 else None,
                             "the factor is upside down: 2(n-1)/n"),
                            (2.0, "the factor is 2(n-1)/n, which depends on the ranks — "
                             "(n-1)/n of the buffer in each phase")):
        if candidate is not None and math.isclose(factor, candidate, rel_tol=1e-9):
            return f": {hint}"
    return ""


EXERCISES = [
    Exercise("08.training_memory", MEMORY_STATEMENT, MEMORY_SKELETON, MEMORY_REFERENCE,
             MEMORY_WRONG, memory_judge, names=("training_memory",)),
    Exercise("08.bandwidths", BANDWIDTH_STATEMENT, BANDWIDTH_SKELETON, BANDWIDTH_REFERENCE,
             BANDWIDTH_WRONG, bandwidth_judge, names=("bandwidths",),
             forbidden=("kosmoss.scaling", "kosmoss.comm")),
]
