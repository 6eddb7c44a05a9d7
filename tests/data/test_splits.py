"""The split's sizes without torch (kosmoss.data.splits) are the sizes torch's random_split
gives: the flags refuse a batch by them before torch is imported, the run splits with torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.core.errors import ConfigError
from kosmoss.data.splits import SPLITS, split_sizes
from kosmoss.run.config import check_batch_fits

FRACTIONS = st.sampled_from([SPLITS, (0.5, 0.5), (0.7, 0.2, 0.1), (1 / 3, 1 / 3, 1 / 3),
                             (0.9, 0.05, 0.05), (0.25, 0.25, 0.25, 0.25), (1.0,)])


def _torch_sizes(n, fractions):
    parts = torch.utils.data.random_split(range(n), list(fractions),
                                          generator=torch.Generator().manual_seed(0))
    return [len(part) for part in parts]


@pytest.mark.filterwarnings("ignore:Length of split at index")  # torch's, for tiny n
@settings(max_examples=200, deadline=None)  # randperm(n) per example: n kept small
@given(st.integers(min_value=0, max_value=100_000), FRACTIONS)
def test_the_sizes_are_torchs_random_split_sizes(n, fractions):
    assert split_sizes(n, fractions) == _torch_sizes(n, fractions)


@pytest.mark.filterwarnings("ignore:Length of split at index")
@pytest.mark.parametrize("n", [0, 1, 2, 3, 9, 10, 11, 19, 2048, 4096, 999_999])
def test_the_sizes_at_the_edges_of_rounding(n):
    assert split_sizes(n) == _torch_sizes(n, SPLITS) and sum(split_sizes(n)) == n


def test_a_batch_of_every_training_row_fits_and_one_more_does_not():
    train = split_sizes(2048)[0]
    check_batch_fits("tiny", train, train)
    with pytest.raises(ConfigError) as error:
        check_batch_fits("tiny", train, train + 1)
    assert error.value.field == "batch_size"
    assert f"{{field}} {train + 1} is larger than the {train} training samples" in \
        error.value.template
