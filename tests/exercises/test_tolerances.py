"""The checkers' tolerances, tried on inputs hypothesis picks: every right answer a
learner may compute in float32 (or float64, in another order of operations) is inside
its tolerance, and a wrong one — a rank's values left out, a forgotten factor — is not.
These run the checkers' own tolerance functions, in this process (no ranks needed)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.exercises import (lesson01, lesson03, lesson04, lesson08, lesson09, lesson09b,
                               lesson11, metrics)
from kosmoss.exercises.tolerance import FLOAT32_UNIT, FLOAT64_UNIT, float64_close, gamma

SETTINGS = settings(max_examples=60, deadline=None)
ranks = st.integers(min_value=2, max_value=4)


def _float32_vectors(n: int, size: int, seed: int):
    """n ranks' float32 values over several orders of magnitude, signs mixed."""
    generator = torch.Generator().manual_seed(seed)
    scale = 10 ** torch.randint(-3, 4, (n, 1), generator=generator).float()
    return list(torch.randn(n, size, generator=generator) * scale)


@SETTINGS
@given(n=ranks, size=st.integers(1, 40), seed=st.integers(0, 2 ** 31), order=st.randoms())
def test_a_float32_sum_in_any_order_is_inside_the_ring_tolerance(n, size, seed, order):
    inputs = _float32_vectors(n, size, seed)
    exact, tolerance = lesson09.ring_tolerance(inputs)
    shuffled = list(inputs)
    order.shuffle(shuffled)
    total = shuffled[0].clone()
    for x in shuffled[1:]:
        total += x  # float32, in this order
    assert bool(((total.double() - exact).abs() <= tolerance).all())
    # Rank 0 left out is seen wherever its values are above the rounding of the others.
    missing = sum(inputs[1:], torch.zeros(size)).double()
    assert bool(((missing - exact).abs() > tolerance)[inputs[0].abs() > 3 * tolerance].all())


@SETTINGS
@given(n=ranks, seed=st.integers(0, 2 ** 31), divide_first=st.booleans())
def test_averaging_gradients_as_ddp_or_as_a_learner_does_is_inside_the_tolerance(
        n, seed, divide_first):
    locals_ = [[g] for g in _float32_vectors(n, 30, seed)]
    tolerance = lesson03.average_tolerance(locals_, 0)
    exact = sum(g[0].double() for g in locals_) / n
    if divide_first:  # DDP's bucket: divide, then sum
        got = sum((g[0] / n for g in locals_[1:]), locals_[0][0] / n)
    else:
        got = sum((g[0] for g in locals_[1:]), locals_[0][0].clone()) / n
    assert bool(((got.double() - exact).abs() <= tolerance).all())
    halved = sum((g[0] for g in locals_[1:]), locals_[0][0].clone()) / 2
    if n > 2:
        seen = exact.abs() > 3 * tolerance  # where the average is above its own rounding
        assert bool(((halved.double() - exact).abs() > tolerance)[seen].all())


@SETTINGS
@given(shares=st.lists(st.integers(0, 30), min_size=2, max_size=4).filter(lambda s: sum(s)),
       seed=st.integers(0, 2 ** 31))
def test_a_float32_loss_summed_per_rank_then_over_ranks_is_inside_the_tolerance(shares, seed):
    generator = torch.Generator().manual_seed(seed)
    losses = torch.rand(sum(shares), generator=generator) * 10 ** torch.linspace(
        -2, 2, sum(shares))
    parts = torch.split(losses, shares)
    ranks_ = [{"samples": len(p)} for p in parts]
    total = torch.stack([p.sum() for p in parts]).sum()  # float32 throughout
    got = float(total / sum(shares))
    exact = float(losses.double().mean())
    assert abs(got - exact) <= metrics.exact_tolerance(ranks_) * exact


# ---------------------------------------------------------------- 01.normalise


def _columns(draw_scale, draw_spread, n, seed):
    generator = np.random.default_rng(seed)
    return (draw_scale * (1 + draw_spread * generator.standard_normal(n))).astype(np.float32)


