"""The checkers' tolerances, tried on inputs hypothesis picks: every right answer a
learner may compute in float32 (or float64, in another order of operations) is inside
its tolerance, and a wrong one — a rank's values left out, a forgotten factor — is not.
These run the checkers' own tolerance functions, in this process (no ranks needed)."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.exercises import lesson01, lesson03, lesson04, lesson08, lesson09, metrics
from kosmoss.exercises.tolerance import float64_close

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
