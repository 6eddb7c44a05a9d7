"""The bench's arithmetic on synthetic measurements: medians, ratios, efficiency, target."""
import math

import pytest

from kosmoss.bench import figures
from kosmoss.bench.setups import BY_ID, MATRIX

from bench_synthetic import measured, synthetic_rows


def test_median_ignores_missing_values_and_averages_an_even_count():
    assert figures.median([3.0, None, 1.0, 2.0]) == 2.0
    assert figures.median([4.0, 1.0]) == 2.5
    assert figures.median([None, None]) is None and figures.median([]) is None


def test_ratio_and_scaling_efficiency():
    assert figures.ratio(30.0, 40.0) == pytest.approx(0.75)
    assert figures.ratio(None, 40.0) is None and figures.ratio(30.0, 0.0) is None
    # 2 ranks at 50 samples/s against one rank at 40: 50 / (2 x 40).
    assert figures.scaling_efficiency(50.0, 2, 40.0) == pytest.approx(0.625)
    assert figures.scaling_efficiency(50.0, 2, None) is None


def test_time_to_target_is_the_first_validation_at_or_below_it():
    curve = [{"t_s": 9.0, "val_loss": 0.4}, {"t_s": 5.0, "val_loss": 0.7},
             {"t_s": 7.0, "val_loss": 0.5}]
    assert figures.time_to_target(curve, 0.5) == 7.0
    assert figures.time_to_target(curve, 0.1) is None
    assert figures.time_to_target(curve, None) is None


def test_summarize_takes_medians_of_successful_repeats_and_the_highest_peak():
    summary = figures.summarize([measured(10.0, host=300.0), measured(30.0, host=500.0),
                                 measured(20.0, host=100.0), measured(None, error="boom")])
    assert summary["samples_per_s"] == 20.0 and summary["peak_host_mib"] == 500.0
    assert summary["peak_gpu_mib"] is None and summary["val_loss"] == 0.5


def test_build_row_statuses():
    setup = BY_ID["kosmoss-cpu"]
    assert figures.build_row(setup, 256, [], skipped="no CUDA GPU")["reason"] == "no CUDA GPU"
    failed = figures.build_row(setup, 256, [measured(1.0), measured(None, error="exit code 1: x")])
    assert failed["status"] == "failed" and failed["reason"] == "exit code 1: x"
    row = figures.build_row(setup, 256, [measured(1.0), measured(3.0)])
    assert row["status"] == "measured" and row["samples_per_s"] == 2.0 and row["batch_size"] == 256


def test_complete_fills_ratio_efficiency_and_time_to_target():
    setups, rows = synthetic_rows()
    goals = figures.complete(setups, rows)
    assert goals == {"cpu": {"reference": "kosmoss-cpu", "reference_val_loss": 0.5,
                             "val_loss": pytest.approx(0.525)}}
    assert rows["raw-cpu"]["ratio"] == 1.0 and rows["loader-course"]["ratio"] == 1.0
    # Repeat by repeat: 36/40 and 38/44, their median and spread.
    assert rows["kosmoss-cpu"]["ratio"] == pytest.approx((36 / 40 + 38 / 44) / 2)
    assert rows["kosmoss-cpu"]["ratio_spread"] == pytest.approx([38 / 44, 36 / 40])
    assert rows["ddp-cpu-2"]["scaling_efficiency"] == pytest.approx(
        (60 / (2 * 36) + 64 / (2 * 38)) / 2)
    assert rows["kosmoss-cpu"]["scaling_efficiency"] is None
    assert rows["loader-kosmoss"]["ratio"] == pytest.approx(125.0)
    assert rows["kosmoss-cpu"]["time_to_target_s"] == 6.0
    # One repeat reached the target at 11 s, the other never did: the median is "never".
    assert rows["ddp-cpu-2"]["target_reached"] == "1/2"
    assert rows["ddp-cpu-2"]["time_to_target_s"] is None
    assert rows["nodes-cpu-2x1"]["status"] == "failed" and "ratio" not in rows["nodes-cpu-2x1"]
    assert rows["raw-gpu"]["status"] == "skipped"