@st.composite
def feature_batches(draw):
    """A float32 batch of columns at the statement's edges: constant (exactly, or one
    float32 step apart, positive or negative), or clearly varying (by 0.1 % or more)
    at any magnitude from 1e-12 to 1e6."""
    n = draw(st.integers(2, 80))
    columns = []
    for _ in range(draw(st.integers(1, 6))):
        scale = draw(st.sampled_from([-1.0, 1.0])) * 10.0 ** draw(st.integers(-12, 6))
        kind = draw(st.sampled_from(["constant", "one step", "zero", "varying"]))
        if kind == "varying":
            spread = 10.0 ** draw(st.integers(-3, 0))
            columns.append(_columns(scale, spread, n, draw(st.integers(0, 2 ** 31))))
        elif kind == "zero":
            columns.append(np.zeros(n, np.float32))
        else:
            value = np.float32(scale)
            step = np.nextafter(value, np.float32(np.inf)) if kind == "one step" else value
            columns.append(np.where(np.arange(n) % 2 == 0, value, step).astype(np.float32))
    return torch.from_numpy(np.stack(columns, axis=1))


def _torch_std(x, correction):
    std = x.std(dim=0, correction=correction)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    z = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(z), z)


def _two_pass(x):
    centred = x - x.mean(dim=0)
    std = (centred * centred).mean(dim=0).sqrt()
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    return torch.where(constant, torch.zeros_like(x), centred / torch.where(
        constant, torch.ones_like(std), std))


def _numpy(x):
    a = x.numpy()
    std, mean = a.std(axis=0), a.mean(axis=0)
    constant = std <= 1e-6 * np.abs(a).mean(axis=0)
    z = np.where(constant, 0.0, (a - mean) / np.where(constant, 1.0, std))
    return torch.from_numpy(z.astype(np.float32))


RIGHT_NORMALISE = (lambda x: _torch_std(x, 0), lambda x: _torch_std(x, 1), _two_pass, _numpy)


@SETTINGS
@given(x=feature_batches(), which=st.integers(0, len(RIGHT_NORMALISE) - 1))
def test_every_right_float32_normalisation_is_inside_the_tolerance(x, which):
    got = RIGHT_NORMALISE[which](x).double()
    x64 = x.double()
    for feature in range(x.shape[1]):
        assert lesson01._feature_mistake(x64, got, feature) is None, feature


@SETTINGS
@given(n=st.integers(4, 80), magnitude=st.integers(-10, 6))
def test_the_std_zero_guard_fails_on_any_column_one_step_apart(n, magnitude):
    value = np.float32(10.0 ** magnitude)
    column = np.where(np.arange(n) % 2 == 0, value, np.nextafter(value, np.float32(np.inf)))
    x = torch.from_numpy(column.astype(np.float32)).reshape(n, 1)
    std = x.std(dim=0)
    guarded = (x - x.mean(dim=0)) / torch.where(std == 0, torch.ones_like(std), std)
    assert lesson01._feature_mistake(x.double(), guarded.double(), 0) is not None


# ---------------------------------------------------------------- float64 arithmetic

rates = st.floats(1e-6, 1.0)
batches = st.integers(1, 2 ** 16)


@SETTINGS
@given(base_lr=rates, effective=batches, base=batches, rule=st.sampled_from(["linear", "sqrt"]))
def test_a_scaled_rate_in_any_order_is_inside_the_tolerance(base_lr, effective, base, rule):
    k = effective / base
    expected = base_lr * (k if rule == "linear" else math.sqrt(k))
    if rule == "linear":
        others = (base_lr * effective / base, effective * base_lr / base)
    else:
        others = (base_lr * math.sqrt(effective) / math.sqrt(base), base_lr * k ** 0.5)
    for got in others:
        assert float64_close(got, expected, lesson04.SCALED_ROUNDINGS)


@SETTINGS
@given(base_lr=rates, factor=st.floats(1.0, 64.0), warmup=st.integers(1, 500),
       step=st.integers(0, 600))
