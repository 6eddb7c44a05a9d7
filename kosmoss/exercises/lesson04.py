"""Lesson 04 (scaling the learning rate): the none / linear / square-root rules, and the
rate of a linear warm-up step by step, against ``kosmoss.scaling.arithmetic``.

    kosmoss check 04
"""
from __future__ import annotations

import math

from .core import Exercise, failed, learner, number, passed, show

# ---------------------------------------------------------------- 04.scaled_lr

SCALED_STATEMENT = """\
**Scale a learning rate with the none, linear and square-root rules.**

Write `scaled_lr(base_lr, rule, effective_batch_size, base_batch_size)`: `base_lr` was
tuned for batches of `base_batch_size`; the run averages each optimizer step over
`effective_batch_size` columns (per-device batch × ranks × accumulated batches). With
`k = effective_batch_size / base_batch_size`, rule `"none"` keeps the rate, `"linear"`
multiplies it by `k`, `"sqrt"` by `√k`. The checker compares with `kosmoss.scaling.arithmetic` for
each rule on several batch sizes, some where `k` is not a whole number.
"""

SCALED_SKELETON = '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    """The learning rate for rule "none", "linear" or "sqrt"."""
    raise NotImplementedError("your code here")
'''

SCALED_REFERENCE = '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
'''

SCALED_WRONG = {
    "integer k": '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size // base_batch_size
    return base_lr * {"none": 1, "linear": k, "sqrt": math.sqrt(k)}[rule]
''',
    "sqrt of the batch, not of k": '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    if rule == "sqrt":
        return base_lr * math.sqrt(effective_batch_size)
    if rule == "linear":
        return base_lr * effective_batch_size / base_batch_size
    return base_lr
''',
}

SCALED_CASES = ((1e-3, 128, 64), (1e-3, 1024, 64), (3e-4, 512, 16), (1e-3, 100, 16),
                (5e-3, 64, 64), (1e-3, 48, 32))


def scaled_judge(namespace: dict) -> tuple:
    from ..scaling.arithmetic import LR_RULES, lr_factor

    mine = learner(namespace, "scaled_lr")
    for base_lr, effective, base in SCALED_CASES:
        k = effective / base
        for rule in LR_RULES:
            expected, got = base_lr * lr_factor(rule, k), mine(base_lr, rule, effective, base)
            if number(got) is None or not math.isclose(number(got), expected, rel_tol=1e-9):
                return failed(f"rule {rule!r}, base rate {base_lr:g} for batch {base}, "
                              f"effective batch {effective} (k = {k:g}): yours {show(got)}, "
                              f"expected {expected:.6g}")
    return passed(f"all {len(LR_RULES)} rules match kosmoss.scaling.arithmetic on "
                  f"{len(SCALED_CASES)} batch sizes")


# ---------------------------------------------------------------- 04.warmup_lr

WARMUP_STATEMENT = """\
**Write the learning rate of a linear warm-up, step by step.**

Write `warmup_lr(step, warmup_steps, base_lr, target_lr)`: the rate used at optimizer
step `step` (counted from `0`) when the run warms up from the unscaled `base_lr` to the
scaled `target_lr` linearly over `warmup_steps` steps (Goyal et al.'s gradual warm-up,
as kosmoss does it): `base_lr` at step `0`, `target_lr` from step `warmup_steps` on, and
`target_lr` throughout when `warmup_steps` is `0`. The checker compares with
`kosmoss.scaling.arithmetic.warmup_factor` step by step.
"""

WARMUP_SKELETON = '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    """The learning rate at optimizer step `step` (from 0)."""
    raise NotImplementedError("your code here")
'''

WARMUP_REFERENCE = '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps
'''

WARMUP_WRONG = {
    "warms up from zero": '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step >= warmup_steps:
        return target_lr
    return target_lr * step / warmup_steps
''',
    "one step late": '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step > warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * max(step - 1, 0) / warmup_steps
''',
}

WARMUP_CASES = ((10, 1e-3, 8e-3), (4, 1e-3, 1e-3 * math.sqrt(8)), (0, 1e-3, 4e-3))


def warmup_judge(namespace: dict) -> tuple:
    from ..scaling.arithmetic import warmup_factor

    mine = learner(namespace, "warmup_lr")
    for warmup_steps, base_lr, target_lr in WARMUP_CASES:
        for step in range(warmup_steps + 4):
            expected = target_lr * warmup_factor(step, warmup_steps, base_lr / target_lr)
            got = mine(step, warmup_steps, base_lr, target_lr)
            if number(got) is None or not math.isclose(number(got), expected, rel_tol=1e-9):
                return failed(f"warm-up from {base_lr:g} to {target_lr:.4g} over {warmup_steps} "
                              f"steps: at step {step} yours is {show(got)}, kosmoss uses "
                              f"{expected:.6g}")
    return passed(f"matches kosmoss.scaling.arithmetic.warmup_factor at every step of "
                  f"{len(WARMUP_CASES)} warm-ups")


EXERCISES = [
    Exercise("04.scaled_lr", SCALED_STATEMENT, SCALED_SKELETON, SCALED_REFERENCE,
             SCALED_WRONG, scaled_judge, names=("scaled_lr",)),
    Exercise("04.warmup_lr", WARMUP_STATEMENT, WARMUP_SKELETON, WARMUP_REFERENCE,
             WARMUP_WRONG, warmup_judge, names=("warmup_lr",)),
]
