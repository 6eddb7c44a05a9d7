"""bench.json, bench.csv, bench.png and the table, from a synthetic bench."""
import csv
import json

from rich.console import Console

from kosmoss.bench import figures, report
from kosmoss.bench.runner import assemble
from kosmoss.bench.setups import Plan

from bench_synthetic import synthetic_rows


def synthetic_bench(tmp_path):
    setups, rows = synthetic_rows()
    plan = Plan(dataset=tmp_path / "tiny", n_samples=2048, n_train=1638, bytes_per_sample=18720,
                batch_size=256, gpu_batch_size=512, steps=30, repeats=2)
    facts = {"cpu": {"cores_available": 2}, "gpus": [], "torch": "2.13.0"}
    return assemble(setups, rows, plan, tmp_path, facts, quick=True)


def test_the_three_files_are_written_and_parse(tmp_path):
    bench = synthetic_bench(tmp_path)
    written = report.write_all(bench, tmp_path)
    assert [p.name for p in written] == ["bench.json", "bench.csv", "bench.png"]
    assert json.loads((tmp_path / "bench.json").read_text()) == bench
    with (tmp_path / "bench.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert tuple(table[0]) == report.CSV_COLUMNS
    by_id = {row["id"]: row for row in table}
    assert by_id["raw-gpu"]["status"] == "skipped" and by_id["raw-gpu"]["reason"] == "no CUDA GPU"
    assert float(by_id["ddp-cpu-2"]["scaling_efficiency"]) == bench["rows"][2]["scaling_efficiency"]
    assert by_id["nodes-cpu-2x1"]["status"] == "failed"
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))  # written through temporary files, none left


def test_bench_json_says_what_ran_where(tmp_path):
    bench = synthetic_bench(tmp_path)
    assert bench["plan"]["steps"] == 30 and bench["plan"]["warmup_steps"] == 1
    assert bench["targets"]["cpu"]["reference"] == "kosmoss-cpu"
    assert str(figures.TARGET_MARGIN) in bench["target_definition"]
    assert [r["id"] for r in bench["rows"]][:2] == ["raw-cpu", "kosmoss-cpu"]
    assert len(bench["checks"]) == len(figures.CHECKS) and bench["quick"] is True
    assert bench["machine"]["torch"] == "2.13.0" and bench["command"]


def test_the_table_shows_figures_reasons_and_checks(tmp_path):
    console = Console(record=True, width=200)
    console.print(report.table(synthetic_bench(tmp_path)))
    text = console.export_text()
    assert "ddp-cpu-2" in text and "0.84" in text  # 62 / (2 x 37)
    assert "raw-gpu" in text and "no CUDA GPU" in text and "exit code 1" in text
    assert "not reached" in text and "reached" in text and "n/a" in text
    assert "0.525 (1.05 × kosmoss-cpu)" in text