def test_a_warm_up_ramp_in_any_form_is_inside_the_tolerance(base_lr, factor, warmup, step):
    from kosmoss.scaling.arithmetic import warmup_factor

    target = base_lr * factor
    expected = target * warmup_factor(step, warmup, base_lr / target)
    t = min(step, warmup) / warmup
    for got in (base_lr + (target - base_lr) * t, base_lr * (1 - t) + target * t,
                (base_lr * (warmup - min(step, warmup)) + target * min(step, warmup)) / warmup):
        assert float64_close(got, expected, lesson04.WARMUP_ROUNDINGS, max(base_lr, target))


@SETTINGS
@given(nbytes=st.integers(1, 2 ** 40), seconds=st.floats(1e-6, 1e3), n=st.integers(1, 1024))
def test_bus_bandwidth_in_any_order_is_inside_the_tolerance(nbytes, seconds, n):
    expected = nbytes / seconds * lesson08.bus_factor(n)
    for got in (nbytes * 2 * (n - 1) / (n * seconds), nbytes / seconds * 2 * (n - 1) / n,
                2 * (n - 1) / n * nbytes / seconds):
        assert float64_close(got, expected, lesson08.BANDWIDTH_ROUNDINGS)


# ---------------------------------------------------------------- 04.noise_scale


@SETTINGS
@given(g_sq=st.floats(1e-8, 1e3), trace=st.floats(0.0, 1e5), small=st.integers(1, 512),
       times=st.integers(2, 64))
def test_noise_scale_parts_in_any_form_are_inside_the_tolerance(g_sq, trace, small, times):
    big = small * times
    small_sq, big_sq = g_sq + trace / small, g_sq + trace / big
    expected = lesson04._reference_parts(small_sq, big_sq, small, big)
    system = np.array([[1.0, 1.0 / small], [1.0, 1.0 / big]])
    solved = np.linalg.solve(system, np.array([small_sq, big_sq]))
    trace_first = (small_sq - big_sq) * small * big / (big - small)
    for got in (tuple(float(v) for v in solved), (big_sq - trace_first / big, trace_first)):
        assert lesson04._noise_mistake(got, expected, (small_sq, big_sq, small, big)) is None
    # and the true values, from which the norms were made, are inside too
    assert lesson04._noise_mistake((g_sq, trace), expected, (small_sq, big_sq, small, big)) \
        is None


@SETTINGS
@given(g_sq=st.floats(1e-3, 1e3), trace=st.floats(1e-2, 1e5), small=st.integers(1, 512),
       times=st.integers(2, 64))
def test_the_large_batchs_norm_taken_for_the_gradient_is_outside(g_sq, trace, small, times):
    big = small * times
    small_sq, big_sq = g_sq + trace / small, g_sq + trace / big
    expected = lesson04._reference_parts(small_sq, big_sq, small, big)
    if trace / big > 1e-9 * g_sq:  # a bias above float64's rounding of |G|²
        assert lesson04._noise_mistake((big_sq, expected[1]), expected,
                                       (small_sq, big_sq, small, big)) is not None


# ---------------------------------------------------------------- 11.row_parallel


@SETTINGS
@given(n=ranks, batch=st.integers(1, 6), features=st.integers(1, 40), outputs=st.integers(1, 6),
       seed=st.integers(0, 2 ** 31), order=st.randoms())
