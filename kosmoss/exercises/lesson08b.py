"""Lesson 08b (saturating one GPU): the samples/s no training step can beat on a device,
from what a sample reads and computes.

    kosmoss check 08b
"""
from __future__ import annotations

import math

from .core import Exercise, LearnerRaised, Mistake, failed, learner, number, passed, show

NOTEBOOK_GLOB = "08b_*"

LIMIT_STATEMENT = """\
**The limit of one GPU for an MLP.**

Write `sample_limit(n_x, hidden, n_y, bandwidth, peak_flops)` for an MLP with `n_x`
inputs, hidden layers of the sizes in the list `hidden` and `n_y` outputs, trained with
float32 data on a device that reads `bandwidth` bytes/s from its memory and computes
`peak_flops` FLOP/s. A training step must at least read each sample's inputs and
targets once, and do its arithmetic: the forward multiply-adds of every layer, and in
backward every weight's gradient and every layer's input gradient except the first's (the
data needs none); a multiply-add is two FLOP, biases left out. Return
`(samples_per_s, bound)`: the samples/s of the slower of the two, and which one binds,
`"memory"` or `"compute"`. The checker tries the course's model on an H100, a model
wide enough to be bound by compute, a device with little bandwidth, and a model with no
hidden layer (`hidden` empty).
"""

LIMIT_SKELETON = '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    """(samples/s that neither memory nor arithmetic can beat, "memory" or "compute")."""
    raise NotImplementedError("your code here")
'''

LIMIT_REFERENCE = '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    by_memory = bandwidth / (4 * (n_x + n_y))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
'''


def _limit(body: str) -> str:
    """A catalogued answer: the reference with one line changed."""
    return LIMIT_REFERENCE.replace(*body.split(" ==> "))


LIMIT_WRONG = {
    "the targets' bytes forgotten": Mistake(_limit(
        "by_memory = bandwidth / (4 * (n_x + n_y)) ==> by_memory = bandwidth / (4 * n_x)"),
        "the targets are read too"),
    "bf16 bytes for float32 data": Mistake(_limit(
        "by_memory = bandwidth / (4 * (n_x + n_y)) ==> by_memory = bandwidth / (2 * (n_x + n_y))"),
        "4 bytes a value"),
    "multiply-adds counted, not FLOP": Mistake(_limit(
        "forward = sum(2 * i * o for i, o in layers) ==> forward = sum(i * o for i, o in layers)"
    ).replace("sum(2 * i * o for i, o in layers[1:])", "sum(i * o for i, o in layers[1:])"),
        "two FLOP"),
    "backward forgotten": Mistake(_limit(
        "by_compute = peak_flops / (forward + backward) ==> by_compute = peak_flops / forward"),
        "backward"),
    "the data's gradient counted too": Mistake(_limit(
        "backward = forward + sum(2 * i * o for i, o in layers[1:]) ==> backward = 2 * forward"),
        "the first layer's input needs no gradient"),
    "the sizes inserted into `hidden` itself": Mistake(_limit(
        "sizes = [n_x, *hidden, n_y] ==> "
        "sizes = hidden\n    sizes.insert(0, n_x)\n    sizes.append(n_y)"),
        "changed the list `hidden`"),
    "the bound's names swapped": Mistake(_limit(
        '(by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute") ==> '
        '(by_memory, "compute") if by_memory <= by_compute else (by_compute, "memory")'),
        "it is bound by"),
    "floor division": Mistake(_limit(
        "by_memory = bandwidth / (4 * (n_x + n_y)) ==> by_memory = bandwidth // (4 * (n_x + n_y))"
    ).replace("by_compute = peak_flops / (", "by_compute = peak_flops // ("),
        "a rate is no count"),
    "the faster bound taken": Mistake(_limit(
        "if by_memory <= by_compute else ==> if by_memory >= by_compute else"),
        "the slower of the two binds"),
}

