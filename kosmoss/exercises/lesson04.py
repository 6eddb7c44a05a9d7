"""Lesson 04 (scaling the learning rate): the none / linear / square-root rules, and the
rate of a linear warm-up step by step, against ``kosmoss.scaling.arithmetic``.

    kosmoss check 04
"""
from __future__ import annotations

import math

from .core import Exercise, LearnerRaised, Mistake, failed, learner, number, passed, show
from .tolerance import float64_close

# ---------------------------------------------------------------- 04.scaled_lr

SCALED_STATEMENT = """\
**Scale a learning rate with the none, linear and square-root rules.**

Write `scaled_lr(base_lr, rule, effective_batch_size, base_batch_size)`: `base_lr` was
tuned for batches of `base_batch_size`; the run averages each optimizer step over
`effective_batch_size` columns (per-device batch × ranks × accumulated batches). With
`k = effective_batch_size / base_batch_size`, rule `"none"` keeps the rate, `"linear"`
multiplies it by `k`, `"sqrt"` by `√k`. The checker compares with `kosmoss.scaling.arithmetic`
for each rule on several batch sizes, where `k` is not always a whole number and may be
below one, to float64 rounding.
"""

SCALED_SKELETON = """
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    \"\"\"The learning rate for rule "none", "linear" or "sqrt".\"\"\"
    raise NotImplementedError("your code here")
"""

SCALED_REFERENCE = """
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
"""

SCALED_WRONG = {
    "integer k": Mistake("""
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size // base_batch_size
    return base_lr * {"none": 1, "linear": k, "sqrt": math.sqrt(k)}[rule]
""", "k is not a whole number"),
    "sqrt of the batch, not of k": Mistake("""
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    if rule == "sqrt":
        return base_lr * math.sqrt(effective_batch_size)
    if rule == "linear":
        return base_lr * effective_batch_size / base_batch_size
    return base_lr
""", "the square root of the batch"),
    "k upside down": Mistake("""
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = base_batch_size / effective_batch_size
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
""", "upside down"),
    "square-root rule squares": Mistake("""
def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": k, "sqrt": k ** 2}[rule]
""", "takes √k, not k ** 2"),
    "rules swapped": Mistake("""
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": math.sqrt(k), "sqrt": k}[rule]
""", "the other rule's"),
    "a float32 rate": Mistake("""
import torch


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = torch.tensor(effective_batch_size / base_batch_size)
    factor = {"none": torch.tensor(1.0), "linear": k, "sqrt": k.sqrt()}[rule]
    return float(base_lr * factor)
""", "float32's rounding"),
    "never scales down": Mistake("""
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = max(1.0, effective_batch_size / base_batch_size)
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
""", "below one"),
}

SCALED_CASES = ((1e-3, 128, 64), (1e-3, 1024, 64), (3e-4, 512, 16), (1e-3, 100, 16),
                (5e-3, 64, 64), (1e-3, 48, 32), (2e-3, 32, 64), (1e-3, 24, 256))
# k, its square root, the product: 3 roundings for kosmoss, at most 4 for a learner's order
# (no subtraction, so relative to the result): the two differ by at most γ_7 < γ_8.
SCALED_ROUNDINGS = 8


def scaled_judge(namespace: dict) -> tuple:
    from ..scaling.arithmetic import LR_RULES, lr_factor

    mine = learner(namespace, "scaled_lr")
    for base_lr, effective, base in SCALED_CASES:
        k = effective / base
        for rule in LR_RULES:
            expected, got = base_lr * lr_factor(rule, k), mine(base_lr, rule, effective, base)
            if number(got) is None or not float64_close(number(got), expected,
                                                        SCALED_ROUNDINGS):
                return failed(f"rule {rule!r}, base rate {base_lr:g} for batch {base}, "
                              f"effective batch {effective} (k = {k:g}): yours {show(got)}, "
                              f"expected {expected:.6g}"
                              + _scaled_hint(number(got), base_lr, rule, effective, base))
    return passed(f"all {len(LR_RULES)} rules match kosmoss.scaling.arithmetic on "
                  f"{len(SCALED_CASES)} batch sizes, k below one and fractional included")