def test_a_row_parallel_sum_in_any_rank_order_is_inside_the_tolerance(n, batch, features,
                                                                     outputs, seed, order):
    generator = torch.Generator().manual_seed(seed)
    scale = 10.0 ** float(torch.randint(-3, 4, (1,), generator=generator))
    h = torch.randn(batch, features, generator=generator) * scale
    weight = torch.randn(outputs, features, generator=generator)
    bias = torch.randn(outputs, generator=generator) * scale
    exact = h.double() @ weight.double().T + bias.double()
    tolerance = lesson11.row_tolerance(h, weight, bias)
    slices = list(torch.tensor_split(torch.arange(features), n))
    order.shuffle(slices)
    partials = [h[:, cols] @ weight[:, cols].T for cols in slices]  # float32, each rank's
    total = partials[0].clone()
    for partial in partials[1:]:
        total += partial
    for got in (total + bias, total + bias * 1.0):
        assert bool(((got.double() - exact).abs() <= tolerance).all())
    twice = (total + 2 * bias).double()  # the bias added on two ranks
    seen = bias.double().abs() > 3 * tolerance.max(dim=0).values
    assert bool(((twice - exact).abs() > tolerance)[:, seen].all())


# ---------------------------------------------------------------- 09b: DDP's trajectory


def _trajectory(world_size: int, order: list, divide_first: bool):
    """DDP's computation in float32 as another right answer does it: the ranks' gradients
    summed in ``order``, divided before or after the sum."""
    from torch.nn.functional import mse_loss

    model = lesson09b.toy(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lesson09b.LR,
                                momentum=lesson09b.MOMENTUM)
    grads, weights = [], []
    for step in range(lesson09b.STEPS):
        per_rank = []
        for rank in range(world_size):
            model.zero_grad()
            x, y = lesson09b.shard(step, rank, world_size)
            mse_loss(model(x), y).backward()
            per_rank.append([p.grad.clone() for p in lesson09b._trainable(model)])
        for index, parameter in enumerate(lesson09b._trainable(model)):
            parts = [per_rank[r][index] / (world_size if divide_first else 1) for r in order]
            total = parts[0].clone()
            for part in parts[1:]:
                total += part
            parameter.grad = total if divide_first else total / world_size
        grads.append(lesson09b._flat(p.grad for p in lesson09b._trainable(model)))
        optimizer.step()
        weights.append(lesson09b._flat(model.parameters()))
    return {"grads": grads, "weights": weights}


@settings(max_examples=12, deadline=None)
@given(n=ranks, order=st.randoms(), divide_first=st.booleans())
def test_ddp_computed_in_any_order_is_inside_the_wrappers_tolerance(n, order, divide_first):
    ranks_in_order = list(range(n))
    order.shuffle(ranks_in_order)
    exact = lesson09b.trajectory(n, "float64")
    limits = lesson09b.tolerances(n)
    got = _trajectory(n, ranks_in_order, divide_first)
    for kind in ("grads", "weights"):
        for step in range(lesson09b.STEPS):
            assert float((got[kind][step] - exact[kind][step]).abs().max()) <= limits[kind][step]
    # a rank's gradient left out is far outside
    halved = _trajectory(n, ranks_in_order[1:], divide_first)
    assert float((halved["grads"][0] - exact["grads"][0]).abs().max()) > 10 * limits["grads"][0]


@SETTINGS
@given(n=st.integers(1, 2000), unit=st.sampled_from([FLOAT32_UNIT, FLOAT64_UNIT]))
def test_gamma_bounds_n_roundings_and_is_no_wider_than_highams(n, unit):
    """Higham's Lemma 3.1: n roundings in a row multiply by at most (1 + u)^n, and
    (1 + u)^n - 1 <= γ_n = n·u / (1 - n·u); both sides in exact rational arithmetic, so a
    bound halved, or taken to first order only (n·u), fails here."""
    worst = (1 + Fraction(unit)) ** n - 1
    highams = Fraction(n * unit) / (1 - Fraction(n * unit))
    # gamma itself runs in float64: a few roundings of its own above Higham's exact γ_n
    assert worst <= Fraction(gamma(n, unit)) <= highams * (1 + Fraction(4 * FLOAT64_UNIT))


def test_gamma_refuses_as_many_roundings_as_leave_no_bound():
    assert math.isfinite(gamma(2 ** 24 - 1))
    for n in (2 ** 24, 2 ** 25):  # n·u >= 1: (1 + u)^n - 1 is no longer below any γ
        with pytest.raises(ValueError, match=f"{n} roundings"):
            gamma(n)
