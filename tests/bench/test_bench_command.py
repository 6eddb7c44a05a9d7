"""``kosmoss bench`` as a user runs it: bad input, the list, one small real run."""
import csv
import json

import pytest
from helpers import run_script

from kosmoss.bench import setups
from kosmoss.bench.setups import Machine
from kosmoss.commands import bench
from kosmoss.core.errors import UsageError

NO_GPU = Machine(cuda=False, bf16=False, horovod_missing="Horovod not installed: run "
                 "scripts/install_horovod.sh", scripts_missing=None, free_ram_bytes=2**34)


@pytest.fixture
def cpu_machine(monkeypatch):
    monkeypatch.setattr(setups, "probe", lambda chosen: NO_GPU)


@pytest.fixture
def tiny_home(shared_home, monkeypatch):
    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    return shared_home


def fails(capsys, argv) -> str:
    try:
        code = bench.main(argv)
    except SystemExit as stop:  # argparse's own errors exit from inside the parser
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kosmoss bench: error: ")
    return err


@pytest.mark.parametrize("argv, message", [
    (["--only", "raw-cpu", "nope"], "--only nope: no such set-up; choose from raw-cpu, "),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--repeats", "-1"], "--repeats -1: must be >= 1"),
    (["--gpu-batch-size", "0"], "--gpu-batch-size 0: must be >= 1"),
    (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
])
def test_bad_flags_are_one_line(capsys, argv, message):
    assert message in fails(capsys, argv)


def test_an_out_that_is_a_file_or_someone_elses_folder_is_refused(capsys, tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    assert "is a file" in fails(capsys, ["--quick", "--out", str(mine)])
    assert "not empty and holds no bench.json" in fails(capsys, ["--quick", "--out", str(tmp_path)])
    assert mine.read_text() == "my notes" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_an_earlier_bench_folder_or_a_new_one_is_accepted(tmp_path, monkeypatch):
    (tmp_path / "bench.json").write_text('{"kosmoss_bench": 1}')
    assert bench.output_folder(tmp_path) == tmp_path
    assert bench.output_folder(tmp_path / "new") == tmp_path / "new"
    monkeypatch.setenv("KOSMOSS_HOME", str(tmp_path / "home"))
    default = bench.output_folder(None)
    assert default.parent == tmp_path / "home" / "runs" and default.name.startswith("bench-")
    assert not default.exists()  # created only once every check has passed


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "255"], "--batch-size 255: must divide by 2, the ranks of ddp-cpu-2"),
    (["--batch-size", "4096"], "--batch-size 4096 is larger than the 1,639 training samples "
                               "of dataset tiny: use a smaller batch or a larger --dataset"),
    (["--dataset", "nope"], "--dataset nope: unknown preset 'nope'"),
])
def test_batches_must_fit_the_dataset_and_the_ranks(capsys, tmp_path, tiny_home, cpu_machine,
                                                    argv, message):
    out = tmp_path / "out"
    assert message in fails(capsys, ["--quick", "--out", str(out)] + argv)
    assert not out.exists()


def test_a_batch_the_ranks_cannot_split_is_refused_before_a_preset_is_prepared(
        capsys, tmp_path, monkeypatch, cpu_machine):
    """The full bench's preset is 610 MB to write: a typo in --batch-size must not cost it."""
    monkeypatch.setenv("KOSMOSS_HOME", str(tmp_path / "home"))
    message = fails(capsys, ["--only", "ddp-cpu-2", "--batch-size", "3", "--dataset", "small"])
    assert "--batch-size 3: must divide by 2, the ranks of ddp-cpu-2" in message
    assert not (tmp_path / "home" / "data").exists()


def test_the_gpu_batch_is_not_checked_where_no_gpu_row_runs(tmp_path):
    plan = setups.Plan(dataset=tmp_path, n_samples=2048, n_train=1638, bytes_per_sample=1,
                       batch_size=256, gpu_batch_size=16384, steps=1, repeats=1)
    bench.check_batches(plan, list(setups.MATRIX), gpu_rows_run=False, dataset="tiny")
    with pytest.raises(UsageError, match="--gpu-batch-size 16384 is larger"):
        bench.check_batches(plan, list(setups.MATRIX), gpu_rows_run=True, dataset="tiny")


def test_list_says_why_rows_would_be_skipped(capsys, cpu_machine):
    assert bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "raw-cpu" in out and "horovod-cpu-2" in out and "kosmoss-gpu-bf16" in out
    assert "no CUDA GPU" in out and "Horovod not installed" in out


@pytest.mark.slow
def test_a_small_real_bench(shared_home, tmp_path):
    out = tmp_path / "bench"
    proc = run_script(["-m", "kosmoss", "bench", "--quick", "--only", "raw-cpu", "kosmoss-cpu",
                       "lightning-cpu", "loader-kosmoss", "--steps", "3", "--repeats", "1", "--out", str(out),
                       "--json"], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads((out / "bench.json").read_text())
    rows = {row["id"]: row for row in result["rows"]}
    assert list(rows) == ["raw-cpu", "lightning-cpu", "kosmoss-cpu", "loader-kosmoss"]
    assert all(row["status"] == "measured" for row in rows.values()), proc.stderr[-3000:]
    raw, kosmoss, loader = rows["raw-cpu"], rows["kosmoss-cpu"], rows["loader-kosmoss"]
    assert kosmoss["ratio"] == pytest.approx(kosmoss["samples_per_s"] / raw["samples_per_s"])
    assert raw["ratio"] == 1.0 and loader["ratio"] is None  # the course's loader did not run
    # The limit does kosmoss's work: same split, batches, initial weights, so the same loss.
    assert raw["val_loss"] == pytest.approx(kosmoss["val_loss"], rel=1e-5)
    assert rows["lightning-cpu"]["val_loss"] == raw["val_loss"]  # the raw loop's step, in Lightning
    assert result["targets"]["cpu"]["val_loss"] == pytest.approx(1.05 * kosmoss["val_loss"])
    assert kosmoss["target_reached"] == "1/1"
    assert kosmoss["time_to_target_s"] >= kosmoss["time_to_first_step_s"] > 0
    for row in rows.values():
        assert row["peak_host_mib"] > 0 and row["peak_gpu_mib"] is None
    # The run's own result.json: a final validation at the last step, peaks of its rank.
    run = json.loads((out / "rows" / "kosmoss-cpu-1.json").read_text())
    assert run["global_step"] == 4 and run["val_curve"][-1]["step"] == 4
    assert run["val_loss"] == run["val_curve"][-1]["val_loss"]
    assert len(run["peak_host_rss_mib"]) == 1
    run_dir = out / "runs" / run["run_id"]
    assert (run_dir / "result.json").is_file() and not (run_dir / "checkpoints").exists()
    with (out / "bench.csv").open() as handle:
        assert [r["id"] for r in csv.DictReader(handle)] == list(rows)
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    checks = {c["name"]: c for c in result["checks"]}
    ratio_check = checks["kosmoss on 1 CPU process ÷ raw CPU loop, batch 256-1023"]
    assert ratio_check["context"].startswith("Lightning's loop alone, lightning-cpu: ")
    loader_check = checks["batched loader ÷ the course's per-sample loader"]
    assert loader_check["passed"] is None and "loader-course not selected" in loader_check["note"]
