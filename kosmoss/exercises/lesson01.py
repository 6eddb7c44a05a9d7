"""Lesson 01 (context and data): count the features of the flattened schema; standardise
inputs without erasing tiny-valued features.

    kosmoss check 01
"""
from __future__ import annotations

from .core import Exercise, failed, learner, passed

# ---------------------------------------------------------------- 01.feature_counts

COUNTS_STATEMENT = """\
**Count the features of a flattened column with any number of levels.**

Write `feature_counts(levels)` returning `(n_x, n_y)`: the length of one flattened input
row and of one flattened target row for a column with `levels` full levels (so
`levels + 1` half levels and `levels - 1` interfaces), with the blocks of the
`3dcorrection` schema printed in this lesson. The checker compares with
`kosmoss.data.schema.ColumnSchema(levels)` for several level counts, the IFS's `137`
among them.
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
    "every block on full levels": '''
def feature_counts(levels):
    return 17 + levels * (27 + 2 + 1), 4 * levels
''',
    "hard-coded for 137 levels": '''
def feature_counts(levels):
    return 4128, 552
''',
}

LEVELS = (137, 60, 10, 2)


def counts_judge(namespace: dict) -> tuple:
    from ..data.schema import ColumnSchema

    mine = learner(namespace, "feature_counts")
    right_for = []
    for levels in LEVELS:
        schema = ColumnSchema(levels)
        got = mine(levels)
        try:
            n_x, n_y = got
        except (TypeError, ValueError):
            return failed(f"feature_counts({levels}) returned {got!r}: return a pair (n_x, n_y)")
        for name, value, expected in (("n_x", n_x, schema.n_x), ("n_y", n_y, schema.n_y)):
            if value != expected:
                hint = (f" (right for {right_for[0]} levels: is a level count hard-coded?)"
                        if right_for else "")
                return failed(f"for {levels} levels your {name} is {value!r}, the schema's is "
                              f"{expected}{hint}")
        right_for.append(levels)
    return passed(f"n_x and n_y match the schema for {', '.join(map(str, LEVELS))} levels")


# ---------------------------------------------------------------- 01.normalise

NORMALISE_STATEMENT = """\
**Standardise each input feature, keeping tiny-valued but varying features.**

Write `normalise(x)`: `x` is a float tensor of shape (samples, features); return a tensor
of the same shape where each feature (column) is centred by its mean and divided by its
standard deviation over the samples. A feature is *constant* only when its standard
deviation is at most `1e-6` times its mean absolute value (exactly zero included):
constant features become `0`, never NaN. Mixing ratios of trace gases are around 1e-10
and vary by a fraction of a percent: they are not constant. The checker feeds a batch
with features of every kind and compares feature by feature.
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
    mean = x.mean(dim=0)
    std = x.std(dim=0, correction=0)
    # Relative, not absolute: a mixing ratio of 1e-10 has a tiny std and still varies.
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    return (x - mean) / torch.where(constant, torch.ones_like(std), std)
'''

NORMALISE_WRONG = {
    "absolute cut at 1e-12 (erases trace gases)": '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    return (x - x.mean(dim=0)) / torch.where(std > 1e-12, std, torch.ones_like(std))
''',
    "no guard (NaN for constants)": '''
def normalise(x):
    return (x - x.mean(dim=0)) / x.std(dim=0, correction=0)
''',
}

FEATURES = ("temperature (around 280 K)", "top-of-atmosphere pressure (the same in every "
            "column)", "a trace gas around 1e-10 varying by 0.5 % (not constant)",
            "a feature that is always 0", "a mixing ratio around 1e-5 (not constant)",
            "a standard normal feature")


def feature_batch():
    """64 samples of the six kinds of FEATURES, float64."""
    import torch

    g = torch.Generator().manual_seed(3)
    n = 64
    columns = [280 + 20 * torch.randn(n, generator=g, dtype=torch.float64),
               torch.full((n,), 1.0, dtype=torch.float64),
               1e-10 * (1 + 0.005 * torch.randn(n, generator=g, dtype=torch.float64)),
               torch.zeros(n, dtype=torch.float64),
               1e-5 * (1 + 0.3 * torch.rand(n, generator=g, dtype=torch.float64)),
               torch.randn(n, generator=g, dtype=torch.float64)]
    return torch.stack(columns, dim=1)


def expected_normalised(x, correction: int):
    import torch

    std = x.std(dim=0, correction=correction)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    return (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)


def normalise_judge(namespace: dict) -> tuple:
    import torch

    x = feature_batch()
    got = learner(namespace, "normalise")(x.clone())
    got = torch.as_tensor(got, dtype=torch.float64)
    if got.shape != x.shape:
        return failed(f"your output has shape {tuple(got.shape)}, the input {tuple(x.shape)}")
    # Either standard deviation (over n or n - 1 samples) standardises.
    candidates = [expected_normalised(x, correction) for correction in (0, 1)]
    for feature, description in enumerate(FEATURES):
        mine = got[:, feature]
        if torch.isnan(mine).any() or torch.isinf(mine).any():
            return failed(f"feature {feature} ({description}) is NaN or inf in your output: "
                          "a constant feature must become 0")
        gap = min(float((mine - right[:, feature]).abs().max()) for right in candidates)
        if gap > 1e-6:
            what = ("is (almost) all zeros in yours: it was treated as constant"
                    if float(mine.abs().max()) < 1e-6
                    else f"differs by {gap:.2g} from the standardised values")
            return failed(f"feature {feature} ({description}) {what}")
    return passed(f"all {len(FEATURES)} kinds of feature standardised; the constant ones are 0 "
                  "and the tiny-valued ones kept")


EXERCISES = [
    Exercise("01.feature_counts", COUNTS_STATEMENT, COUNTS_SKELETON, COUNTS_REFERENCE,
             COUNTS_WRONG, counts_judge, names=("feature_counts",)),
    Exercise("01.normalise", NORMALISE_STATEMENT, NORMALISE_SKELETON, NORMALISE_REFERENCE,
             NORMALISE_WRONG, normalise_judge, names=("normalise",)),
]
