"""Where columns come from. Every source yields blocks in the schema of ``schema.py``,
so preparation, loading and training never know which one they got."""
from __future__ import annotations

from typing import Dict, Iterator, Protocol

import numpy as np

from .schema import ColumnSchema


class ColumnSource(Protocol):
    schema: ColumnSchema
    n_columns: int

    def iter_chunks(self, chunk_size: int) -> Iterator[Dict[str, np.ndarray]]: ...

    def describe(self) -> dict: ...


class SyntheticSource:
    """Physics-based synthetic columns; chunk ``k`` is seeded by ``(seed, k)`` so it is
    reproducible on its own."""

    def __init__(self, n_columns: int, seed: int = 42, levels: int | None = None):
        if n_columns < 1:
            raise ValueError(f"n_columns must be >= 1, got {n_columns}")
        self.schema = ColumnSchema() if levels is None else ColumnSchema(levels)
        self.n_columns = int(n_columns)
        self.seed = int(seed)

    def iter_chunks(self, chunk_size: int) -> Iterator[Dict[str, np.ndarray]]:
        from .synthetic import generate_columns

        for index, start in enumerate(range(0, self.n_columns, chunk_size)):
            rows = min(chunk_size, self.n_columns - start)
            yield generate_columns(self.schema, rows, np.random.SeedSequence([self.seed, index]))

    def describe(self) -> dict:
        return {"name": "synthetic", "seed": self.seed, "n_columns": self.n_columns,
                "levels": self.schema.levels}
