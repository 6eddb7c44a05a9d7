"""Lesson 01 (context and data): count the features of the flattened schema; standardise
inputs without erasing tiny-valued features.

    kosmoss check 01
"""
from __future__ import annotations

import random

from .core import (Exercise, LearnerRaised, Mistake, failed, is_integer, learner, number_hint,
                   passed)
from .tolerance import FLOAT32_UNIT, gamma

# ---------------------------------------------------------------- 01.feature_counts

COUNTS_STATEMENT = """\
**Count the features of a flattened column with any number of levels.**

Write `feature_counts(levels)` returning `(n_x, n_y)`: the length of one flattened input
row and of one flattened target row for a column with `levels` full levels (so
`levels + 1` half levels and `levels - 1` interfaces), with the blocks of the
`3dcorrection` schema printed in this lesson. The checker compares with
`kosmoss.data.schema.ColumnSchema(levels)` for several level counts, the IFS's `137`
among them, the smallest the schema allows, `2`, and one drawn afresh each time. Counts
are integers.
"""

COUNTS_SKELETON = '''
def feature_counts(levels):
    """(n_x, n_y) of a flattened column with `levels` full levels."""
    raise NotImplementedError("your code here")
'''

COUNTS_REFERENCE = '''
def feature_counts(levels):
    half_levels, interfaces = levels + 1, levels - 1
    n_x = 17 + levels * 27 + half_levels * 2 + interfaces * 1
    n_y = 4 * half_levels
    return n_x, n_y
'''

COUNTS_WRONG = {
    "every block on full levels": Mistake('''
def feature_counts(levels):
    return 17 + levels * (27 + 2 + 1), 4 * levels
''', "levels + 1 half levels and levels - 1 interfaces"),
    "hard-coded for 137 levels": Mistake('''
def feature_counts(levels):
    return 4128, 552
''', "is a level count hard-coded?"),
    "forgets the interfaces block": Mistake('''
def feature_counts(levels):
    return 17 + levels * 27 + (levels + 1) * 2, 4 * (levels + 1)
''', "grows by 29 per level"),
    "each albedo block counted as one variable": Mistake('''
def feature_counts(levels):
    return 7 + levels * 27 + (levels + 1) * 2 + (levels - 1), 4 * (levels + 1)
''', "17 scalar inputs"),
    "short-wave fluxes only": Mistake('''
def feature_counts(levels):
    return 17 + levels * 27 + (levels + 1) * 2 + (levels - 1), 2 * (levels + 1)
''', "4 fluxes on each half level"),
    "a float count": Mistake('''
def feature_counts(levels):
    n_x = 17 + levels * 27 + (levels + 1) * 2 + (levels - 1) * 1.0
    return n_x, 4 * (levels + 1)
''', "a count is an integer"),
    "a table of the level counts tried": Mistake('''
def feature_counts(levels):
    return {137: (4128, 552), 60: (1818, 244), 10: (318, 44), 2: (78, 12)}[levels]
''', "a level count drawn afresh"),
}

LEVELS = (137, 60, 10, 2)


def _judged_levels() -> tuple:
    """LEVELS and one more level count drawn afresh each time: an answer that is a table of
    the level counts it was tried with meets one it has not seen."""
    unseen = [levels for levels in range(3, 300) if levels not in LEVELS]
    return LEVELS + (random.SystemRandom().choice(unseen),)


def _schema_counts(levels: int):
    from ..data.schema import ColumnSchema

    schema = ColumnSchema(levels)
    return schema.n_x, schema.n_y


