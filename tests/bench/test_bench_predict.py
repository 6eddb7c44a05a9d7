"""The bench's predicted column: from the 1-rank row and a kosmoss comm fit, through
kosmoss.scaling.projection, into bench.json, the CSV, the table and the PNG (no process is run)."""
import csv

import pytest
from bench_synthetic import synthetic_rows
from rich.console import Console

from kosmoss.bench import figures, report, runner
from kosmoss.bench.setups import BY_ID, Plan
from kosmoss.scaling import projection
from kosmoss.scaling.allreduce import model_gradient_bytes

ALPHA, BETA = 1e-3, 1e-9  # the fake comm run: t = 1 ms + bytes / 1 GB/s
REAL_COMM = runner._comm


def comm_json(ranks=2, nodes=1):
    fit = {"alpha_s": ALPHA, "beta_s_per_byte": BETA, "ranks": ranks,
           "link_latency_s": ALPHA / 2, "link_bandwidth_Bps": 1 / BETA}
    return {"date": "2026-11-23", "plan": {"ranks_per_node": ranks // nodes, "nodes": nodes,
                                           "backend": "gloo"},
            "groups": {"world": {"ranks": ranks, "rows": [], "fit": fit}}}


@pytest.fixture
def no_measuring(monkeypatch):
    """Timings of the machine replaced by fixed ones: 2 threads worth 2 cores, an
    optimizer step of 1 ms on one thread, a comm run that returns ``comm_json``."""
    monkeypatch.setattr(projection, "thread_speedup", lambda batch, threads, **k: float(threads))
    monkeypatch.setattr(projection, "time_step", lambda *a, **k: (0.004, 0.001))
    monkeypatch.setattr(runner, "_comm", lambda setup, topology, *a: comm_json(*topology[:2]))
    monkeypatch.setattr(projection, "ddp_overhead_s", lambda batch, threads, **k: 0.0)
    monkeypatch.setattr("kosmoss.devices.cpus.available_cores", lambda: 2)


def plan_for(dataset):
    return Plan(dataset=dataset.path, n_samples=dataset.n_samples, n_train=800,
                bytes_per_sample=4, batch_size=256, gpu_batch_size=512, steps=30, repeats=2)


def test_a_multi_rank_row_gets_the_hand_computed_prediction(random_dataset, tmp_path,
                                                            no_measuring):
    setups, rows = synthetic_rows()
    context = runner.predict_rows(setups, rows, plan_for(random_dataset), tmp_path, print)
    ddp = rows["ddp-cpu-2"]
    # The 1-rank row: 256 samples at 37 samples/s on 2 cores. Each of 2 ranks: 128 samples on
    # 1 core (same compute time), its optimizer (1 ms on one thread) twice the reference's
    # 0.5 ms; then the all-reduce of all the gradients in one bucket, exposed.
    step_1 = 256 / 37.0
    size = model_gradient_bytes(random_dataset.n_x, (100, 100, 100), random_dataset.n_y)
    step_2 = (step_1 - 0.0005) * (128 / 256) * 2 + 0.0005 * 2 + ALPHA + BETA * size
    assert ddp["predicted_samples_per_s"] == pytest.approx(256 / step_2, rel=1e-9)
    assert ddp["predicted_over_measured"] == pytest.approx(256 / step_2 / 62.0, rel=1e-9)
    assert ddp["prediction"]["exposed_comm_s"] == pytest.approx(ALPHA + BETA * size)
    assert ddp["prediction_note"] is None
    assert "predicted_samples_per_s" not in rows["nodes-cpu-2x1"]  # it failed: nothing to predict
    assert "predicted_samples_per_s" not in rows["kosmoss-cpu"]  # one rank: nothing to predict
    summary = runner.prediction_summary(context)
    assert summary["thread_speedup"] == {"2 threads, batch 256": 2.0, "1 threads, batch 128": 1.0}
    assert summary["profiles"]["kosmoss-cpu"]["optimizer_s"] == pytest.approx(0.0005)


