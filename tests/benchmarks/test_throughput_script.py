"""The benchmark runs end to end on a tiny dataset (its figures are not asserted)."""
import json

import pytest

from helpers import run_script


@pytest.mark.slow
def test_benchmark_smoke_run(shared_home, tmp_path):
    out = tmp_path / "bench.json"
    proc = run_script(["benchmarks/throughput.py", "--dataset", "tiny", "--batch-size", "64",
                       "128", "--samples", "640", "--warmup", "2", "--repeats", "1",
                       "--json", str(out)], shared_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [t["batch_size"] for t in figures["training"]] == [64, 128]
    assert [t["steps"] for t in figures["training"]] == [10, 10]
    for t in figures["training"]:
        assert t["raw_loop_samples_per_s"] > 0 and t["kosmoss_samples_per_s"] > 0
        assert t["training_ratio"] == pytest.approx(
            t["kosmoss_samples_per_s"] / t["raw_loop_samples_per_s"])
    assert figures["loader_ratio"] == pytest.approx(
        figures["loader_kosmoss_samples_per_s"] / figures["loader_course_samples_per_s"])
    assert "kosmoss Trainer, memmap shards" in proc.stdout
