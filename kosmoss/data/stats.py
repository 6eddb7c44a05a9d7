"""Per-feature mean and standard deviation, computed in one streaming pass.

Chan et al.'s pairwise update merges (count, mean, M2) of successive chunks, so the
whole dataset never has to be in memory and the result equals ``np.mean``/``np.std``
(population std) over everything, up to float64 rounding.

Which features are constant is decided relative to each feature's own scale, never by an
absolute cut: trace-gas mixing ratios are ~1e-10 and vary by ~0.5 %, so their std is
~1e-13, yet they carry as much signal as temperature. The model divides by
``Statistics.x_scale()``; ``kosmoss data info NAME --json`` counts them as ``constant_x``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHUNK_ROWS = 8192  # bounds the float64 temporary per update (8192 x 4128 x 8 B = 270 MB)
# About 8 float32 ulps (eps 1.2e-7): a feature whose std is below this share of its mean
# differs between columns only by the rounding of its float32 storage.
CONSTANT_RELATIVE_STD = 1e-6


@dataclass
class RunningMoments:
    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = field(default=None, repr=False)

    def update(self, rows: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):  # a NaN or inf in the data: Statistics.not_numbers
            for start in range(0, len(rows), CHUNK_ROWS):
                self._merge(np.asarray(rows[start:start + CHUNK_ROWS], dtype=np.float64))

    def _merge(self, chunk: np.ndarray) -> None:
        n_b = len(chunk)
        if n_b == 0:
            return
        mean_b = chunk.mean(axis=0)
        m2_b = ((chunk - mean_b) ** 2).sum(axis=0)
        if self.count == 0:
            self.count, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta**2 * (self.count * n_b / n)
        self.count = n

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.m2 / max(self.count, 1), 0.0))


@dataclass(frozen=True)
class Statistics:
    """Mean/std of x and y. ``std`` may be 0 (constant features): divide by
    :meth:`x_scale` / :meth:`y_scale`, which are 1 where a feature is constant."""

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray

    @staticmethod
    def is_constant(std: np.ndarray, mean: np.ndarray | None = None) -> np.ndarray:
        """True where a feature does not vary: std within float32 rounding of ``|mean|``
        (exactly 0 where the mean is 0); without ``mean``, only where std is 0."""
        std = np.asarray(std, dtype=np.float64)
        if mean is None:
            return std <= 0.0
        return std <= CONSTANT_RELATIVE_STD * np.abs(np.asarray(mean, dtype=np.float64))

    @staticmethod
    def safe_std(std: np.ndarray, mean: np.ndarray | None = None) -> np.ndarray:
        # A constant feature carries no information: dividing by 1 keeps it at 0 after centring.
        return np.where(Statistics.is_constant(std, mean), 1.0, std)

    def not_numbers(self) -> tuple:
        """(input, output) features whose mean or std is NaN or inf: they hold such a value
        (float32 values summed in float64 cannot overflow)."""
        return tuple(int(np.count_nonzero(~(np.isfinite(mean) & np.isfinite(std))))
                     for mean, std in ((self.x_mean, self.x_std), (self.y_mean, self.y_std)))

    def x_constant(self) -> np.ndarray:
        return self.is_constant(self.x_std, self.x_mean)

    def x_scale(self) -> np.ndarray:
        """What x is divided by after centring: its std, or 1 where it is constant."""
        return self.safe_std(self.x_std, self.x_mean)

    def y_scale(self) -> np.ndarray:
        return self.safe_std(self.y_std, self.y_mean)

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, x_mean=self.x_mean, x_std=self.x_std, y_mean=self.y_mean, y_std=self.y_std)

    @classmethod
    def load(cls, path: Path) -> "Statistics":
        with np.load(path) as data:
            return cls(**{key: data[key] for key in ("x_mean", "x_std", "y_mean", "y_std")})

