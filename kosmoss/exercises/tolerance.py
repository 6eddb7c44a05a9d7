"""How far a right answer may be from the checker's reference, derived from rounding.

A checker computes its reference in float64 (or exactly, for counts and byte sizes) and
accepts a learner's float32 answer within the worst-case rounding error of the
computation the statement asks for: n float32 operations in a row multiply by at most
``(1 + u)^n``, so a result is within ``gamma(n) = n·u / (1 − n·u)`` of the exact one,
relative to the sum of the magnitudes involved (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., 2002, Lemma 3.1 and §4.2 for sums, in any order). Each
checker says in its own module which n it uses and why.
"""
from __future__ import annotations

from typing import Optional

FLOAT32_UNIT = 2.0 ** -24  # unit roundoff of float32, round to nearest
FLOAT64_UNIT = 2.0 ** -53  # unit roundoff of float64


def gamma(operations: int, unit: float = FLOAT32_UNIT) -> float:
    """Higham's γ_n: the relative error bound of ``operations`` roundings in a row."""
    if operations * unit >= 1:
        raise ValueError(f"{operations} roundings of {unit:g}: no bound")
    return operations * unit / (1 - operations * unit)


def float64_close(got: float, expected: float, operations: int,
                  scale: Optional[float] = None) -> bool:
    """``got`` is ``expected`` up to ``operations`` float64 roundings (of Python floats),
    relative to ``scale`` (the largest magnitude the computation meets; default the
    result's — right when no subtraction cancels)."""
    bound = gamma(operations, FLOAT64_UNIT) * abs(expected if scale is None else scale)
    return abs(got - expected) <= bound
