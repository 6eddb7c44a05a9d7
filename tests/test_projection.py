"""The cost model of ``kosmoss project``: hand-computed cases, and bad input."""
import json
from dataclasses import replace

import pytest
from helpers import one_device_run

from kosmoss.commands import project as project_command
from kosmoss.core.errors import UsageError
from kosmoss.scaling import projection
from kosmoss.scaling.projection import Cluster, Link, ModelShape, StepProfile

MB = 1e6
LINK = Link("test", latency_s=10e-6, bandwidth_Bps=1e9, source="test")
SLOW = Link("slow", latency_s=50e-6, bandwidth_Bps=0.25e9, source="test")


def test_ring_and_hierarchical_allreduce_times():
    # 4 ranks: 6 hops of 10 us, and 2*3/4 of 2 MB at 1 GB/s.
    assert projection.ring_allreduce_s(2 * MB, 4, LINK) == pytest.approx(60e-6 + 3e-3)
    assert projection.ring_allreduce_s(2 * MB, 1, LINK) == 0.0
    # 4 per node x 2 nodes, 2 NICs: the node's ring, then 2 hops of 50 us and 1 x 2 MB at 0.5 GB/s.
    hierarchical = projection.hierarchical_allreduce_s(2 * MB, 4, 2, LINK, SLOW, nics=2)
    assert hierarchical == pytest.approx(60e-6 + 3e-3 + 100e-6 + 4e-3)
    assert projection.hierarchical_allreduce_s(2 * MB, 4, 1, LINK, SLOW) == \
        projection.ring_allreduce_s(2 * MB, 4, LINK)


def test_the_mlp_shape_follows_ddp_buckets_and_flops():
    shape = projection.mlp_shape()
    assert shape.gradient_bytes == 4 * 488_852
    # Steady-state buckets: the first (1 MiB cap) fills only with the first layer's weight,
    # ready last: one bucket, ready when backward ends.
    assert shape.buckets == ((4 * 488_852, 1.0),)
    forward = 4128 * 100 + 2 * 100 * 100 + 100 * 552  # 3 hidden layers: 2 of them 100x100
    backward = 4128 * 100 + 2 * (2 * 100 * 100 + 100 * 552)  # no input gradient for layer 1
    assert shape.backward_share == pytest.approx(backward / (forward + backward))
    small = projection.mlp_shape(bucket_bytes=2**18, first_bucket_bytes=2**18)
    assert len(small.buckets) > 1 and sum(b for b, _ in small.buckets) == shape.gradient_bytes
    ready = [r for _, r in small.buckets]
    assert ready == sorted(ready) and ready[-1] == 1.0


def test_predict_reproduces_a_hand_computed_case():
    profile = StepProfile(batch=1024, forward_backward_s=0.100, optimizer_s=0.010, share=1.0,
                          device="cuda", source="test")
    shape = ModelShape(gradient_bytes=2_000_000, buckets=((2_000_000, 1.0),), backward_share=0.5)
    cluster = Cluster(per_node=2, nodes=1, intra=LINK, inter=SLOW)
    row = projection.predict(profile, shape, cluster, global_batch=1024)
    comm = 2 * 10e-6 + 2_000_000 / 1e9  # 2 ranks: 2 hops, 2*1/2 of the payload
    step = 0.100 * 512 / 1024 + 0.010 + comm  # the one bucket is ready when backward ends
    assert row["compute_s"] == pytest.approx(0.060)
    assert row["exposed_comm_s"] == pytest.approx(comm) and row["step_s"] == pytest.approx(step)
    assert row["samples_per_s"] == pytest.approx(1024 / step)
    assert row["efficiency"] == pytest.approx((1024 / step) / (2 * 1024 / 0.110))
    assert row["comm_share"] == pytest.approx(comm / step)