# (n_x, hidden, n_y, bandwidth, peak_flops): the course's model on an H100 (memory-bound),
# wide models (compute-bound; the second narrow at the ends, so that which layer's input
# needs no gradient shows), a narrow one on a device with little bandwidth, and a model
# with no hidden layer (one Linear: its only layer's input needs no gradient) on a device
# of little compute.
LIMIT_CASES = ((4128, [100, 100, 100], 552, 3.35e12, 989e12),
               (1024, [8192, 8192], 1024, 3.35e12, 989e12),
               (256, [4096, 4096], 16, 3.35e12, 989e12),
               (256, [64], 16, 50e9, 10e12),
               (4128, [100, 100, 100], 552, 4.8e12, 989e12),
               (4096, [], 4096, 3.35e12, 1e12))
EXACT = 1e-12  # plain float arithmetic: the same expression gives the same number


def _right(n_x, hidden, n_y, bandwidth, peak_flops):
    scope: dict = {}
    exec(LIMIT_REFERENCE, scope)  # the reference cell, kosmoss's own code
    return scope["sample_limit"](n_x, hidden, n_y, bandwidth, peak_flops)


def limit_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "sample_limit")
    for case in LIMIT_CASES:
        n_x, hidden, n_y, bandwidth, peak = case
        right_rate, right_bound = _right(*case)
        given = list(hidden)
        where = (f"{n_x} inputs, hidden {list(hidden)}, {n_y} outputs, {bandwidth:.3g} B/s, "
                 f"{peak:.3g} FLOP/s")
        try:
            got = mine(n_x, given, n_y, bandwidth, peak)
        except LearnerRaised as err:  # an empty `hidden` has no hidden[0]
            raise LearnerRaised(f"for {where}: {err}", err.original) from None
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return failed(f"{where}: return (samples_per_s, bound), not {show(got)}")
        rate, bound = number(got[0]), got[1]
        if rate is None or not math.isclose(rate, right_rate, rel_tol=EXACT):
            return failed(f"{where}: yours {show(got[0])} samples/s, the limit "
                          f"{right_rate:,.6g}" + _rate_hint(rate, case, right_rate))
        if bound != right_bound:
            return failed(f"{where}: it is bound by {right_bound!r}, yours says {bound!r}: "
                          "the slower of the two binds")
        if given != list(hidden):
            return failed(f"{where}: your answer is right, but sample_limit changed the list "
                          f"`hidden` it was given into {given}: the caller's list is theirs, "
                          "and a second call with it sees another model — build a new list "
                          "([n_x, *hidden, n_y])")
    return passed(f"{len(LIMIT_CASES)} devices and models, memory- and compute-bound")


def _rate_hint(rate, case, right: float) -> str:
    if rate is None:
        return ": a number of samples per second"
    if abs(rate - right) < 1 and rate == round(rate):
        return (": rounded to a whole number — a rate is no count of samples and needs no "
                "rounding: divide with /, not //, and keep the fraction")
    n_x, hidden, n_y, bandwidth, peak = case
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    candidates = (
        (bandwidth / (4 * n_x), "the targets are read too: 4 × (n_x + n_y) bytes"),
        (bandwidth / (2 * (n_x + n_y)), "the data is float32: 4 bytes a value"),
        (peak / ((forward + backward) / 2), "a multiply-add is two FLOP"),
        (peak / forward, "backward costs too: every weight's gradient and the inputs'"),
        (peak / (3 * forward), "the first layer's input needs no gradient: the data is no "
                               "weight"),
        (peak / (2 * forward + sum(2 * i * o for i, o in layers[:-1])),
         "it is the first layer's input (the data) that needs no gradient, not the last "
         "layer's"),
        (max(bandwidth / (4 * (n_x + n_y)), peak / (forward + backward)),
         "the slower of the two binds: take the smaller rate"),
    )
    for value, hint in candidates:
        if math.isclose(rate, value, rel_tol=1e-9) and not math.isclose(value, right,
                                                                        rel_tol=1e-9):
            return f": {hint}"
    return ""


EXERCISES = [
    Exercise("08b.sample_limit", LIMIT_STATEMENT, LIMIT_SKELETON, LIMIT_REFERENCE,
             LIMIT_WRONG, limit_judge, names=("sample_limit",), forbidden=("kosmoss.bench",)),
]