def counts_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "feature_counts")
    answers = {}
    judged = _judged_levels()
    for levels in judged:
        try:
            got = mine(levels)
        except LearnerRaised as err:  # a table of level counts meets one it lacks
            fresh = "" if levels in LEVELS else ", a level count drawn afresh"
            raise LearnerRaised(f"for feature_counts({levels}){fresh}: {err}",
                                err.original) from None
        try:
            n_x, n_y = got
        except (TypeError, ValueError):
            return failed(f"feature_counts({levels}) returned {got!r}: return a pair (n_x, n_y)")
        answers[levels] = (n_x, n_y)
    for which, name in enumerate(("n_x", "n_y")):
        for levels in judged:
            value, expected = answers[levels][which], _schema_counts(levels)[which]
            if not is_integer(value):
                return failed(f"for {levels} levels your {name} is {value!r}: " + number_hint(
                    value, "a count is an integer (no float in the arithmetic)"))
            if value != expected:
                return failed(f"for {levels} levels your {name} is {value}, the schema's is "
                              f"{expected}: " + _count_hint(name, which, answers))
    return passed(f"n_x and n_y match the schema for {', '.join(map(str, judged))} levels")


def _count_hint(name: str, which: int, answers: dict) -> str:
    """Why a count is off, from how the learner's grows with the levels (a line a + b·L)."""
    mine = {levels: int(answers[levels][which]) for levels in answers}
    ref = {levels: _schema_counts(levels)[which] for levels in answers}
    right = [levels for levels in answers if mine[levels] == ref[levels]]
    if len(set(mine.values())) == 1:
        where = f" (right for {right[0]} levels only)" if right else ""
        return f"yours does not change with the level count{where}: is a level count hard-coded?"
    slope, intercept = _line(mine)
    ref_slope, ref_intercept = _line(ref)
    if slope != ref_slope:
        what = ("27 variables on each full level, 2 on each half level, 1 on each interface"
                if name == "n_x" else "4 fluxes on each half level")
        return f"yours grows by {slope:g} per level, the schema's by {ref_slope:g}: {what}"
    if name == "n_y":
        return (f"yours is {slope:g}·levels + {intercept:g}, the schema's {ref_slope:g}·levels"
                f" + {ref_intercept:g}: 4 fluxes on each half level, and there are "
                "levels + 1 half levels")
    return (f"yours is {slope:g}·levels + {intercept:g}, the schema's {ref_slope:g}·levels + "
            f"{ref_intercept:g}: the constant part is the 17 scalar inputs (surface and top of "
            "atmosphere), and there are levels + 1 half levels and levels - 1 interfaces")


def _line(values: dict):
    (l1, v1), (l2, v2) = sorted(values.items())[:2]
    slope = (v2 - v1) / (l2 - l1)
    return slope, v1 - slope * l1


# ---------------------------------------------------------------- 01.normalise

NORMALISE_STATEMENT = """\
**Standardise each input feature, keeping tiny-valued but varying features.**

Write `normalise(x)`: `x` is a float32 tensor of shape (samples, features); return a new
tensor of the same shape, `x` left unchanged, where each feature (column) is centred by
its mean and divided by its standard deviation over the samples (either convention, over
`n` or `n - 1`). A feature is *constant* when its standard deviation is at most `1e-6`
times its mean absolute value (exactly zero included): constant features become exactly
`0`, never NaN. Mixing ratios of trace gases are around `1e-10` and vary by a fraction of a
percent: they are not constant. A surface pressure whose samples differ by one float32
step is constant. The checker feeds a float32 batch with features of every kind,
negative ones included, and compares feature by feature.
"""

NORMALISE_SKELETON = '''
import torch


def normalise(x):
    """Each column centred and divided by its std; constant columns become 0."""
    raise NotImplementedError("your code here")
'''

NORMALISE_REFERENCE = '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    # Relative, not absolute: a mixing ratio of 1e-10 has a tiny std and still varies.
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
'''

NORMALISE_WRONG = {
    "the usual `std == 0` guard": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0)
    std[std == 0] = 1
    return (x - x.mean(dim=0)) / std
''', "a test for std == 0"),
    "absolute cut at 1e-12 (erases trace gases)": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    return (x - x.mean(dim=0)) / torch.where(std > 1e-12, std, torch.ones_like(std))
''', "absolute cut"),
    "no guard (NaN for constants)": Mistake('''
def normalise(x):
    return (x - x.mean(dim=0)) / x.std(dim=0, correction=0)
