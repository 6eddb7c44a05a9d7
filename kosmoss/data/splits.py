"""The train / val / test split's sizes, known without torch: flags check a batch against
the training rows before torch is imported (kosmoss.run.flags)."""
from __future__ import annotations

import math
from typing import List, Sequence

SPLITS = (0.8, 0.1, 0.1)  # train, val, test: the one definition every layer uses


def split_sizes(n: int, fractions: Sequence[float] = SPLITS) -> List[int]:
    """The sizes ``torch.utils.data.random_split(range(n), fractions)`` gives: each part
    floor(n x fraction), the remainder handed out one by one from the first part. Written
    here because importing torch for three integers costs seconds; tests/data/test_splits.py
    holds it equal to torch's for every n it draws."""
    sizes = [math.floor(n * fraction) for fraction in fractions]
    for i in range(n - sum(sizes)):
        sizes[i % len(sizes)] += 1
    return sizes