def _scaled_hint(got, base_lr: float, rule: str, effective: int, base: int) -> str:
    if got is None:
        return ": return a number"
    k = effective / base

    def factor(value):
        return {"none": 1.0, "linear": value, "sqrt": math.sqrt(value)}[rule]

    hints = ((factor(effective // base), "k is not a whole number here: divide with /, not //"),
             (math.sqrt(effective) if rule == "sqrt" else None,
              "that is the square root of the batch, not of k"),
             (factor(base / effective), "k is upside down: effective / base, not base / effective"),
             (k ** 2 if rule == "sqrt" else None, "the square-root rule takes √k, not k ** 2"),
             (k / 2 if rule == "sqrt" else None,
              "k ** 1 / 2 is (k ** 1) / 2: write k ** 0.5 or math.sqrt(k)"),
             ({"linear": math.sqrt(k), "sqrt": k}.get(rule), "that is the other rule's factor"),
             (factor(max(1.0, k)),
              "k below one scales the rate down too: a smaller batch, a smaller step"))
    for candidate, hint in hints:
        if candidate is not None and math.isclose(got / base_lr, candidate, rel_tol=1e-9):
            return f": {hint}"
    return _float32_hint(got, base_lr * factor(k))


def _float32_hint(got: float, expected: float) -> str:
    if math.isclose(got, expected, rel_tol=1e-6):  # float32 keeps 24 bits: 6e-8 relative
        return (": right to about 1e-7 — float32's rounding (a torch tensor, numpy's "
                "float32): compute with Python floats (float64)")
    return ""


# ---------------------------------------------------------------- 04.warmup_lr

WARMUP_STATEMENT = """\
**Write the learning rate of a linear warm-up, step by step.**

Write `warmup_lr(step, warmup_steps, base_lr, target_lr)`: the rate used at optimizer
step `step` (counted from `0`) when the run warms up from the unscaled `base_lr` to the
scaled `target_lr` linearly over `warmup_steps` steps (Goyal et al.'s gradual warm-up,
as kosmoss does it): `base_lr` at step `0`, `target_lr` from step `warmup_steps` on (and
for every step after it), and `target_lr` throughout when `warmup_steps` is `0`. The
checker compares with `kosmoss.scaling.arithmetic.warmup_factor` step by step, well past
the warm-up, to float64 rounding.
"""

WARMUP_SKELETON = """
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    \"\"\"The learning rate at optimizer step `step` (from 0).\"\"\"
    raise NotImplementedError("your code here")
"""

WARMUP_REFERENCE = """
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps
"""

WARMUP_WRONG = {
    "warms up from zero": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step >= warmup_steps:
        return target_lr
    return target_lr * step / warmup_steps
""", "starts from base_lr"),
    "one step late": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step > warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * max(step - 1, 0) / warmup_steps
""", "one step late"),
    "unclamped: keeps rising after the warm-up": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps == 0:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps
""", "stays at target_lr"),
    "divides by zero without warm-up": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    fraction = min(1.0, step / warmup_steps)
    return base_lr + (target_lr - base_lr) * fraction
""", "ZeroDivisionError"),
    "integer fraction": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * (step // warmup_steps)
""", "step // warmup_steps is 0"),
    "a float32 ramp": Mistake("""
import numpy as np


def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    fraction = np.float32(step) / np.float32(warmup_steps)
    return float(np.float32(base_lr) + (np.float32(target_lr) - np.float32(base_lr)) * fraction)
""", "float32's rounding"),
    "ends one step early": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 1 or step >= warmup_steps - 1:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / (warmup_steps - 1)
""", "one step early"),
}