''', "is NaN or inf in yours"),
    "relative to the signed mean": Mistake('''
import torch


def normalise(x):
    mean, std = x.mean(dim=0), x.std(dim=0, correction=0)
    constant = std <= 1e-6 * mean
    scaled = (x - mean) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "absolute value"),
    "constant columns divided by one (x - mean is left)": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    return (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
''', "dividing by one leaves x − mean"),
    "each row instead of each column": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=1, correction=0, keepdim=True)
    constant = std <= 1e-6 * x.abs().mean(dim=1, keepdim=True)
    scaled = (x - x.mean(dim=1, keepdim=True)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "each row"),
    "an absolute cut above rounding (std > 0.01)": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    scaled = (x - x.mean(dim=0)) / torch.where(std > 1e-2, std, torch.ones_like(std))
    return torch.where(std > 1e-2, scaled, torch.zeros_like(scaled))
''', "treated as constant, but it varies"),
    "computes in bfloat16": Mistake('''
import torch


def normalise(x):
    x = x.to(torch.bfloat16)
    std = x.std(dim=0, correction=0)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled).float()
''', "the rounding of a 16-bit float"),
    "a numpy array, not a tensor": Mistake('''
import numpy as np


def normalise(x):
    a = x.numpy()
    std = a.std(axis=0)
    constant = std <= 1e-6 * np.abs(a).mean(axis=0)
    return np.where(constant, 0.0, (a - a.mean(axis=0)) / np.where(constant, 1.0, std))
''', "return a torch tensor"),
    "the relative test and an absolute floor (std < 1e-12)": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = (std <= 1e-6 * x.abs().mean(dim=0)) | (std < 1e-12)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "an absolute cut (std < 1e-12, ...) erases it"),
    "divided by the std, not centred": Mistake('''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    scaled = x / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "divided by the std but not centred"),
    "divides by the variance": Mistake('''
import torch


def normalise(x):
    var = x.var(dim=0, correction=0)
    constant = var.sqrt() <= 1e-6 * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(var), var)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "variance"),
}

SAMPLES = 64
# (what the column is, what a wrong test does to it)
FEATURES = (
    ("temperature (around 280 K)", ""),
    ("top-of-atmosphere pressure (the same in every column)", ""),
    ("surface pressure whose samples differ by one float32 step", "a test for std == 0 (or "
     "below an absolute cut) misses it: the test is relative to the feature's size"),
    ("a trace gas around 1e-10 varying by 0.5 %", "an absolute cut (std < 1e-12, ...) erases "
     "it: the test is relative to the feature's size"),
    ("a feature that is always 0", ""),
    ("a mixing ratio around 1e-5 varying by 30 %", ""),
    ("a standard normal feature", ""),
    ("a negative offset whose samples differ by one float32 step", "the bound is 1e-6 times "
     "the mean absolute value: times a negative mean it is negative, and nothing is below"),
    ("surface pressure with a few float32 steps of rounding noise",
     "the bound is the statement's 1e-6 times the mean absolute value, not float32's "
     "epsilon (1.2e-7): a few steps of rounding noise are still constant"),
    ("a pressure around 1024 hPa varying by 4e-6 of its size", "the bound is the "
     "statement's 1e-6 times the mean absolute value, and this feature's std is above it: a "
     "larger bound (1e-5, ...) makes it constant. A std taken as E[x²] − mean² in float32 "
     "loses it too (the two terms agree to 7 digits): subtract the mean first"),
)
CONSTANT_TEST = 1e-6  # the statement's: std <= 1e-6 * mean(|x|)


