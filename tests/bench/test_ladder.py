"""The ladder (kosmoss.bench.ladder): its arithmetic of the limit, each rung's losses
against the eager fp32 loop's, and its bad input. The rungs that need CUDA run in the GPU
test at the end (skipped here); the others run on CPU."""
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from kosmoss.bench import ladder, rungs
from kosmoss.bench.baselines import limit_setup
from kosmoss.core.errors import UsageError
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


def test_each_rung_is_held_to_the_peak_of_its_own_arithmetic():
    """fp32 matmuls run on CUDA cores: the resident rung's limit on an H100 is its fp32
    peak, far below the memory bound that limits the bf16 rungs; bf16-store reads half the
    input bytes, so its own memory bound is higher than the data-as-prepared limit."""
    limits = {"device": "NVIDIA H100 80GB HBM3", "memory_bandwidth_bytes_s": 3.35e12,
              "peak_bf16_flop_s": 989.4e12}  # as recorded on 2026-11-26: bf16's peak alone
    costs = ladder.sample_costs(4128, (100, 100, 100), 552)
    stored = ladder.sample_costs(4128, (100, 100, 100), 552, input_bytes=2)
    assert stored["bytes_per_sample"] == 2 * 4128 + 4 * 552
    own = {r.name: ladder.rung_bound(r, costs, stored, limits) for r in ladder.RUNGS}
    assert own["resident"]["bound_by"] == "fp32 compute"
    assert own["resident"]["limit_samples_per_s"] == pytest.approx(66.9e12 / 2_100_400, rel=1e-3)
    assert own["graphs-k8"]["bound_by"] == "memory"
    assert own["graphs-k8"]["limit_samples_per_s"] == pytest.approx(3.35e12 / 18_720)
    assert own["bf16-store"]["limit_samples_per_s"] == pytest.approx(3.35e12 / 10_464)
    tf32 = ladder.rung_bound(rungs.TF32_ALONE, costs, stored, limits)
    assert tf32["bound_by"] == "memory" and own["resident"]["limit_samples_per_s"] < \
        tf32["limit_samples_per_s"]


