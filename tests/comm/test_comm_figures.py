"""The arithmetic of ``kosmoss comm`` on synthetic timings: exact values."""
import pytest

from kosmoss.core.errors import UsageError
from kosmoss.scaling import allreduce as figures

MIB = 2**20


def test_busbw_is_algbw_times_two_n_minus_one_over_n():
    # 8 MiB in 10 ms: algbw 838,860,800 B/s; 4 ranks: x 2*3/4 = 1.5.
    assert figures.algbw(8 * MIB, 0.01) == 838_860_800.0
    assert figures.busbw(8 * MIB, 0.01, 4) == pytest.approx(1_258_291_200.0, rel=1e-15)
    assert figures.bus_factor(2) == 1.0 and figures.bus_factor(8) == 1.75
    assert figures.busbw(MIB, 0.001, 2) == figures.algbw(MIB, 0.001)


def test_the_alpha_beta_fit_recovers_exact_timings():
    alpha, beta = 50e-6, 1 / 2e9
    sizes = [4096, 65536, MIB, 16 * MIB, 256 * MIB]
    fit = figures.fit_alpha_beta(sizes, [alpha + beta * s for s in sizes], ranks=4)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert fit.time(MIB) == pytest.approx(alpha + beta * MIB, rel=1e-9)
    # The ring behind it: alpha = 2(n-1) hops, beta = 2(n-1)/n / link bandwidth.
    link = figures.link_from_fit(fit)
    assert link["latency_s"] == pytest.approx(alpha / 6, rel=1e-9)
    assert link["bandwidth_Bps"] == pytest.approx(1.5 * 2e9, rel=1e-9)
    assert fit.as_dict()["asymptotic_algbw_Bps"] == pytest.approx(2e9, rel=1e-9)


def test_the_fit_weights_relative_errors_so_small_sizes_set_alpha():
    # 10 % noise on the largest size only: an unweighted fit would move alpha by ~1 ms.
    sizes = [4096, MIB, 256 * MIB]
    times = [20e-6 + s / 1e9 for s in sizes]
    times[-1] *= 1.1
    fit = figures.fit_alpha_beta(sizes, times, ranks=2)
    assert fit.alpha_s == pytest.approx(20e-6, abs=2e-6)


def test_a_fit_needs_two_different_sizes():
    with pytest.raises(ValueError):
        figures.fit_alpha_beta([MIB, MIB], [0.001, 0.002], ranks=2)
    assert figures.fit_rows([figures.size_row(MIB, [0.001], 2)], 2) is None


def test_size_row_takes_the_median_of_the_repeats():
    row = figures.size_row(MIB, [0.004, 0.001, 0.002], ranks=2)
    assert row["time_s"] == 0.002 and row["min_time_s"] == 0.001 and row["max_time_s"] == 0.004
    assert row["algbw_Bps"] == MIB / 0.002 and row["size"] == "1 MiB"


@pytest.mark.parametrize("text, size", [("4K", 4096), ("1.5M", 1572864), ("25MiB", 25 * MIB),
                                        ("4096", 4096), ("1g", 2**30), ("6", 4)])
def test_sizes_are_parsed_in_binary_units_and_whole_floats(text, size):
    assert figures.parse_size(text, "--sizes") == size


@pytest.mark.parametrize("text, message", [("0", "must be positive"), ("3", "must be positive"),
                                           ("-4K", "not a size"), ("1X", "not a size")])
def test_bad_sizes_name_the_flag(text, message):
    with pytest.raises(UsageError, match=f"--sizes {text}: .*{message}"):
        figures.parse_size(text, "--sizes")


def test_default_sizes_span_4k_to_256m_with_the_gradient_and_the_bucket():
    gradient = figures.model_gradient_bytes()
    assert gradient == 4 * 488_852  # 4128x100 + 3 hidden layers + 100x552, with biases
    sizes = figures.default_sizes([gradient, figures.DDP_BUCKET_BYTES])
    assert sizes[0] == 4096 and sizes[-1] == 256 * MIB
    assert gradient in sizes and 25 * MIB in sizes and sizes == sorted(set(sizes))
    assert max(figures.default_sizes([gradient], max_size=32 * MIB)) == 16 * MIB