def test_a_measured_wait_replaces_the_modelled_straggler():
    profile = StepProfile(batch=1024, forward_backward_s=0.100, optimizer_s=0.010, share=1.0,
                          device="cpu", source="test", step_cv=0.1)
    shape = ModelShape(gradient_bytes=2_000_000, buckets=((2_000_000, 1.0),), backward_share=0.5)
    modelled = Cluster(per_node=2, nodes=1, intra=LINK, inter=SLOW, overlap=False)
    measured = replace(modelled, wait_s=0.004)
    row = projection.predict(profile, shape, modelled, global_batch=1024)
    assert row["straggler_s"] == pytest.approx(0.1 * 0.060 * 0.5642, rel=1e-3)  # E[max of 2]
    row = projection.predict(profile, shape, measured, global_batch=1024)
    comm = 2 * 10e-6 + 2_000_000 / 1e9
    assert row["straggler_s"] == 0.004
    assert row["step_s"] == pytest.approx(0.060 + 0.004 + comm)
    # Ranks slowing each other by 10 %, and DDP's 1 ms: all but the fixed cost scales.
    profile = replace(profile, fixed_s=0.020)
    row = projection.predict(profile, shape, replace(measured, contention=1.1, ddp_s=0.001),
                             global_batch=1024)
    compute = 0.020 + 0.080 * 512 / 1024 + 0.010
    assert row["compute_s"] == pytest.approx(0.020 + (compute - 0.020) * 1.1 + 0.001)


def test_overlap_hides_all_but_the_last_bucket():
    profile = StepProfile(1000, 0.010, 0.0, 1.0, "cuda", "test")
    shape = ModelShape(2_000_000, ((1_000_000, 0.5), (1_000_000, 1.0)), backward_share=0.6)
    cluster = Cluster(per_node=2, nodes=1, intra=Link("x", 0.0, 1e9, "test"), inter=SLOW)
    # 2 ranks x 500 samples: compute 5 ms, backward 3 ms; each bucket 1 ms of all-reduce.
    # Bucket 1 ready at 1.5 ms, done at 2.5; bucket 2 ready at 3 ms, done at 4: 1 ms exposed.
    total, exposed = projection.exposed_comm_s(shape, cluster, backward_s=0.003)
    assert total == pytest.approx(0.002) and exposed == pytest.approx(0.001)
    row = projection.predict(profile, shape, cluster, 1000)
    assert row["step_s"] == pytest.approx(0.005 + 0.001)
    no_overlap = projection.predict(profile, shape, Cluster(2, 1, cluster.intra, SLOW,
                                                            overlap=False), 1000)
    assert no_overlap["step_s"] == pytest.approx(0.005 + 0.002)


def test_ranks_sharing_cores_do_not_halve_the_step():
    # The 1-rank step ran on 2 cores; 2 ranks on those 2 cores get 1 core each: half the
    # batch at half the speed, and each rank's optimizer step twice as slow.
    profile = StepProfile(256, 0.008, 0.001, share=2.0, device="cpu", source="test")
    shape = ModelShape(1000, ((1000, 1.0),), 0.5)
    cluster = Cluster(2, 1, Link("x", 0.0, 1e12, "t"), SLOW, share=1.0, overlap=False,
                      single_share=2.0)
    row = projection.predict(profile, shape, cluster, 256)
    assert row["compute_s"] == pytest.approx(0.008 + 2 * 0.001)
    assert row["speedup"] == pytest.approx(0.009 / row["step_s"])


def test_sensitivity_names_the_bottleneck():
    profile = StepProfile(1024, 0.001, 0.0, 1.0, "cuda", "test")
    shape = ModelShape(100_000_000, ((100_000_000, 1.0),), 0.5)
    cluster = Cluster(8, 4, projection.PRESETS["nvlink4"], projection.PRESETS["25gbe"])
    changes = projection.sensitivity(profile, shape, cluster, 1024)
    assert next(iter(changes)) == "inter bandwidth" and changes["inter bandwidth"] > 0.3
    rows = projection.grid(profile, shape, cluster, [1, 8], [1, 4], 1024)
    assert [(r["devices_per_node"], r["nodes"]) for r in rows] == [(1, 1), (1, 4), (8, 1), (8, 4)]
    found = projection.verdict(rows)
    assert found["peak"] == "8x1" and found["break_even"] == "1x4"


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(UsageError, match="--inter ib-xdr: no such link preset; choose from "
                                         "nvlink3, nvlink4, pcie4, pcie5, ib-hdr, ib-ndr"):
        projection.preset("ib-xdr", "--inter")


