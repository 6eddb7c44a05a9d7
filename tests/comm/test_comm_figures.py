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


def _slow_link_result():
    """Two ranks across a 1 Mbit/s link, timed as measured there (the two smallest sizes
    came faster than the line through the rest: α fits below 0)."""
    from kosmoss.scaling.allreduce import MIB

    measured = {4096: 926e-6, 16384: 0.139, 65536: 0.560, 262144: 2.21, MIB: 9.04}
    rows = [figures.size_row(size, [t, t], 2) for size, t in measured.items()]
    fit = figures.fit_alpha_beta(list(measured), list(measured.values()), 2)
    plan = dict(ranks=2, nodes=2, ranks_per_node=1, backend="gloo", device="cpu", repeats=2,
                host_namespaces=True, link_rate="1mbit")
    return dict(plan=plan, groups={"world": dict(ranks=2, rows=rows, fit=fit.as_dict())},
                model_gradient_bytes=figures.model_gradient_bytes(),
                ddp_bucket_bytes=figures.DDP_BUCKET_BYTES, date="2026-12-07T20:09:00")


def test_a_slow_link_is_shown_in_mb_per_s_not_as_zeros(tmp_path):
    """At 1 Mbit/s every bandwidth printed 0.000 GB/s, and the fit "t = -36,643 µs + bytes
    / 0.000 GB/s"."""
    from rich.console import Console

    from kosmoss.comm import report

    result = _slow_link_result()
    console = Console(record=True, width=250)
    console.print(report.table(result))
    text = console.export_text()
    assert "algbw MB/s" in text and "busbw MB/s" in text and "GB/s" not in text
    (row,) = [line for line in text.splitlines() if "1 MiB" in line]
    assert "0.116" in row  # 1 MiB in 9.04 s
    assert "t = bytes / 0.1" in text and "α fitted below 0" in text and "-36" not in text
    report.write_png(result, tmp_path / "comm.png")
    assert (tmp_path / "comm.png").stat().st_size > 0