def test_without_its_one_rank_row_or_with_horovod_a_row_says_why(random_dataset, tmp_path,
                                                                 no_measuring):
    setups, rows = synthetic_rows()
    setups.append(BY_ID["horovod-cpu-2"])
    rows["horovod-cpu-2"] = figures.build_row(BY_ID["horovod-cpu-2"], 256, [
        {"samples_per_s": 50.0, "val_loss": 0.5}])
    rows["kosmoss-cpu"]["status"] = "failed"
    runner.predict_rows(setups, rows, plan_for(random_dataset), tmp_path, print)
    assert rows["ddp-cpu-2"]["predicted_samples_per_s"] is None
    assert "no measured 1-rank row (kosmoss-cpu)" in rows["ddp-cpu-2"]["prediction_note"]
    assert "Horovod" in rows["horovod-cpu-2"]["prediction_note"]


def test_comm_runs_after_the_ranks_compute_and_its_wait_is_the_straggler(
        random_dataset, tmp_path, no_measuring, monkeypatch):
    size = model_gradient_bytes(random_dataset.n_x, (100, 100, 100), random_dataset.n_y)
    asked = []

    def spaced_comm(setup, topology, shape, plan, out_dir, context, echo, compute_s):
        asked.append(compute_s)
        result = comm_json(*topology[:2])
        # The wait: the row nearest the gradients' size; the contention: the rows' median
        # ratio, the same step before each size (a swing in one row does not carry it).
        result["groups"]["world"]["rows"] = [
            {"bytes": size // 8, "wait_s": 0.5, "compute_s": 9.0, "compute_alone_s": 1.0},
            {"bytes": size + 4, "wait_s": 0.002, "compute_s": 0.0125, "compute_alone_s": 0.01},
            {"bytes": size * 4, "wait_s": 0.7, "compute_s": 0.0121, "compute_alone_s": 0.011}]
        return result

    monkeypatch.setattr(runner, "_comm", spaced_comm)
    monkeypatch.setattr(projection, "ddp_overhead_s", lambda batch, threads, **k: 0.0003)
    setups, rows = synthetic_rows()
    context = runner.predict_rows(setups, rows, plan_for(random_dataset), tmp_path, print)
    ddp = rows["ddp-cpu-2"]["prediction"]
    step_1 = 256 / 37.0
    assert asked == [pytest.approx((step_1 - 0.0005) * (128 / 256) * 2 + 0.0005 * 2)]
    # All but the framework's fixed cost (kosmoss-cpu's step − raw-cpu's) slows by 1.25.
    fixed = runner.framework_step_s(rows["kosmoss-cpu"], rows["raw-cpu"])
    assert fixed > 0 and ddp["contention"] == pytest.approx(1.25) and ddp["ddp_s"] == 0.0003
    assert ddp["compute_s"] == pytest.approx(fixed + (asked[0] - fixed) * 1.25 + 0.0003)
    assert ddp["straggler_s"] == 0.002
    assert ddp["step_s"] == pytest.approx(ddp["compute_s"] + 0.002 + ALPHA + BETA * size)
    assert runner.prediction_summary(context)["ddp_overhead_s"] == {"1 threads, batch 128": 0.0003}


def test_a_failed_comm_run_leaves_a_note_not_a_crash(random_dataset, tmp_path, monkeypatch,
                                                     no_measuring):
    def failing_comm(argv, env, timeout, log):
        log.write_text("kosmoss comm: error: boom\n")
        return 2

    monkeypatch.setattr(runner, "_comm", REAL_COMM)  # with a comm command that fails at once
    monkeypatch.setattr(runner, "run_logged", failing_comm)
    setups, rows = synthetic_rows()
    runner.predict_rows(setups, rows, plan_for(random_dataset), tmp_path, print)
    note = rows["ddp-cpu-2"]["prediction_note"]
    assert note.startswith("kosmoss comm failed (2): kosmoss comm: error: boom")
    checks = {c["name"]: c for c in figures.checks(rows, 2048)}
    assert checks["predicted ÷ measured samples/s, ddp-cpu-2"]["note"] == note


def test_row_topology_reads_the_simulated_nodes():
    assert runner.row_topology(BY_ID["ddp-cpu-2"]) == (2, 1, "cpu")
    assert runner.row_topology(BY_ID["nodes-cpu-2x1"]) == (2, 2, "cpu")
    assert runner.row_topology(BY_ID["nodes-gpu-2x1"]) == (2, 2, "cuda")


def predicted_bench(tmp_path):
    setups, rows = synthetic_rows()
    figures.attach_prediction(rows["ddp-cpu-2"], {"samples_per_s": 55.8, "step_s": 4.6})
    facts = {"cpu": {"cores_available": 2}, "gpus": [], "torch": "2.13.0"}
    plan = Plan(dataset=tmp_path / "tiny", n_samples=2048, n_train=1638, bytes_per_sample=1,
                batch_size=256, gpu_batch_size=512, steps=30, repeats=2)
    return runner.assemble(setups, rows, plan, tmp_path, facts, quick=True)


def test_the_predicted_column_is_in_the_json_the_csv_the_table_and_the_png(tmp_path):
    bench = predicted_bench(tmp_path)
    ddp = next(r for r in bench["rows"] if r["id"] == "ddp-cpu-2")
    assert ddp["predicted_samples_per_s"] == 55.8
    assert ddp["predicted_over_measured"] == pytest.approx(0.9)  # 55.8 / 62
    report.write_all(bench, tmp_path)
    with (tmp_path / "bench.csv").open() as handle:
        by_id = {row["id"]: row for row in csv.DictReader(handle)}
    assert float(by_id["ddp-cpu-2"]["predicted_samples_per_s"]) == 55.8
    assert float(by_id["ddp-cpu-2"]["predicted_over_measured"]) == pytest.approx(0.9)
    assert by_id["kosmoss-cpu"]["predicted_samples_per_s"] == ""
    console = Console(record=True, width=250)
    console.print(report.table(bench))
    text = console.export_text()
    assert "pred/meas" in text and " 56 " in text and "0.90" in text
    check = {c["name"]: c for c in bench["checks"]}["predicted ÷ measured samples/s, ddp-cpu-2"]
    assert check["passed"] is True and check["value"] == pytest.approx(0.9)
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_thread_probes_run_only_for_multi_rank_cpu_rows(random_dataset, monkeypatch):
    monkeypatch.setattr("kosmoss.devices.cpus.available_cores", lambda: 2)
    monkeypatch.setattr(projection, "thread_speedup", lambda batch, threads, **k: 0.5)
    plan = plan_for(random_dataset)
    alone = runner.ThreadProbes([BY_ID["raw-cpu"], BY_ID["kosmoss-cpu"]], plan)
    alone.measure()
    assert alone.keys() == [] and alone.found == {}
    probes = runner.ThreadProbes([BY_ID["kosmoss-cpu"], BY_ID["ddp-cpu-2"]], plan)
    probes.measure()
    probes.measure()
    assert probes.found == {"2 threads, batch 256": [0.5, 0.5]}


def test_the_framework_cost_is_the_kosmoss_step_beyond_the_raw_loops():
    from kosmoss.bench.runner import framework_step_s

    kosmoss = {"batch_size": 256, "samples_per_s": 51_200.0}  # 5 ms a step
    raw = {"status": "measured", "samples_per_s": 64_000.0}  # 4 ms a step
    assert framework_step_s(kosmoss, raw) == pytest.approx(0.001)
    assert framework_step_s(kosmoss, {"status": "skipped"}) == 0.0
    assert framework_step_s(kosmoss, {**raw, "samples_per_s": 40_000.0}) == 0.0  # never < 0


def test_the_shared_gpu_split_comes_from_the_anatomy_lines():
    lines = [{"samples_per_s": 1000.0}, {"samples_per_s": 800.0}, {"samples_per_s": 400.0}]
    ratio, exposed = runner.shared_device_split(lines, 16)
    assert ratio == pytest.approx(1.25) and exposed == pytest.approx(16 / 400 - 16 / 800)
    assert runner.shared_device_split(lines[:2] + [{"samples_per_s": 900.0}], 16)[1] == 0.0
    assert runner.shares_one_gpu(BY_ID["nodes-gpu-2x1"])
    assert not runner.shares_one_gpu(BY_ID["nodes-cpu-2x1"])


@pytest.mark.slow
def test_the_anatomy_lines_are_measured_once_per_bench(random_dataset, tmp_path):
    """The same subprocess the bench runs for a shared-GPU row, here on CPU ranks."""
    context, said = {}, []
    args = (BY_ID["nodes-gpu-2x1"], 2, plan_for(random_dataset), 64, tmp_path, context,
            said.append)
    lines = runner._anatomy(*args, device="cpu")
    assert [line["ranks"] for line in lines] == [1, 2, 2]
    assert all(line["samples_per_s"] > 0 for line in lines)
    assert runner._anatomy(*args, device="cpu") is lines and len(said) == 1
    assert "anatomy" in runner.prediction_summary({"model": "", "comm": {}, "profiles": {},
                                                   **context})
