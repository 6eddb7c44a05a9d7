"""The ladder (kosmoss.bench.ladder): its arithmetic of the limit, each rung's losses
against the eager fp32 loop's, and its bad input. The rungs that need CUDA run in the GPU
test at the end (skipped here); the others run on CPU."""
import json
import math
import subprocess
import sys

import pytest
import torch

from kosmoss.bench import ladder, rungs
from kosmoss.bench.baselines import limit_setup
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return prepare(SyntheticSource(1024, seed=3, levels=6),
                   tmp_path_factory.mktemp("ladder") / "six-levels", shard_size=512)


def test_the_cost_of_a_sample_counts_every_layer():
    costs = ladder.sample_costs(4128, (100, 100, 100), 552)
    assert costs["parameters"] == 488_852  # the course model's count
    assert costs["bytes_per_sample"] == 4 * (4128 + 552)
    forward = 2 * (4128 * 100 + 100 * 100 * 2 + 100 * 552)
    assert costs["forward_flop_per_sample"] == forward
    # backward: every weight's gradient (as forward), every input's but the first layer's
    assert costs["flop_per_sample"] == 2 * forward + 2 * (100 * 100 * 2 + 100 * 552)
    # the "6 × parameters" rule of thumb counts the first layer's input gradient too
    assert costs["flop_per_sample"] < 6 * costs["parameters"]


def test_the_limit_is_the_slower_of_memory_and_compute():
    costs = {"bytes_per_sample": 100.0, "flop_per_sample": 1e6}
    memory_bound = ladder.bound(costs, {"memory_bandwidth_bytes_s": 1e9, "peak_bf16_flop_s": 1e15})
    assert memory_bound["bound_by"] == "memory" and memory_bound["limit_samples_per_s"] == 1e7
    compute_bound = ladder.bound(costs, {"memory_bandwidth_bytes_s": 1e12,
                                         "peak_bf16_flop_s": 1e12})
    assert compute_bound["bound_by"] == "bf16 compute"
    assert compute_bound["limit_samples_per_s"] == pytest.approx(1e6)
    no_sheet = ladder.bound(costs, {"memory_bandwidth_bytes_s": 1e9, "peak_bf16_flop_s": None})
    assert no_sheet["bound_by"] == "memory"
    assert ladder.bound(costs, None)["limit_samples_per_s"] is None  # a CPU: no GPU limit


def test_the_ladder_adds_one_change_a_rung():
    names = [r.name for r in ladder.RUNGS]
    assert names == ["host", "resident", "bf16", "fused", "compile", "graphs", "graphs-k8"]
    fields = ("host_data", "bf16", "fused", "compile", "graphs", "steps_per_replay")
    for lower, upper in zip(ladder.RUNGS, ladder.RUNGS[1:]):
        changed = [f for f in fields if getattr(lower, f) != getattr(upper, f)]
        assert len(changed) == 1, (upper.name, changed)
    assert ladder.largest_batch(104_857) == 65_536 and ladder.largest_batch(65_536) == 65_536


@pytest.mark.parametrize("name", ["bf16", "fused"])
def test_a_cpu_rung_trains_as_the_eager_fp32_loop(dataset, name):
    """Same batches, same order: bf16 moves the losses by its rounding only (within the
    stated tolerance), fused Adam by float32 rounding."""
    reference = ladder.run_rung(limit_setup(dataset, 64, torch.device("cpu"), 42),
                                ladder.rung("resident"), 64, 30, torch.device("cpu"))
    found = ladder.run_rung(limit_setup(dataset, 64, torch.device("cpu"), 42),
                            ladder.rung(name), 64, 30, torch.device("cpu"))
    assert found["global_step"] == reference["global_step"] == 31
    assert math.isclose(found["val_loss"], reference["val_loss"],
                        rel_tol=ladder.TRAINED_LOSS_TOLERANCE)
    # the first loss is before any update: bf16 rounding only
    assert math.isclose(found["train_losses"][0], reference["train_losses"][0],
                        rel_tol=ladder.FIRST_LOSS_TOLERANCE)


@pytest.mark.slow
def test_compile_on_cpu_trains_as_eager_and_reports_its_compile_time_apart(dataset):
    eager = ladder.run_rung(limit_setup(dataset, 64, torch.device("cpu"), 42),
                            ladder.rung("resident"), 64, 12, torch.device("cpu"))
    compiled = ladder.run_rung(limit_setup(dataset, 64, torch.device("cpu"), 42),
                               rungs.COMPILE_ALONE, 64, 12, torch.device("cpu"))
    assert math.isclose(compiled["val_loss"], eager["val_loss"], rel_tol=1e-4)
    assert compiled["setup_s"] > eager["setup_s"]  # the compile, untimed
    assert compiled["uses_compile"] and not eager["uses_compile"]


def test_one_rung_at_one_batch_is_written_as_a_bench_row(dataset, tmp_path):
    out = tmp_path / "row.json"
    code = ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs", "resident",
                        "--batch-size", "max", "--steps", "8", "--out", str(out)])
    row = json.loads(out.read_text())
    assert code == 0 and row["rung"] == "resident" and row["batch_size"] == 512  # 819 train
    assert row["samples_per_s"] > 0 and row["val_curve"][0]["val_loss"] == row["val_loss"]
    assert row["limit_samples_per_s"] is None and row["costs"]["bytes_per_sample"] > 0


@pytest.mark.parametrize("argv, flag", [
    (["--rungs", "graphs"], "--rungs graphs"),
    (["--rungs", "warp"], "--rungs warp"),
    (["--steps", "3"], "--steps 3"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--batch-size", "5000"], "--batch-size 5000"),
])
def test_bad_input_is_one_line(dataset, argv, flag):
    done = subprocess.run([sys.executable, "-m", "kosmoss.bench.ladder", "--dataset",
                           str(dataset.path), "--device", "cpu", "--rungs", "resident", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and flag in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_folder_that_is_no_dataset_is_one_line(tmp_path, capsys):
    assert ladder.main(["--dataset", str(tmp_path), "--device", "cpu", "--rungs",
                        "resident"]) == 2
    assert "not a prepared dataset" in capsys.readouterr().err


@pytest.mark.gpu
@needs_gpu
def test_every_rung_on_the_gpu_trains_as_the_eager_fp32_loop(dataset):
    """The whole ladder on a GPU: each rung's first loss within bf16's rounding of the eager
    fp32 loop's and its trained loss within the stated spread; the graphed rungs, which
    replay the compiled fused bf16 step, within float rounding of that step run eagerly."""
    cuda = torch.device("cuda")
    found = {r.name: ladder.run_rung(limit_setup(dataset, 64, cuda, 42), r, 64, 40, cuda)
             for r in ladder.RUNGS}
    reference = found["resident"]
    for name, row in found.items():
        assert math.isclose(row["train_losses"][0], reference["train_losses"][0],
                            rel_tol=ladder.FIRST_LOSS_TOLERANCE), name
        assert math.isclose(row["val_loss"], reference["val_loss"],
                            rel_tol=ladder.TRAINED_LOSS_TOLERANCE), name
    reference = reference["val_loss"]
    assert found["host"]["val_loss"] == pytest.approx(reference, rel=1e-5)
    for graphed in ("graphs", "graphs-k8"):
        assert found[graphed]["global_step"] == found["compile"]["global_step"]
        assert found[graphed]["val_loss"] == pytest.approx(found["compile"]["val_loss"], rel=1e-3)
