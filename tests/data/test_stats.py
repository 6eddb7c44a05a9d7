import numpy as np
import pytest

from kosmoss.data.schema import ColumnSchema
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.stats import RunningMoments, Statistics


def test_streaming_moments_equal_numpy_on_uneven_chunks():
    data = np.random.default_rng(1).normal(3.0, 2.0, size=(1000, 6)) * [1, 10, 1e-3, 1, 1, 0]
    moments = RunningMoments()
    for start, stop in [(0, 1), (1, 300), (300, 301), (301, 1000)]:
        moments.update(data[start:stop])
    np.testing.assert_allclose(moments.mean, data.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moments.std, data.std(axis=0), rtol=1e-10, atol=1e-12)


def _statistics_of(x: np.ndarray, chunk: int = 300) -> Statistics:
    moments = RunningMoments()
    for start in range(0, len(x), chunk):
        moments.update(x[start:start + chunk])
    return Statistics(moments.mean, moments.std, np.zeros(1), np.ones(1))


def test_tiny_valued_features_that_vary_are_not_constant():
    # Once: ccl4_vmr (~8e-11, 0.5 % scatter) has std ~4e-13, under the old absolute cut
    # of 1e-12, and was divided by one: erased from the model's input.
    rng = np.random.default_rng(0)
    n = 2048
    columns = {
        "ccl4_vmr": 8e-11 * (1 + 0.005 * rng.standard_normal(n)),
        "tiny but varying around zero": 1e-20 * rng.standard_normal(n),
        "constant 2.5e-6 (stratospheric q)": np.full(n, 2.5e-6),
        "constant 0.1 (sums with rounding)": np.full(n, 0.1),
        "exact zero": np.zeros(n),
        # computed in float64 with a spread far below float32 resolution: after storage
        # the values differ by at most an ulp, which is rounding, not signal
        "pressure at the model top": 1.0e5 * (1 + 3e-8 * rng.standard_normal(n)),
    }
    x = np.stack(list(columns.values()), axis=1).astype(np.float32)
    assert len(np.unique(x[:, -1])) > 1  # the last column does differ after storage
    stats = _statistics_of(x)
    assert stats.x_std[0] < 1e-12  # the case the absolute cut got wrong
    assert stats.x_constant().tolist() == [False, False, True, True, True, True]
    scale = stats.x_scale()
    np.testing.assert_array_equal(scale[:2], stats.x_std[:2])
    np.testing.assert_array_equal(scale[2:], 1.0)
    normalized = (x - stats.x_mean) / scale
    assert np.all(np.isfinite(normalized))
    np.testing.assert_allclose(normalized[:, :2].std(axis=0), 1.0, rtol=1e-3)
    assert np.abs(normalized[:, 2:]).max() < 1e-2  # constant ones stay (about) at zero


def test_safe_std_without_the_mean_only_replaces_zero():
    std = np.array([0.0, 2.0, 1e-20])
    np.testing.assert_array_equal(Statistics.safe_std(std), [1.0, 2.0, 1e-20])
    mean = np.array([5.0, 1.0, 0.0])
    np.testing.assert_array_equal(Statistics.safe_std(std, mean), [1.0, 2.0, 1e-20])
    np.testing.assert_array_equal(Statistics.safe_std(np.array([4e-6]), np.array([5.0])), [1.0])


@pytest.fixture(scope="module")
def synthetic_statistics():
    source = SyntheticSource(512, seed=42)
    x = np.concatenate([source.schema.flatten(b)[0] for b in source.iter_chunks(256)])
    return x, _statistics_of(x, chunk=256)


def test_on_the_synthetic_schema_every_mixing_ratio_varies(synthetic_statistics):
    x, stats = synthetic_statistics
    constant = stats.x_constant()
    col = ColumnSchema().x_slices()["col_inputs"]
    names = ColumnSchema().block_variables()["col_inputs"]
    per_variable = constant[col].reshape(ColumnSchema().levels, len(names))
    for gas in ("ccl4_vmr", "cfc11_vmr", "cfc12_vmr", "hcfc22_vmr", "co2_vmr", "o2_vmr"):
        assert not per_variable[:, names.index(gas)].any(), gas
    spread = x.max(axis=0).astype(np.float64) - x.min(axis=0)
    assert constant[spread == 0].all()  # features with one value are constant
    # anything whose values spread over more than 1e-4 of their size is kept
    relative_spread = spread / np.maximum(np.abs(stats.x_mean), np.finfo(np.float64).tiny)
    assert not constant[relative_spread > 1e-4].any()
    assert (stats.x_std[~constant] > 0).all()