def test_no_target_without_the_reference_row():
    setups, rows = synthetic_rows()
    del rows["kosmoss-cpu"]
    assert figures.complete(setups, rows) == {}
    assert rows["ddp-cpu-2"]["time_to_target_s"] is None
    assert rows["ddp-cpu-2"]["target_reached"] is None
    assert rows["ddp-cpu-2"]["scaling_efficiency"] is None


def test_checks_judge_what_was_measured_and_say_why_not_the_rest():
    setups, rows = synthetic_rows()
    figures.complete(setups, rows)
    found = {c["name"]: c for c in figures.checks(rows, n_samples=2048)}
    cpu = found["kosmoss on 1 CPU process ÷ raw CPU loop, batch 256-1023"]
    assert cpu["value"] == pytest.approx((36 / 40 + 38 / 44) / 2) and cpu["passed"] is False
    big = found["kosmoss on 1 CPU process ÷ raw CPU loop, batch >= 1024"]
    assert big["passed"] is None and big["note"] == "judged at batch 1024 or more only"
    assert found["batched loader ÷ the course's per-sample loader"]["passed"] is True
    ddp = found["2-rank CPU DDP val_loss ÷ 1-rank val_loss, equal global batch"]
    assert ddp["value"] == pytest.approx(1.02) and ddp["passed"] is True
    gpu = found["kosmoss on 1 GPU ÷ raw GPU loop (GPU-resident data)"]
    assert gpu["passed"] is None
    assert gpu["note"] == "not measured: kosmoss-gpu not selected, raw-gpu skipped"


def test_the_bf16_figure_is_judged_on_the_large_preset_only():
    rows = {"kosmoss-gpu-bf16": {"status": "measured", "samples_per_s": 2.5e6}}
    name = "kosmoss bf16 on 1 GPU, large preset: samples/s"
    small = {c["name"]: c for c in figures.checks(rows, n_samples=32_768)}[name]
    assert small["passed"] is None and "large preset only" in small["note"]
    large = {c["name"]: c for c in figures.checks(rows, n_samples=1_048_576)}[name]
    assert large["passed"] is True and large["value"] == 2.5e6


def test_every_reference_is_a_row_on_the_same_device():
    for setup in MATRIX:
        for other in (setup.versus, setup.single):
            if other:
                assert BY_ID[other].device == setup.device, setup.id
        if setup.single:
            assert BY_ID[setup.single].ranks == 1 and setup.ranks > 1
    assert all(figures.TARGET_REFERENCE[d] in BY_ID for d in ("cpu", "gpu"))
    assert math.isclose(figures.TARGET_MARGIN, 1.05)


def test_paired_ratios_cancel_a_drift_that_medians_of_rows_keep():
    """The machine's speed drifts from repeat to repeat (100, 40, 70) and one kosmoss repeat
    met a slow moment: paired, 0.9 stands; medians of each row would say 50 / 70."""
    raw = {"repeats": [measured(100.0), measured(40.0), measured(70.0)]}
    kosmoss = {"repeats": [measured(90.0), measured(36.0), measured(50.0)]}
    paired = figures.paired_ratios(kosmoss, raw)
    assert paired == pytest.approx([0.9, 0.9, 50 / 70])
    assert figures.median_and_spread(paired) == (pytest.approx(0.9), pytest.approx([50 / 70, 0.9]))
    assert figures.ratio(figures.summarize(kosmoss["repeats"])["samples_per_s"],
                         figures.summarize(raw["repeats"])["samples_per_s"]) == pytest.approx(50 / 70)
    kosmoss["repeats"][2] = measured(None, error="exit code 1")  # a failed repeat pairs with none
    assert figures.paired_ratios(kosmoss, raw, scale=2) == pytest.approx([0.45, 0.45])
    assert figures.median_and_spread([]) == (None, None)


def test_the_raw_ratio_goal_follows_the_batch():
    setups, rows = synthetic_rows()
    for row in rows.values():
        row["batch_size"] = 1024
    figures.complete(setups, rows)
    found = {c["name"]: c for c in figures.checks(rows, n_samples=2048)}
    assert found["kosmoss on 1 CPU process ÷ raw CPU loop, batch >= 1024"]["passed"] is False
    assert found["kosmoss on 1 CPU process ÷ raw CPU loop, batch 256-1023"]["note"] == \
        "judged at batch 256 to 1023 only"