def test_references_from_a_run_or_a_bench(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(UsageError, match="no result.json or bench.json there"):
        projection.read_reference(run)
    (run / "result.json").write_text(json.dumps({"world_size": 1, "per_device_batch_size": 256}))
    with pytest.raises(UsageError, match="no train_samples_per_s; a projection needs a run"):
        projection.read_reference(run)
    (run / "result.json").write_text(json.dumps(
        {"world_size": 2, "per_device_batch_size": 128, "train_samples_per_s": 900.0}))
    with pytest.raises(UsageError, match="a run of 2 ranks"):
        projection.read_reference(run)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"kosmoss_bench": 1, "rows": [
        {"id": "kosmoss-cpu", "status": "measured", "ranks": 1, "samples_per_s": 2000.0,
         "batch_size": 256, "device": "cpu"}]}))
    assert projection.read_reference(bench)["samples_per_s"] == 2000.0
    with pytest.raises(UsageError, match="--row ddp-cpu-2: not a measured 1-rank row .* choose "
                                         "from kosmoss-cpu"):
        projection.read_reference(bench, "ddp-cpu-2")


@pytest.fixture
def fixed_timings(monkeypatch):
    """A step of 10 ms forward+backward and 1 ms optimizer, whatever the machine's load."""
    monkeypatch.setattr(projection, "time_step", lambda batch, *a, **k: (0.010 * batch / 1024,
                                                                          0.001))


def test_project_reproduces_a_hand_computed_case(tmp_path, capsys, fixed_timings):
    run = one_device_run(tmp_path / "run", 1024)  # 1024 samples in 11 ms
    code = project_command.main(["--from", str(run), "--intra", "pcie4", "--inter", "ib-hdr",
                                 "--devices", "1", "4", "--nodes", "1", "2", "--json",
                                 "--out", str(tmp_path / "out")])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp_path / "out" / "project.json").read_text())
    row = {(r["devices_per_node"], r["nodes"]): r for r in result["rows"]}[(4, 2)]
    size = 4 * 488_852
    pcie, ib = projection.PRESETS["pcie4"], projection.PRESETS["ib-hdr"]
    comm = 6 * pcie.latency_s + 1.5 * size / pcie.bandwidth_Bps + 2 * ib.latency_s + \
        size / ib.bandwidth_Bps
    step = 0.010 * 128 / 1024 + 0.001 + comm  # one bucket, ready when backward ends
    assert row["step_s"] == pytest.approx(step, rel=1e-9)
    assert row["samples_per_s"] == pytest.approx(1024 / step, rel=1e-9)
    assert row["efficiency"] == pytest.approx(1024 / step / (8 * 1024 / 0.011), rel=1e-9)
    assert (tmp_path / "out" / "project.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "out" / "project.csv").read_text().count("\n") == 5


def project_fails(capsys, argv) -> str:
    try:
        code = project_command.main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kosmoss project: error: ")
    return err


def test_bad_input_is_one_line(tmp_path, capsys):
    assert "--intra nvlink9: no such link preset; choose from nvlink3" in \
        project_fails(capsys, ["--intra", "nvlink9"])
    assert "--devices 0: must be >= 1" in project_fails(capsys, ["--devices", "0", "2"])
    assert f"--from {tmp_path}: no result.json or bench.json" in \
        project_fails(capsys, ["--from", str(tmp_path)])
    (tmp_path / "result.json").write_text(json.dumps({"world_size": 1}))
    assert "no train_samples_per_s, per_device_batch_size" in \
        project_fails(capsys, ["--from", str(tmp_path)])
    assert f"--comm {tmp_path / 'result.json'}: not a kosmoss comm JSON" in \
        project_fails(capsys, ["--comm", str(tmp_path / "result.json")])


def test_expected_max_of_normals_matches_the_closed_form_and_a_sample():
    import math

    import numpy as np

    assert projection.expected_max_of_normals(1) == 0.0
    assert projection.expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)
    draws = np.random.default_rng(0).standard_normal((200_000, 8)).max(axis=1).mean()
    assert projection.expected_max_of_normals(8) == pytest.approx(draws, abs=0.01)


