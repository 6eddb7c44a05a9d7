"""The benchmark runs end to end on a tiny dataset (its figures are not asserted)."""
import json

import pytest

from conftest import run_script


@pytest.mark.slow
def test_benchmark_smoke_run(shared_home, tmp_path):
    out = tmp_path / "bench.json"
    proc = run_script(["benchmarks/throughput.py", "--dataset", "tiny", "--steps", "5",
                       "--warmup", "2", "--repeats", "1", "--json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    for key in ("raw_loop_samples_per_s", "kosmoss_samples_per_s", "training_ratio",
                "loader_course_samples_per_s", "loader_kosmoss_samples_per_s", "loader_ratio"):
        assert figures[key] > 0, key
    assert figures["training_ratio"] == pytest.approx(
        figures["kosmoss_samples_per_s"] / figures["raw_loop_samples_per_s"])
    assert "kosmoss: Trainer + FlattenedDataModule" in proc.stdout
