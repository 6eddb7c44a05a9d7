import numpy as np

from kosmoss.data.stats import RunningMoments, Statistics


def test_streaming_moments_equal_numpy_on_uneven_chunks():
    data = np.random.default_rng(1).normal(3.0, 2.0, size=(1000, 6)) * [1, 10, 1e-3, 1, 1, 0]
    moments = RunningMoments()
    for start, stop in [(0, 1), (1, 300), (300, 301), (301, 1000)]:
        moments.update(data[start:stop])
    np.testing.assert_allclose(moments.mean, data.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moments.std, data.std(axis=0), rtol=1e-10, atol=1e-12)


def test_zero_variance_is_safe():
    std = np.array([0.0, 2.0, 1e-20])
    np.testing.assert_array_equal(Statistics.safe_std(std), [1.0, 2.0, 1.0])
