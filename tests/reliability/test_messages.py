"""Small messages that must say the right thing: the K error names the nodes when they are
the reason; --resume names a checkpoint file as a file; kosmoss project says a grid that
only loses loses, instead of "samples/s still rise"."""
import json

import pytest

from kosmoss.commands.project import summary_lines
from kosmoss.core.errors import ConfigError
from kosmoss.engines import get as get_engine
from kosmoss.run.chunks import steps_per_execution
from kosmoss.run.config import run_folder


def test_the_k_error_names_nodes_when_nodes_are_the_reason():
    with pytest.raises(ConfigError) as nodes:
        steps_per_execution(8, 2, get_engine("ddp"), "cpu", "32-true", 0, num_nodes=2)
    assert "this run has 2 nodes (2 processes):" in str(nodes.value)
    with pytest.raises(ConfigError) as ranks:
        steps_per_execution(8, 3, get_engine("ddp"), "cpu", "32-true", 0)
    assert "this run has 3 processes:" in str(ranks.value) and "node" not in str(ranks.value)


def test_the_resume_error_names_a_checkpoint_file_as_a_file(tmp_path):
    loose = tmp_path / "model.ckpt"
    loose.write_bytes(b"x")
    other = tmp_path / "weights.pt"
    other.write_bytes(b"x")
    cases = [(loose, "the checkpoint file is not in a run's checkpoints/ folder"),
             (tmp_path / "gone.ckpt", "no such checkpoint file"),
             (other, "a file, not a checkpoint (*.ckpt)")]
    for path, expected in cases:
        with pytest.raises(ConfigError) as refused:
            run_folder(str(path))
        assert f"resume {path}: {expected}" in str(refused.value)
    run = tmp_path / "runs" / "20260101-000000-abcdef" / "checkpoints"
    run.mkdir(parents=True)
    (run / "last.ckpt").write_bytes(b"x")
    assert run_folder(str(run / "last.ckpt")) == (run.parent, run / "last.ckpt")


def _result(speedups):
    rows = [{"speedup": s, "devices_per_node": 2, "nodes": n, "dominant": None,
             "sensitivity": {}} for n, s in enumerate(speedups, 1)]
    return {"rows": rows, "verdict": {"peak": f"2 x {len(speedups)}",
                                      "peak_samples_per_s": 100.0, "peak_is_largest": True,
                                      "break_even": None}}


def test_project_does_not_say_samples_still_rise_when_no_world_beats_one_device():
    losing = summary_lines(_result([0.5, 0.7]))[0]
    assert "still rise" not in losing and "no world of this grid beats one device (best " \
        "speedup 0.70)" in losing
    assert "samples/s still rise" in summary_lines(_result([1.4, 2.1]))[0]


@pytest.mark.parametrize("max_steps, max_epochs, said", [
    (5, 3, "--warmup-steps 20 is longer than the run (5 steps): its last step trains at "
           "0.0016, never at 0.004"),
    (-1, 1, "--warmup-steps 20 is longer than the run (7 steps): its last step trains at "
            "0.0019, never at 0.004"),  # tiny: 1,639 training columns, batches of 256
    (40, 3, None)])
def test_a_warm_up_longer_than_the_run_says_the_rate_is_never_reached(
        shared_home, monkeypatch, max_steps, max_epochs, said):
    """The scaling lines print a rate the run never trained at; one warning line says so."""
    from kosmoss.run import RunConfig
    from kosmoss.run.plan import prepare

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    flags = dict(dataset="tiny", batch_size=256, lr=0.001, scale_lr="linear",
                 base_batch_size=64, warmup_steps=20, max_steps=max_steps,
                 max_epochs=max_epochs, hidden=(8,))
    warnings = prepare(RunConfig(**flags, given=frozenset(flags))).warnings
    assert [w for w in warnings if "warmup" in w] == ([said] if said else [])


@pytest.mark.parametrize("mode, workers, said", [
    ("device", 2, "--num-workers 2 is not used: with --mode device each process gathers its "
                  "batches from the data it holds in its memory"),
    ("device", 0, None), ("controlled", 2, None), ("auto", 1, None)])
def test_workers_the_data_on_the_gpu_cannot_use_are_said_unused(
        shared_home, monkeypatch, mode, workers, said):
    """--mode device gathers each batch in the process: workers asked for are dropped, aloud."""
    from kosmoss.run import RunConfig
    from kosmoss.run.plan import prepare

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    flags = dict(dataset="tiny", mode=mode, num_workers=workers, hidden=(8,))
    plan = prepare(RunConfig(**flags, given=frozenset(flags)))
    assert [w for w in plan.warnings if "--num-workers" in w] == ([said] if said else [])
    assert plan.num_workers == (0 if mode == "device" else workers)


PEER_CLOSED = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[10.213.0.4]:45709. This is typically caused by a remote worker crashing.")
TIMED_OUT = ("RunFailed: a collective waited longer than 17 s (--collective-timeout): every "
             "rank seen here waits in one collective; stacks of every process of the run in "
             "/runs/r/stacks/x.txt")


def _node_record(folder, pid, node, error, attempt="1@1.0#0", ended=0.0):
    from kosmoss.launch import records

    record = {"pid": pid, "host": records.hostname(), "role": "rank", "node_rank": node,
              "attempt": attempt, "state": "failed", "error": error, "ended_at": ended}
    (folder / f"{records.hostname()}-{pid}.json").write_text(json.dumps(record))


def test_a_node_that_failed_because_its_peer_closed_names_the_node_that_failed_itself(tmp_path):
    """Over a slow link the ranks time out together; the one whose peer closed first exits
    first, and the run's line said gloo's "Connection closed by peer", not the timeout and
    its stacks, which the peer had recorded."""
    from types import SimpleNamespace

    from kosmoss.launch.nodes import NodeFailure
    from kosmoss.run.pipeline import _failure_line

    folder = tmp_path / "processes"
    folder.mkdir()
    plan = SimpleNamespace(run_dir=tmp_path)
    _node_record(folder, 10, 0, PEER_CLOSED, ended=5.0)
    assert _failure_line(plan, NodeFailure(0, 10, 1)) == \
        f"node 0 (pid 10) exited with code 1 ({PEER_CLOSED})"
    _node_record(folder, 11, 1, PEER_CLOSED, ended=6.0)
    _node_record(folder, 12, 2, "RuntimeError: an earlier attempt's", attempt="9@9.0#0")
    _node_record(folder, 13, 3, TIMED_OUT, ended=7.0)
    assert _failure_line(plan, NodeFailure(0, 10, 1)) == \
        "node 0 (pid 10) exited with code 1: a peer closed its connections, as node 3 " \
        f"(pid 13) failed ({TIMED_OUT})"
    assert _failure_line(plan, NodeFailure(3, 13, 1)) == \
        f"node 3 (pid 13) exited with code 1 ({TIMED_OUT})"
