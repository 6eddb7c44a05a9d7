"""Lesson 04 (scaling the learning rate): the none / linear / square-root rules, and the
rate of a linear warm-up step by step, against ``kosmoss.scaling.arithmetic``; the two
parts of the gradient noise scale from the gradient norms at two batch sizes, against the
exact expectations of real per-sample gradients.

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
    "the rate clamped with min(target_lr, ...)": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps == 0:
        return target_lr
    return min(target_lr, base_lr + (target_lr - base_lr) * step / warmup_steps)
""", "the ramp goes down"),
    "ends one step early": Mistake("""
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps <= 1 or step >= warmup_steps - 1:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / (warmup_steps - 1)
""", "one step early"),
}

WARMUP_CASES = ((10, 1e-3, 8e-3), (4, 1e-3, 1e-3 * math.sqrt(8)), (0, 1e-3, 4e-3),
                (1, 2e-3, 6e-3), (3, 5e-4, 5e-4 * 16 / 3),
                (5, 2e-3, 2e-3 * 0.5))  # k below one (04.scaled_lr): the ramp goes down
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
                  f"{len(WARMUP_CASES)} warm-ups, none, one step long and one going down "
                  f"included, and {WARMUP_PAST} steps past each")


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
    if warmup == 0:
        return ": with warmup_steps 0 there is no warm-up: target_lr from step 0 on"
    if target_lr < base_lr and step < warmup and any(
            math.isclose(values[step], end, rel_tol=1e-9) for end in (target_lr, base_lr)):
        return (": target_lr is below base_lr here (k below one, a batch smaller than the "
                "base's), so the ramp goes down to it — clamp the step "
                "(min(step, warmup_steps)), not the rate: min(target_lr, ...) or "
                "max(base_lr, ...) holds a ramp that goes down at one end")
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


# ---------------------------------------------------------------- 04.noise_scale

NOISE_STATEMENT = """\
**Estimate |G|² and tr(Σ) from the gradient norms at two batch sizes.**

Write `noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch)`. The
gradient of a batch of `B` columns drawn from the data is the true gradient `G` plus
noise of covariance `Σ / B`, so its squared norm is, on average,
`|G_B|² = |G|² + tr(Σ) / B`. Given that squared norm at two batch sizes — a rank's
micro-batch (`small_batch` columns) and the average over all of them (`big_batch`) —
solve for the two unknowns and return `(g_sq, trace)`: the estimates of `|G|²` and
`tr(Σ)` of McCandlish et al. (2018, appendix A), whose ratio `tr(Σ) / |G|²` is the
simple noise scale `B_simple`. From one step's norms the estimate of `|G|²` can come out
negative (noise): return it as it is — the lesson averages the estimates over steps
before it divides. The checker gives you the exact expected squared norms of the per-sample
gradients of a small model (and of chosen `|G|²` and `tr(Σ)`, a noiseless one included)
and compares your two numbers with the true ones to float64 rounding.
"""

NOISE_SKELETON = """
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    \"\"\"(estimate of |G|², estimate of tr(Σ)) from the squared gradient norms at two batch
    sizes.\"\"\"
    raise NotImplementedError("your code here")
"""

NOISE_REFERENCE = """
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    # |G_B|² = |G|² + tr(Σ)/B at two batch sizes: two equations, two unknowns.
    g_sq = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return g_sq, trace
"""


def _noise(g_sq: str, trace: str, returned: str = "g_sq, trace") -> str:
    return f"""
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    g_sq = {g_sq}
    trace = {trace}
    return {returned}
"""


_G_SQ = "(big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)"
_TRACE = "(small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)"

NOISE_WRONG = {
    "each norm weighed by the other batch size": Mistake(_noise(
        "(small_batch * big_sq_norm - big_batch * small_sq_norm) / (small_batch - big_batch)",
        _TRACE), "weigh each squared norm by its own batch size"),
    "the trace over the difference of the batch sizes": Mistake(_noise(
        _G_SQ, "(small_sq_norm - big_sq_norm) / (big_batch - small_batch)"),
        "1/small_batch - 1/big_batch"),
    "the trace as the difference of the norms": Mistake(_noise(
        _G_SQ, "small_sq_norm - big_sq_norm"), "divide by (1/small_batch - 1/big_batch)"),
    "the large batch's norm taken for |G|²": Mistake(_noise("big_sq_norm", _TRACE),
                                                     "tr(Σ)/big_batch too large"),
    "a negative |G|² clamped to zero": Mistake(_noise(f"max(0.0, {_G_SQ})", _TRACE),
                                               "may come out negative"),
    "the ratio returned": Mistake(_noise(_G_SQ, _TRACE, "trace / g_sq, g_sq"),
                                  "the two parts, not their ratio"),
    "the two parts swapped": Mistake(_noise(_G_SQ, _TRACE, "trace, g_sq"),
                                     "(g_sq, trace), in that order"),
}

NOISE_ROUNDINGS = 16  # two products, a subtraction, a division each, and the inputs' own


