"""``kosmoss comm`` as a user runs it: bad input, and a real 2-rank gloo run."""
import csv
import json

import pytest

from kosmoss.commands import comm

MIB = 2**20


def fails(capsys, argv) -> str:
    try:
        code = comm.main(argv)
    except SystemExit as stop:  # argparse's own errors exit from inside the parser
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kosmoss comm: error: ")
    return err


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "1"], "--ranks 1: an all-reduce needs at least 2 ranks"),
    (["--sizes", "1M", "0"], "--sizes 0: sizes must be positive"),
    (["--sizes=-4K"], "--sizes -4K: not a size"),
    (["--max-size", "1K"], "--max-size 1 KiB: smaller than every size"),
    (["--ranks", "2", "--nodes", "3"], "--nodes 3: must be >= 1 and divide --ranks 2"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--backend", "nccl", "--device", "cpu"], "--backend nccl: NCCL reduces CUDA tensors only"),
    (["--ranks", "two"], "argument --ranks: invalid int value: 'two'"),
    (["--compute-s=-0.01"], "--compute-s -0.01: give 0 (back to back) up to 10 seconds"),
])
def test_bad_flags_are_one_line(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    assert message in fails(capsys, argv + ["--out", str(out)])
    assert not out.exists()


def test_an_out_folder_of_someone_else_is_refused(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert "not empty and holds no comm.json" in fails(capsys, ["--out", str(tmp_path)])
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_real_two_rank_gloo_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # gloo on CPU, as on a laptop
    out = tmp_path / "comm"
    assert comm.main(["--ranks", "2", "--sizes", "1M", "8M", "32M", "--repeats", "5",
                      "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((out / "comm.json").read_text())
    plan, world = result["plan"], result["groups"]["world"]
    assert plan["backend"] == "gloo" and plan["device"] == "cpu" and world["ranks"] == 2
    rows = world["rows"]
    assert [r["bytes"] for r in rows] == [MIB, 8 * MIB, 32 * MIB]
    times = [r["time_s"] for r in rows]
    # Beyond the latency regime, a larger payload takes longer (8x and 4x the bytes).
    assert times[0] < times[1] < times[2], times
    for row in rows:
        assert row["algbw_Bps"] == pytest.approx(row["bytes"] / row["time_s"])
        assert row["busbw_Bps"] == pytest.approx(row["algbw_Bps"])  # 2(n-1)/n = 1 for n = 2
        assert row["repeats"] == 5 and row["min_time_s"] <= row["time_s"] <= row["max_time_s"]
    assert world["fit"]["beta_s_per_byte"] > 0
    with (out / "comm.csv").open() as handle:
        assert [int(r["bytes"]) for r in csv.DictReader(handle)] == [MIB, 8 * MIB, 32 * MIB]
    assert (out / "comm.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_simulated_nodes_time_the_two_halves_of_a_hierarchical_all_reduce(tmp_path, capsys,
                                                                          monkeypatch):
    from kosmoss.scaling.projection import links_from_comm

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # Sizes 32 times apart: on 2 cores a 32 MiB all-reduce takes ~50 ms more than 1 MiB, so one
    # stall of a loaded host (70 ms seen in CI when the sizes were 1 and 8 MiB, 3 repeats) spread
    # over 5 repeats cannot flip the slope of the mean times.
    assert comm.main(["--ranks", "4", "--nodes", "2", "--sizes", "1M", "32M", "--repeats", "5",
                      "--warmup", "1", "--out", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plan"]["ranks_per_node"] == 2 and result["plan"]["threads_per_rank"] == 1
    groups = result["groups"]
    assert {name: group["ranks"] for name, group in groups.items()} == \
        {"world": 4, "intra": 2, "inter": 2}
    for group in groups.values():
        assert all(row["time_s"] > 0 for row in group["rows"]) and group["fit"] is not None
    # kosmoss project reads each half as its link: intra from the node, inter across nodes,
    # each from the fit of the mean times (what a step pays).
    intra, inter = links_from_comm(result)
    assert intra.bandwidth_Bps == groups["intra"]["fit_mean"]["link_bandwidth_Bps"]
    assert inter.latency_s == groups["inter"]["fit_mean"]["link_latency_s"]
    for group in groups.values():
        assert all(row["min_time_s"] <= row["mean_time_s"] <= row["max_time_s"]
                   for row in group["rows"])


@pytest.mark.slow
def test_all_reduces_after_compute_keep_the_ranks_wait(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "comm"
    assert comm.main(["--ranks", "2", "--sizes", "1M", "8M", "--repeats", "6", "--compute-s",
                      "0.004", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plan"]["compute_s"] == 0.004
    rows = result["groups"]["world"]["rows"]
    for row in rows:  # one all-reduce a repeat: the last rank's time, and the others' wait
        assert row["repeats"] == 6 and 0 < row["min_time_s"] <= row["mean_time_s"]
        assert row["wait_s"] >= 0
        assert row["compute_s"] > 0 and row["compute_alone_s"] > 0  # side by side, alone
    assert rows[0]["time_s"] < rows[1]["time_s"]  # 8x the bytes, after compute too
    with (out / "comm.csv").open() as handle:
        assert all(float(r["wait_s"]) >= 0 for r in csv.DictReader(handle))
