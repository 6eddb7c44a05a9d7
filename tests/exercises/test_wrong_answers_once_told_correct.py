"""Four plausible wrong answers the checkers once called correct, as a learner wrote them:
each is now rejected, with a message that says why.

- 01.normalise, the usual `std == 0` guard: a float32 column one ulp apart came out
  0..1.98, not 0;
- 08.training_memory, every bias forgotten: 0.6 % low, inside the old 1 % tolerance;
- 03.average_gradients, `p.grad /= 2`: 1.5 instead of 1.0 on 3 ranks;
- 09.ring_all_reduce, the reduce-scatter's index walking `+step`: 4.65 away from
  `all_reduce` on 3 ranks.
"""
from __future__ import annotations

import pytest

from kosmoss.exercises.core import WRONG, find
from kosmoss.exercises.judging import judge_sources

STD_ZERO_GUARD = '''
import torch


def normalise(x):
    mean = x.mean(dim=0)
    std = x.std(dim=0)
    std[std == 0] = 1.0  # constant columns: avoid dividing by zero
    return (x - mean) / std
'''

BIASES_FORGOTTEN = '''
from torch import nn


def training_memory(model, batch_size):
    weights = sum(layer.weight.numel() for layer in model if isinstance(layer, nn.Linear))
    first = next(layer for layer in model if isinstance(layer, nn.Linear))
    activations = first.in_features
    width = first.in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            width = layer.out_features
        activations += width
    activations += width  # the targets
    return 4 * 4 * weights + 4 * batch_size * activations
'''

DIVIDE_BY_TWO = '''
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2
'''

PLUS_STEP = '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for step in range(n - 1):
        send = chunks[(rank + step) % n].clone()
        recv = torch.empty_like(chunks[(rank + step - 1) % n])
        req = dist.isend(send, (rank + 1) % n)
        dist.recv(recv, (rank - 1) % n)
        req.wait()
        chunks[(rank + step - 1) % n] += recv
    for step in range(n - 1):
        send = chunks[(rank + 1 - step) % n].clone()
        recv = torch.empty_like(chunks[(rank - step) % n])
        req = dist.isend(send, (rank + 1) % n)
        dist.recv(recv, (rank - 1) % n)
        req.wait()
        chunks[(rank - step) % n].copy_(recv)
    return tensor
'''


def _verdict(exercise_id: str, body: str):
    exercise = find(exercise_id)
    return judge_sources([(exercise, exercise.cell(body))])[0]


def test_the_std_zero_guard_misses_a_column_one_float32_step_apart():
    verdict = _verdict("01.normalise", STD_ZERO_GUARD)
    assert verdict.status == WRONG, verdict.line
    assert "surface pressure whose samples differ by one float32 step" in verdict.message
    assert "a test for std == 0" in verdict.message


def test_forgetting_every_bias_is_named_exactly():
    verdict = _verdict("08.training_memory", BIASES_FORGOTTEN)
    assert verdict.status == WRONG, verdict.line
    assert "short of it by exactly the biases" in verdict.message, verdict.line


@pytest.mark.slow
def test_dividing_by_two_is_right_at_two_ranks_only():
    verdict = _verdict("03.average_gradients", DIVIDE_BY_TWO)
    assert verdict.status == WRONG, verdict.line
    assert [(size, ok) for size, ok, _ in verdict.per_world_size] == \
        [(2, True), (3, False), (4, False)]
    assert "divided by 2, not by the world size (3)" in verdict.message, verdict.line


@pytest.mark.slow
def test_a_ring_walking_plus_step_is_right_at_two_ranks_only():
    verdict = _verdict("09.ring_all_reduce", PLUS_STEP)
    assert verdict.status == WRONG, verdict.line
    assert [(size, ok) for size, ok, _ in verdict.per_world_size] == \
        [(2, True), (3, False), (4, False)]
    assert verdict.message.startswith("at 3 ranks: ") and "holds the sum of rank(s)" in \
        verdict.message, verdict.line
