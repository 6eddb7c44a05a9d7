"""What the checkers' collective recorders (kosmoss/exercises/watch.py) read of torch's
collectives: the parameter that holds what a rank sends, by name, as the installed
torch.distributed calls it."""
from __future__ import annotations

import inspect

import pytest
import torch.distributed as dist

from kosmoss.exercises.metrics import SENT


@pytest.mark.parametrize("name", SENT)
def test_what_each_gather_sends_is_a_parameter_of_torchs_collective(name):
    assert SENT[name] in inspect.signature(getattr(dist, name)).parameters