WARMUP_CASES = ((10, 1e-3, 8e-3), (4, 1e-3, 1e-3 * math.sqrt(8)), (0, 1e-3, 4e-3),
                (1, 2e-3, 6e-3), (3, 5e-4, 5e-4 * 16 / 3))
WARMUP_PAST = 6  # steps checked after the warm-up: an unclamped ramp goes on rising
# kosmoss's warmup_factor and the rate: 6 roundings; a learner's ramp at most as many; the
# difference target - base may cancel, so relative to the larger rate: 2·γ_6 ≤ γ_12.
WARMUP_ROUNDINGS = 12


def warmup_judge(namespace: dict) -> tuple:
    from ..scaling.arithmetic import warmup_factor

    mine = learner(namespace, "warmup_lr")
    for warmup_steps, base_lr, target_lr in WARMUP_CASES:
        steps = range(warmup_steps + WARMUP_PAST)
        ramp = [_warmup_rate(mine, step, warmup_steps, base_lr, target_lr) for step in steps]
        for step, got in zip(steps, ramp):
            expected = target_lr * warmup_factor(step, warmup_steps, base_lr / target_lr)
            if number(got) is None or not float64_close(
                    number(got), expected, WARMUP_ROUNDINGS, max(base_lr, target_lr)):
                return failed(f"warm-up from {base_lr:g} to {target_lr:.4g} over {warmup_steps} "
                              f"steps: at step {step} yours is {show(got)}, kosmoss uses "
                              f"{expected:.6g}"
                              + _warmup_hint(ramp, step, warmup_steps, base_lr, target_lr))
    return passed(f"matches kosmoss.scaling.arithmetic.warmup_factor at every step of "
                  f"{len(WARMUP_CASES)} warm-ups, none and one step long included, and "
                  f"{WARMUP_PAST} steps past each")


def _warmup_rate(mine, step: int, warmup_steps: int, base_lr: float, target_lr: float):
    try:
        return mine(step, warmup_steps, base_lr, target_lr)
    except LearnerRaised as err:
        raise LearnerRaised(f"at step {step} of a warm-up of {warmup_steps} steps: {err}",
                            err.original) from None


def _warmup_hint(ramp, step: int, warmup: int, base_lr: float, target_lr: float) -> str:
    """Name the mistake from the learner's whole ramp."""
    values = [number(v) for v in ramp]
    if values[step] is None:
        return ": return a number"

    def line(position, length):
        return base_lr + (target_lr - base_lr) * position / length

    def follows(rule, steps):
        return all(math.isclose(values[i], rule(i), rel_tol=1e-9, abs_tol=1e-15) for i in steps)

    inside = range(1, warmup)
    if step == 0 and math.isclose(values[0], 0.0, abs_tol=1e-15):
        return ": the warm-up starts from base_lr (the unscaled rate), not from zero"
    if step >= warmup and follows(lambda i: line(i, warmup), [step]):
        return ": after the warm-up the rate stays at target_lr — clamp the ramp"
    if warmup > 2 and follows(lambda i: base_lr, inside):
        return ": the fraction step // warmup_steps is 0 until the end: divide with /"
    if follows(lambda i: line(i - 1, warmup), inside):
        return ": your ramp is one step late (step 0 is the first step)"
    if warmup > 1 and follows(lambda i: line(i, warmup - 1), range(warmup - 1)):
        return ": your ramp reaches target_lr one step early: at step warmup_steps, not before"
    return _float32_hint(values[step], line(min(step, warmup), warmup) if warmup else target_lr)


EXERCISES = [
    Exercise("04.scaled_lr", SCALED_STATEMENT, SCALED_SKELETON, SCALED_REFERENCE,
             SCALED_WRONG, scaled_judge, names=("scaled_lr",), forbidden=("kosmoss.scaling",)),
    Exercise("04.warmup_lr", WARMUP_STATEMENT, WARMUP_SKELETON, WARMUP_REFERENCE,
             WARMUP_WRONG, warmup_judge, names=("warmup_lr",), forbidden=("kosmoss.scaling",)),
]