@pytest.mark.parametrize("name, chip", [("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
                                        ("NVIDIA H100 PCIe", "H100 PCIe"),
                                        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
                                        ("NVIDIA L4", "L4")])
def test_the_datasheet_peaks_are_lightnings_where_it_has_the_chip(monkeypatch, name, chip):
    from lightning_fabric.utilities.throughput import get_available_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    sheet = ladder.datasheet(name)
    assert sheet is ladder.DATASHEETS[chip]
    cuda = torch.device("cuda")
    assert get_available_flops(cuda, torch.bfloat16) == pytest.approx(sheet.bf16, rel=0.01)
    assert get_available_flops(cuda, "tfloat32") == pytest.approx(sheet.tf32, rel=0.01)


def test_a_rung_leaves_torchs_matmul_precision_as_it_found_it(dataset):
    torch.set_float32_matmul_precision("medium")
    try:
        ladder.run_rung(limit_setup(dataset, 64, torch.device("cpu"), 42),
                        ladder.rung("resident"), 64, 8, torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")


def test_inputs_stored_in_bf16_train_exactly_as_autocast_casting_them(dataset):
    """bf16-store's change, on the CPU: the same losses to the last bit as the rung that
    normalises and casts every batch (autocast rounds the same float32 values)."""
    cpu = torch.device("cpu")
    casting = ladder.run_rung(limit_setup(dataset, 64, cpu, 42), ladder.rung("bf16"), 64, 20, cpu)
    stored_rung = dataclasses.replace(ladder.rung("bf16"), name="bf16-store-cpu", bf16_store=True)
    stored = ladder.run_rung(limit_setup(dataset, 64, cpu, 42), stored_rung, 64, 20, cpu)
    assert stored["train_losses"] == casting["train_losses"]
    assert stored["val_loss"] == casting["val_loss"]
    with pytest.raises(UsageError, match="bf16_store"):
        ladder.run_rung(limit_setup(dataset, 64, cpu, 42), dataclasses.replace(
            stored_rung, bf16=False), 64, 8, cpu)


def test_the_ladder_adds_one_change_a_rung():
    names = [r.name for r in ladder.RUNGS]
    assert names == ["host", "resident", "bf16", "fused", "compile", "graphs", "graphs-k8",
                     "bf16-store"]
    assert rungs.TOP is ladder.RUNGS[-1]
    fields = ("host_data", "bf16", "tf32", "fused", "compile", "graphs", "steps_per_replay",
              "bf16_store")
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


BAD_INPUT = [
    (["--rungs", "graphs"], "--rungs graphs"),
    (["--rungs", "tf32"], "--rungs tf32"),
    (["--also", "tf32"], "--also tf32"),
    (["--also", "warp"], "--also warp"),
    (["--rungs", "warp"], "--rungs warp"),
    (["--steps", "3"], "--steps 3"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--batch-size", "5000"], "--batch-size 5000"),
]


@pytest.mark.parametrize("argv, flag", BAD_INPUT)
def test_bad_input_is_one_line(dataset, argv, flag, capsys):
    """In this process, through the command's own handler (run_command)."""
    code = ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs", "resident",
                        *argv])
    stderr = capsys.readouterr().err
    assert code == 2 and flag in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_bad_input_is_one_line_from_the_command_line(dataset):
    """As a user meets it: one line on stderr, exit 2 (one case: the others run in-process)."""
    argv, flag = BAD_INPUT[0]
    done = subprocess.run([sys.executable, "-m", "kosmoss.bench.ladder", "--dataset",
                           str(dataset.path), "--device", "cpu", "--rungs", "resident", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and flag in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_off_the_ladder_rungs_come_after_it_and_say_so(dataset, tmp_path):
    out = tmp_path / "ladder.json"
    assert ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs",
                        "resident,bf16", "--batch-size", "64", "128", "--also", "fused",
                        "--steps", "8", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rung"], r["batch_size"], r["off_ladder"]) for r in rows] == [
        ("resident", 64, False), ("bf16", 64, False), ("bf16", 128, False),
        ("fused", 64, True)]


@pytest.mark.parametrize("out, said", [
    ("{tmp}", "is a directory"),
    ("/dev/null", "is not a regular file"),
    ("{tmp}/fifo", "is not a regular file"),
    ("{tmp}/mine.txt", "is not a ladder's JSON"),
    ("{tmp}/nowhere/ladder.json", "does not exist or cannot be written"),
])
def test_a_bad_out_is_one_line_before_anything_runs(dataset, tmp_path, capsys, out, said):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "mine.txt").write_text("the user's notes")
    path = out.format(tmp=tmp_path)
    started = time.monotonic()
    assert ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs",
                        "resident", "--batch-size", "64", "--steps", "8", "--out", path]) == 2
    err = capsys.readouterr().err
    assert f"--out {path}" in err and said in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "mine.txt").read_text() == "the user's notes"
    assert time.monotonic() - started < 5  # refused before a rung ran


def test_a_full_disk_at_the_end_is_one_line_and_the_rows_were_printed(dataset, tmp_path,
                                                                       capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ladder, "atomic_write_json", full)
    assert ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs",
                        "resident", "--batch-size", "64", "--steps", "8", "--out",
                        str(tmp_path / "ladder.json")]) == 2
    printed = capsys.readouterr()
    assert "No space left on device" in printed.err and "resident" in printed.out


def test_an_earlier_ladders_json_is_replaced(dataset, tmp_path):
    out = tmp_path / "ladder.json"
    out.write_text(json.dumps({"rows": []}))
    assert ladder.main(["--dataset", str(dataset.path), "--device", "cpu", "--rungs",
                        "resident", "--batch-size", "64", "--steps", "8", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rung"] == "resident"


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
             for r in ladder.RUNGS + (rungs.TF32_ALONE,)}
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
    # the stored inputs are the values autocast would cast: the rung below's path
    assert found["bf16-store"]["val_loss"] == pytest.approx(found["graphs-k8"]["val_loss"],
                                                            rel=1e-3)
    assert torch.get_float32_matmul_precision() == "highest"  # tf32 put it back
