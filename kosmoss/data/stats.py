"""Per-feature mean and standard deviation, computed in one streaming pass.

Chan et al.'s pairwise update merges (count, mean, M2) of successive chunks, so the
whole dataset never has to be in memory and the result equals ``np.mean``/``np.std``
(population std) over everything, up to float64 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHUNK_ROWS = 8192  # bounds the float64 temporary per update (8192 x 4128 x 8 B = 270 MB)


@dataclass
class RunningMoments:
    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = field(default=None, repr=False)

    def update(self, rows: np.ndarray) -> None:
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
    """Mean/std of x and y. ``std`` may be 0 (constant features); use :meth:`safe_std`."""

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray

    @staticmethod
    def safe_std(std: np.ndarray, eps: float = 1e-12) -> np.ndarray:
        # A constant feature carries no information: dividing by 1 keeps it at 0 after centring.
        return np.where(std > eps, std, 1.0)

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, x_mean=self.x_mean, x_std=self.x_std, y_mean=self.y_mean, y_std=self.y_std)

    @classmethod
    def load(cls, path: Path) -> "Statistics":
        with np.load(path) as data:
            return cls(**{key: data[key] for key in ("x_mean", "x_std", "y_mean", "y_std")})