def feature_batch():
    """SAMPLES float32 samples of each kind of FEATURES."""
    import torch

    g = torch.Generator().manual_seed(3)
    n = SAMPLES
    pressure = torch.full((n,), 101325.0)
    step_up = torch.nextafter(pressure, torch.tensor(float("inf")))
    offset = torch.full((n,), -5.0)
    columns = [280 + 20 * torch.randn(n, generator=g),
               torch.full((n,), 1.0),
               torch.where(torch.arange(n) % 2 == 0, pressure, step_up),
               1e-10 * (1 + 0.005 * torch.randn(n, generator=g)),
               torch.zeros(n),
               1e-5 * (1 + 0.3 * torch.rand(n, generator=g)),
               torch.randn(n, generator=g),
               torch.where(torch.arange(n) % 3 == 0, offset, torch.nextafter(offset, pressure)),
               pressure + float32_steps(101325.0) * (torch.arange(n) % 13),
               # 1024 and 1024 + 2^-7: every sum of these samples, in any order, is exact in
               # float32, so a right answer is exact here whatever its summation
               1024.0 + 2.0 ** -7 * (torch.arange(n) % 2)]
    return torch.stack(columns, dim=1)


def sums_are_exact(x64):
    """Per column: every partial sum of its samples is a float32 number (all samples are
    multiples of one power of two q, and their absolute sum stays below 2^24 q)."""
    import torch

    exact = []
    for column in x64.T:
        q = 2.0 ** -30  # the smallest step tried; a column of finer values is not exact
        while q < 2.0 ** 30 and bool(torch.all(torch.remainder(column, 2 * q) == 0)):
            q *= 2
        fine = bool(torch.all(torch.remainder(column, q) == 0))
        exact.append(fine and float(column.abs().sum()) < 2.0 ** 24 * q)
    return torch.tensor(exact)


def float32_steps(value: float) -> float:
    """The gap between ``value`` and the next float32 (rounding noise comes in these)."""
    import numpy as np

    return float(np.spacing(np.float32(value)))


def standardised(x64, correction: int):
    """The exact answer (float64 from the float32 batch), and which columns are constant."""
    import torch

    std = x64.std(dim=0, correction=correction)
    constant = std <= CONSTANT_TEST * x64.abs().mean(dim=0)
    z = (x64 - x64.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(z), z), constant


def normalise_tolerance(x64, z):
    """Per element, how far a float32 computation may land from the float64 answer.

    With N samples, M = mean|x| and s the std: the float32 mean is within γ_N·M of the
    exact one (a sum of N terms, then a division), which is γ_N·M/s in standardised
    units, and the std, computed from centred values that carry that error, adds the same
    relative error again, times |z|; the squares, their sum, the division and the square
    root add γ_{N+3}·|z|. Twice the sum covers the second-order terms and summation
    orders (pairwise, Welford) whose constants differ. Constant columns are exact: 0.
    Where every sum of the samples is exact (:func:`sums_are_exact`), the mean's error is
    its one division's.
    """
    import torch

    n = x64.shape[0]
    scale = x64.abs().mean(dim=0) / x64.std(dim=0, correction=0).clamp_min(1e-300)
    mean_error = torch.where(sums_are_exact(x64), torch.tensor(gamma(1)), torch.tensor(gamma(n)))
    first_order = mean_error * scale * (1 + z.abs()) + gamma(n + 3) * z.abs()
    return 2 * first_order + 2 * FLOAT32_UNIT * z.abs()


def normalise_judge(namespace: dict) -> tuple:
    import torch

    x = feature_batch()
    given = x.clone()  # compared with x afterwards: the caller's batch must be left as it was
    got = learner(namespace, "normalise")(given)
    if not isinstance(got, torch.Tensor):
        # A numpy array (or list) standardised right is still no input for a torch model.
        kind = "numpy array" if type(got).__module__ == "numpy" else type(got).__name__
        return failed(f"normalise returned a {kind}: return a torch tensor, as x is "
                      "(torch.from_numpy turns a numpy array into one)")
    got = got.detach().to(torch.float64)
    if got.shape != x.shape:
        return failed(f"your output has shape {tuple(got.shape)}, the input {tuple(x.shape)}")
    x64 = x.to(torch.float64)
    for feature, (description, hint) in enumerate(FEATURES):
        message = _feature_mistake(x64, got, feature)
        if message:
            about_the_test = hint and "constant" in message
            return failed(f"feature {feature} ({description}) {message}"
                          + (f" — {hint}" if about_the_test else ""))
    if not torch.equal(given, x):
        return failed("the right values, but your normalise changed its input x in place: "
                      "leave x unchanged and return a new tensor (x - mean, not x -= mean) — "
                      "the caller still holds that batch, and would see it standardised")
    return passed(f"all {len(FEATURES)} kinds of feature standardised to float32 precision; "
                  "the constant ones are exactly 0 and the tiny-valued ones kept")