def per_sample_truth() -> tuple:
    """|G|² and tr(Σ) of a small model's per-sample gradients over a population of
    columns: G their mean, Σ their covariance (of a draw with replacement)."""
    import torch

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.SiLU(), torch.nn.Linear(8, 3))
    model = model.double()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=generator, dtype=torch.float64)
    y = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    grads = []
    for row in range(len(x)):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x[row:row + 1]), y[row:row + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    grads = torch.stack(grads)
    mean = grads.mean(dim=0)
    return float(mean.square().sum()), float((grads - mean).square().sum(dim=1).mean())


def noise_cases() -> list:
    """(|G|², tr(Σ), small batch, big batch): a real model's, chosen ones, a noiseless one,
    and the lesson's batch sizes."""
    g_sq, trace = per_sample_truth()
    return [(g_sq, trace, 16, 256), (g_sq, trace, 2, 3), (1.0, 50.0, 16, 256),
            (1e-4, 3.0, 32, 64), (2.5, 0.0, 8, 128)]


def _expected_norm(g_sq: float, trace: float, batch: int) -> float:
    return g_sq + trace / batch


def noise_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "noise_scale_parts")
    for g_sq, trace, small, big in noise_cases():
        small_sq, big_sq = _expected_norm(g_sq, trace, small), _expected_norm(g_sq, trace, big)
        got = mine(small_sq, big_sq, small, big)
        message = _noise_mistake(got, (g_sq, trace), (small_sq, big_sq, small, big))
        if message:
            return failed(f"batches of {small} and {big}, true |G|² {g_sq:.6g} and tr(Σ) "
                          f"{trace:.6g}: {message}")
    noisy = mine(10.0, 0.5, 16, 256)  # one step's norms, the large batch's below the small's
    expected = _reference_parts(10.0, 0.5, 16, 256)
    message = _noise_mistake(noisy, expected, (10.0, 0.5, 16, 256))
    if message:
        return failed(f"from one step's norms 10 and 0.5 at batches of 16 and 256: {message}")
    # the large batch's norm above the small's: the estimate of tr(Σ) comes out negative
    message = _noise_mistake(mine(0.5, 0.6, 16, 256), _reference_parts(0.5, 0.6, 16, 256),
                             (0.5, 0.6, 16, 256))
    if message:
        return failed(f"from one step's norms 0.5 and 0.6 at batches of 16 and 256: {message}")
    return passed(f"the true |G|² and tr(Σ) in {len(noise_cases())} cases (a real model's "
                  "per-sample gradients among them, one without noise), and a negative |G|² "
                  "and tr(Σ) left as they are")


def _reference_parts(small_sq: float, big_sq: float, small: int, big: int) -> tuple:
    return ((big * big_sq - small * small_sq) / (big - small),
            (small_sq - big_sq) / (1 / small - 1 / big))


def _noise_mistake(got, expected: tuple, inputs: tuple):
    small_sq, big_sq, small, big = inputs
    pair = got if isinstance(got, (tuple, list)) else ()
    values = [number(v) for v in pair]
    if len(values) != 2 or None in values:
        return (f"yours returned {got!r}: return the two parts, not their ratio — a pair "
                "(g_sq, trace) of numbers")
    # The magnitudes each part's computation meets: a solver that first finds tr(Σ) then
    # takes tr(Σ)/small_batch from small_sq_norm meets small_sq_norm itself.
    scales = ((big * big_sq + small * small_sq) / (big - small) + abs(small_sq),
              (small_sq + big_sq) / (1 / small - 1 / big))
    if all(float64_close(v, e, NOISE_ROUNDINGS, scale)
           for v, e, scale in zip(values, expected, scales)):
        return None
    return (f"yours ({show(values[0])}, {show(values[1])}), expected ({expected[0]:.6g}, "
            f"{expected[1]:.6g})" + _noise_hint(values, expected, inputs))


def _noise_hint(values: list, expected: tuple, inputs: tuple) -> str:
    small_sq, big_sq, small, big = inputs
    g_sq, trace = expected

    def near(a, b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)

    if near(values[0], trace) and near(values[1], g_sq):
        return ": the two parts swapped — return (g_sq, trace), in that order"
    if g_sq and near(values[0], trace / g_sq):
        return ": return the two parts, not their ratio (the lesson divides their averages)"
    if near(values[1], -trace) and trace:
        return (": the two squared norms taken the other way round — the small batch's is the "
                "larger (more noise): small_sq_norm goes with small_batch")
    if near(values[0], (small * big_sq - big * small_sq) / (small - big)) and not near(
            values[0], g_sq):
        return (": weigh each squared norm by its own batch size: (B_big |G_big|² - "
                "B_small |G_small|²) / (B_big - B_small)")
    if near(values[1], 0.0) and trace < 0:
        return (": an estimate of tr(Σ) from one step's norms may come out negative too (the "
                "large batch's norm above the small's): keep it, as a negative |G|²")
    if near(values[0], big_sq):
        return (": the large batch's squared norm is |G|² + tr(Σ)/big_batch too large; "
                "remove the noise with the second batch size")
    if near(values[0], 0.0) and g_sq < 0:
        return (": an estimate of |G|² from one step's norms may come out negative; keep it "
                "(averaged over steps it is unbiased; clamped, it is not)")
    if near(values[1], small_sq - big_sq):
        return ": divide by (1/small_batch - 1/big_batch) to get tr(Σ)"
    if near(values[1], (small_sq - big_sq) / (big - small)):
        return (": the noise falls as 1/B: divide by 1/small_batch - 1/big_batch, not by "
                "the difference of the batch sizes")
    return ""


EXERCISES = [
    Exercise("04.scaled_lr", SCALED_STATEMENT, SCALED_SKELETON, SCALED_REFERENCE,
             SCALED_WRONG, scaled_judge, names=("scaled_lr",), forbidden=("kosmoss.scaling",)),
    Exercise("04.warmup_lr", WARMUP_STATEMENT, WARMUP_SKELETON, WARMUP_REFERENCE,
             WARMUP_WRONG, warmup_judge, names=("warmup_lr",), forbidden=("kosmoss.scaling",)),
    Exercise("04.noise_scale", NOISE_STATEMENT, NOISE_SKELETON, NOISE_REFERENCE, NOISE_WRONG,
             noise_judge, names=("noise_scale_parts",)),
]