def test_jittering_ranks_wait_for_the_slowest_at_every_step():
    """The hand-computed case above, with steps that jitter by 10 %: each of 4 ranks waits
    E[max of 4 draws] = 1.0294 standard deviations of its compute."""
    profile = StepProfile(batch=1024, forward_backward_s=0.100, optimizer_s=0.010, share=1.0,
                          device="cuda", source="test", step_cv=0.1)
    shape = ModelShape(gradient_bytes=2_000_000, buckets=((2_000_000, 1.0),), backward_share=0.5)
    steady = replace(profile, step_cv=0.0)
    cluster = Cluster(per_node=4, nodes=1, intra=LINK, inter=SLOW)
    row = projection.predict(profile, shape, cluster, global_batch=1024)
    compute = 0.100 * 256 / 1024 + 0.010
    assert row["straggler_s"] == pytest.approx(0.1 * compute * 1.0294, rel=1e-3)
    assert row["step_s"] == pytest.approx(
        projection.predict(steady, shape, cluster, 1024)["step_s"] + row["straggler_s"])
    one = projection.predict(profile, shape, replace(cluster, per_node=1), 1024)
    assert one["straggler_s"] == 0.0  # nobody to wait for


def test_ddp_overhead_is_timed_on_a_group_of_its_own_and_leaves_none():
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    cost = projection.ddp_overhead_s(16, threads=1, rounds=1, steps=3, hidden=(8,), n_x=32, n_y=4)
    assert isinstance(cost, float) and cost >= 0
    assert not dist.is_initialized() and torch.get_num_threads() == threads


def test_ranks_sharing_a_gpu_use_the_measured_split_of_the_raw_loop():
    """ddp_anatomy's lines replace the batch/share scaling, the contention and the alpha-beta
    exposure: compute = fixed + (the 1-rank step - fixed) x ratio; + the measured all-reduce."""
    profile = StepProfile(batch=16384, forward_backward_s=0.0030, optimizer_s=0.0004, share=1.0,
                          device="cuda", source="test", fixed_s=0.0010, step_cv=0.2)
    shape = ModelShape(gradient_bytes=2_000_000, buckets=((2_000_000, 1.0),), backward_share=0.5)
    cluster = Cluster(per_node=1, nodes=2, intra=LINK, inter=SLOW, share=0.5, overlap=True,
                      contention=1.5, wait_s=0.003, measured_compute_ratio=1.2,
                      measured_exposed_s=0.0025)
    row = projection.predict(profile, shape, cluster, global_batch=16384)
    compute = 0.0010 + (0.0034 - 0.0010) * 1.2
    assert row["compute_s"] == pytest.approx(compute)
    assert row["exposed_comm_s"] == 0.0025 and row["straggler_s"] == 0.0  # the wait is in it
    assert row["comm_s"] == pytest.approx(2 * 50e-6 + 2_000_000 / 0.25e9)  # alpha-beta, for show
    assert row["step_s"] == pytest.approx(compute + 0.0025)
    assert row["measured_compute_ratio"] == 1.2
    alone = projection.predict(profile, shape, replace(cluster, per_node=1, nodes=1, share=1.0),
                               global_batch=16384)
    assert alone["compute_s"] == pytest.approx(0.0034)  # one rank: nothing shared


def test_worlds_beyond_the_global_batch_are_left_out_and_said(tmp_path, capsys, fixed_timings):
    run = one_device_run(tmp_path / "run", 64)
    argv = ["--from", str(run), "--intra", "pcie4", "--inter", "ib-hdr", "--json"]
    assert project_command.main([*argv, "--devices", "1", "8", "--nodes", "1", "4", "16"]) == 0
    result = json.loads(capsys.readouterr().out)
    worlds = {(r["devices_per_node"], r["nodes"]) for r in result["rows"]}
    assert worlds == {(1, 1), (8, 1), (1, 4), (8, 4), (1, 16)} and result["left_out"] == ["8x16"]
    assert "left out: 8x16 (more devices than the 64 samples of the global batch)." in \
        project_command.summary_lines(result)
    # Nothing above one device left: bad input, said before anything is measured.
    assert "every world above one device has more devices than the global batch has samples " \
        "(64)" in project_fails(capsys, [*argv, "--devices", "1", "65", "--nodes", "1"])
    # One world: nothing to compare, and not "samples/s still rise".
    assert project_command.main([*argv, "--devices", "1", "--nodes", "1"]) == 0
    lines = project_command.summary_lines(json.loads(capsys.readouterr().out))
    assert "one world only: give more --devices or --nodes to compare" in lines[0]