def _feature_mistake(x64, got, feature: int):
    import torch

    mine = got[:, feature]
    answers = [standardised(x64, correction) for correction in (0, 1)]
    constant = bool(answers[0][1][feature])
    if not torch.isfinite(mine).all():
        return "is NaN or inf in yours: its std is 0 (or nearly): a constant feature must become 0"
    if constant:
        if bool((mine == 0).all()):
            return None
        return _constant_mistake(x64[:, feature], mine)
    gaps = [float(((mine - z[:, feature]).abs() - normalise_tolerance(x64, z)[:, feature]).max())
            for z, _ in answers]
    if min(gaps) <= 0:
        return None
    return _varying_mistake(x64, got, feature, answers[0][0][:, feature])


def _constant_mistake(column, mine) -> str:
    import torch

    ratio = float(column.std(correction=0) / column.abs().mean()) if column.abs().max() else 0.0
    centred = column - column.mean()
    # x − mean as float32 computes it: within a few float32 steps of the column's size
    if torch.allclose(mine, centred, rtol=0, atol=8 * FLOAT32_UNIT * float(column.abs().max())):
        return ("comes out as x − mean in yours: constant features become exactly 0 — "
                "dividing by one leaves x − mean")
    return (f"is constant by the statement's test (std = {ratio:.1e} × mean|x|, at most "
            f"{CONSTANT_TEST:g}), but yours standardises it (values up to "
            f"{float(mine.abs().max()):.3g}) instead of making it exactly 0")


def _varying_mistake(x64, got, feature: int, z) -> str:
    import torch

    mine = got[:, feature]
    column = x64[:, feature]
    centred, std = column - column.mean(), column.std(correction=0)
    if float(mine.abs().max()) == 0:
        return "is all zeros in yours: it was treated as constant, but it varies"
    if _matches_rows(x64, got):
        return "is not what each column's standardisation gives: yours standardises each row"
    for candidate, what in ((centred / std ** 2, "divided by the variance, not the std"),
                            (centred, "centred but not divided by the std"),
                            (column / std, "divided by the std but not centred")):
        if torch.allclose(mine, candidate, rtol=1e-3, atol=1e-9):
            return f"is {what} in yours"
    gap = float((mine - z).abs().max())
    relative = gap / max(float(z.abs().max()), 1.0)
    if 1e-4 < relative < 0.1:  # 2^-8 (bfloat16) to 2^-11 (float16), grown by sums
        return (f"differs by up to {gap:.2g} from the standardised values, about "
                f"{relative:.0e} of their size: the rounding of a 16-bit float (bfloat16 keeps "
                "8 bits, float16 11) — compute in float32")
    return f"differs by up to {gap:.2g} from the standardised values"


def _matches_rows(x64, got) -> bool:
    import torch

    std = x64.std(dim=1, correction=0, keepdim=True)
    rows = (x64 - x64.mean(dim=1, keepdim=True)) / std
    return bool(torch.allclose(got, rows, rtol=1e-3, atol=1e-6))


EXERCISES = [
    Exercise("01.feature_counts", COUNTS_STATEMENT, COUNTS_SKELETON, COUNTS_REFERENCE,
             COUNTS_WRONG, counts_judge, names=("feature_counts",),
             forbidden=("kosmoss.data",)),
    Exercise("01.normalise", NORMALISE_STATEMENT, NORMALISE_SKELETON, NORMALISE_REFERENCE,
             NORMALISE_WRONG, normalise_judge, names=("normalise",),
             forbidden=("kosmoss.data", "kosmoss.model")),
]