# --- Files kosmoss did not write: every shape of JSON is a one-line error or a usable value ---

VALID_RUN = {"world_size": 1, "per_device_batch_size": 256, "train_samples_per_s": 2000.0,
             "accelerator": "cpu", "steps_per_execution": 8, "loop_step_s": 0.001,
             "step_time_cv": [0.1]}
VALID_BENCH = {"kosmoss_bench": 1, "rows": [
    {"id": "kosmoss-cpu", "status": "measured", "ranks": 1, "samples_per_s": 2000.0,
     "batch_size": 256, "device": "cpu", "steps_per_execution": 1, "loop_step_s": 0.0}]}
VALID_COMM = {"plan": {"ranks_per_node": 2, "nodes": 2, "backend": "gloo"}, "date": "2026-11-29",
              "groups": {"intra": {"fit": {"link_latency_s": 1e-5, "link_bandwidth_Bps": 1e9}},
                         "inter": {"fit_mean": {"link_latency_s": 2e-5,
                                                "link_bandwidth_Bps": 1e8}}}}


def _json_values():
    from hypothesis import strategies as st

    leaves = (st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats()
              | st.sampled_from(["", "measured", "kosmoss-cpu", "gpu", "x"]))
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


def _places(doc, path=()):
    """Every (container, key) of a JSON document: where a mutation can go."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for key, value in items:
        yield path + (key,)
        yield from _places(value, path + (key,))


def _mutated(data, valid):
    """``valid`` with one value replaced by any JSON, or dropped; or any JSON at all."""
    import copy

    from hypothesis import strategies as st

    if data.draw(st.integers(0, 5)) == 0:
        return data.draw(_json_values())
    doc = copy.deepcopy(valid)
    path = data.draw(st.sampled_from(list(_places(doc))))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(_json_values())
    return doc


def _hypothesis_settings():
    from hypothesis import HealthCheck, settings

    return settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_any_result_or_bench_json_gives_a_usable_reference_or_a_usage_error(tmp_path):
    """A run's or a bench's file edited by hand, cut short or from another tool: --from
    either reads a samples/s > 0 and a batch >= 1, or says why in one UsageError; never a
    traceback (a list once raised AttributeError, a 0 samples/s ZeroDivisionError)."""
    import math

    from hypothesis import given
    from hypothesis import strategies as st

    @_hypothesis_settings()
    @given(st.data(), st.sampled_from([VALID_RUN, VALID_BENCH]))
    def check(data, valid):
        file = tmp_path / "result.json"
        file.write_text(json.dumps(_mutated(data, valid)))
        try:
            reference = projection.read_reference(file)
        except UsageError as err:
            assert str(err).startswith(f"--from {file}") or str(err).startswith("--row ")
            return
        assert math.isfinite(reference["samples_per_s"]) and reference["samples_per_s"] > 0
        assert isinstance(reference["batch"], int) and reference["batch"] >= 1
        spread = reference["step_time_cv"]
        assert spread is None or (math.isfinite(spread) and spread >= 0)
        assert reference["device"] in ("cpu", "cuda")

    check()


def test_any_comm_json_gives_usable_links_or_a_usage_error():
    import math

    from hypothesis import given
    from hypothesis import strategies as st

    @_hypothesis_settings()
    @given(st.data())
    def check(data):
        comm = _mutated(data, VALID_COMM)
        try:
            links = projection.links_from_comm(comm, "--comm c.json") \
                if isinstance(comm, dict) else None
        except UsageError as err:
            assert str(err).startswith("--comm c.json: ")
            return
        for link in links or ():
            if link is not None:
                assert math.isfinite(link.latency_s) and link.latency_s >= 0
                assert math.isfinite(link.bandwidth_Bps) and link.bandwidth_Bps > 0

    check()


@pytest.mark.parametrize("text", ["[1, 2]", "null", '"result"', "{}"])
def test_a_json_that_is_no_object_is_one_line_for_from_and_comm(tmp_path, capsys, text):
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(text)
    assert f"--from {run / 'result.json'}: " in project_fails(capsys, ["--from", str(run)])
    assert f"--comm {run / 'result.json'}: not " in \
        project_fails(capsys, ["--comm", str(run / "result.json"), "--devices", "2"])
