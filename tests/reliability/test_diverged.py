"""A run whose weights (or validation loss) become NaN or inf stops on every rank at the
same step, without a hang: no validation or checkpoint after it, a strict-JSON
result.json that says what and where, one line, exit 1, recorded failed. The cases: a
rate far too high (from the first step), an inf batch on the last rank of 1 to 4
(DDP carries its NaN gradients to all), inside chunks of K = 8, in a validation with
finite weights, on simulated nodes; and the resume of a diverged run, exact."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corruption import CorruptBatchAt, environment
from helpers import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from late_reads import LATE_READS_ENV, read_late
from stops import batches_per_epoch, run_in_process

from kosmoss.core.files import json_text
from kosmoss.data.schema import OUTPUT_BLOCK
from kosmoss.run.divergence import CHECK_EVERY_STEPS, Diverged, weights_finite

CORRUPT_AT = 30  # inside the second epoch at every world size below: after one checkpoint
CORRUPT_AT_SCRIPT = Path(__file__).with_name("corrupt_at.py")


def strict_json(path: Path):
    """json.loads that refuses NaN and Infinity, as jq, browsers and JSON.parse do."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is no JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def _trainup(home: Path, *args: str, env_extra=None, script=CORRUPT_AT_SCRIPT):
    env = {key: value for key, value in os.environ.items()
           if key not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK")}
    env.update(KOSMOSS_HOME=str(home), PYTHONUNBUFFERED="1", **(env_extra or {}))
    return subprocess.run([sys.executable, str(script), "--dataset", "tiny", "--no-progress",
                           "--hidden", "16", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def _the_run(home: Path) -> Path:
    (run_dir,) = (home / "runs").iterdir()
    return run_dir


def _one_line(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("trainup_cpu.py")]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, \
        done.stderr[-3000:]
    return lines[0]


def _home(tmp_path: Path, shared_home: Path) -> Path:
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "tiny").symlink_to(shared_home / "data" / "tiny")
    return home


def _checkpoint_steps(run_dir: Path) -> dict:
    """Each checkpoint's step, and whether its weights are all numbers."""
    found = {}
    for path in sorted((run_dir / "checkpoints").glob("*.ckpt")):
        state = torch.load(path, map_location="cpu", weights_only=False)
        found[path.name] = (state["global_step"],
                            weights_finite(v for v in state["state_dict"].values()
                                           if v.is_floating_point()))
    return found


def _first_check_after(step: int, epoch: int) -> int:
    """The first step, after the one that made the weights NaN, at which they are checked:
    every CHECK_EVERY_STEPS steps and at each epoch's end (one step a batch)."""
    every = (step // CHECK_EVERY_STEPS + 1) * CHECK_EVERY_STEPS
    epoch_end = (step // epoch + 1) * epoch
    return min(every, epoch_end)


def test_a_rate_far_too_high_fails_at_the_first_check_in_one_line(shared_home, tmp_path):
    home = _home(tmp_path, shared_home)
    done = _trainup(home, "--lr", "1e30", "--batch-size", "64", "--max-steps", "40",
                    "--result-json", str(tmp_path / "copy.json"))
    line = _one_line(done)
    run_dir = _the_run(home)
    epoch = batches_per_epoch(shared_home / "data" / "tiny", 64)
    assert line == (f"trainup_cpu.py: failed: run {run_dir.name} diverged: the weights are NaN "
                    f"or inf at step {epoch} (numbers at the check before, step 0); if the rate "
                    "(1e+30 at batch 64) is too high, start again with a lower --lr or with "
                    f"--warmup-steps; result in {run_dir / 'result.json'}")
    result = strict_json(run_dir / "result.json")
    assert result == strict_json(tmp_path / "copy.json")
    assert result["diverged"] == {"step": epoch, "what": "the weights are NaN or inf",
                                  "finite_at_step": 0, "checked_every": CHECK_EVERY_STEPS}
    assert result["global_step"] == epoch and result["val_curve"] == []  # nothing validated
    assert {result[k] for k in ("val_loss", "test_loss", "stopped_by")} == {None}
    assert _checkpoint_steps(run_dir) == {}  # none of NaN weights
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "failed", record


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_an_inf_batch_on_the_last_rank_stops_every_rank_at_one_step(world, shared_home,
                                                                   tmp_path):
    """DDP averages the last rank's NaN gradients into every rank's weights: all ranks find
    them at the same check and end together (a rank that stopped alone would leave the
    others in the next all-reduce until the timeout)."""
    home, batch = _home(tmp_path, shared_home), 60
    epoch = batches_per_epoch(shared_home / "data" / "tiny", batch, world_size=world)
    done = _trainup(home, "--num-processes", str(world), "--batch-size", str(batch),
                    "--max-epochs", "4", "--steps-per-execution", "1",
                    "--collective-timeout", "60", env_extra=environment(CORRUPT_AT, world - 1))
    line = _one_line(done)
    run_dir = _the_run(home)
    found = _first_check_after(CORRUPT_AT + 1, epoch)
    assert f"at step {found} (numbers at the check before, step {epoch})" in line, line
    result = strict_json(run_dir / "result.json")
    assert result["diverged"]["step"] == result["global_step"] == found
    assert len(result["replica_checksums"]) == world and result["replicas_identical"]
    # The first epoch's checkpoints only, all numbers; the NaN steps saved nothing.
    assert _checkpoint_steps(run_dir) == {f"epoch=0-step={epoch}.ckpt": (epoch, True),
                                          "last.ckpt": (epoch, True)}
    assert [point["step"] for point in result["val_curve"]] == [epoch]
    states = [json.loads(p.read_text())["state"] for p in (run_dir / "processes").iterdir()]
    assert states == ["failed"] * world, states


@pytest.mark.slow
def test_read_late_as_on_a_gpu_three_ranks_stop_together_one_batch_after_the_check(
        shared_home, tmp_path):
    """On a GPU the check between two saves is read at the next batch's end, not when each
    rank's GPU is done: every rank stops at that one step (a rank ahead of the others would
    leave them in the next all-reduce), and the NaN weights are saved nowhere."""
    world, batch = 3, 60
    home = _home(tmp_path, shared_home)
    epoch = batches_per_epoch(shared_home / "data" / "tiny", batch, world_size=world)
    found = _first_check_after(CORRUPT_AT + 1, epoch)
    assert found == CHECK_EVERY_STEPS < 2 * epoch  # a check with no save after it: read late
    done = _trainup(home, "--num-processes", str(world), "--batch-size", str(batch),
                    "--max-epochs", "4", "--steps-per-execution", "1",
                    "--collective-timeout", "60",
                    env_extra={**environment(CORRUPT_AT, world - 1), LATE_READS_ENV: "1"})
    line = _one_line(done)
    assert f"at step {found + 1} (numbers at the check before, step {epoch})" in line, line
    result = strict_json(_the_run(home) / "result.json")
    assert result["diverged"]["step"] == result["global_step"] == found + 1
    assert len(result["replica_checksums"]) == world and result["replicas_identical"]
    assert _checkpoint_steps(_the_run(home)) == {f"epoch=0-step={epoch}.ckpt": (epoch, True),
                                                 "last.ckpt": (epoch, True)}


@pytest.mark.parametrize("k", [1, 8])
def test_a_diverged_run_resumed_diverges_again_exactly(k, shared_home, tmp_path, monkeypatch):
    """In chunks of K = 8 the check comes at a chunk's end; the resume from the checkpoint
    before the divergence makes the same steps and finds it at the same one."""
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64)  # 26: chunks end at 34, 42, 50 in the second epoch
    flags = dict(dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=5,
                 steps_per_execution=k)
    corrupt = CorruptBatchAt(CORRUPT_AT)
    with pytest.raises(Diverged) as first:
        run_in_process(tmp_path, monkeypatch, stop=corrupt, **flags)
    run_dir = _the_run(tmp_path)
    diverged = strict_json(run_dir / "result.json")
    assert diverged["diverged"] == {"step": 50, "what": "the weights are NaN or inf",
                                    "finite_at_step": epoch, "checked_every": CHECK_EVERY_STEPS}
    assert "at step 50 (numbers at the check before, step 26)" in str(first.value)
    with pytest.raises(Diverged):
        run_in_process(tmp_path, monkeypatch, stop=corrupt, resume=run_dir.name, **flags)
    again = strict_json(run_dir / "result.json")
    assert again["resumed_from_step"] == again["trained_from_step"] == epoch
    for key in ("diverged", "global_step", "val_curve", "replica_checksums"):
        assert again[key] == diverged[key], key


def test_a_validation_loss_that_is_no_number_stops_with_the_weights_of_before(
        shared_home, tmp_path, monkeypatch):
    """Finite weights whose validation loss is NaN (an inf column in the validation set):
    the fit ends there, and that validation saves no checkpoint."""
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64)
    with pytest.raises(Diverged, match=rf"the validation loss is nan at step {2 * epoch};"):
        run_in_process(tmp_path, monkeypatch, stop=CorruptBatchAt(epoch + 1, where="val"),
                       dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=5)
    run_dir = _the_run(tmp_path)
    result = strict_json(run_dir / "result.json")
    assert result["diverged"]["step"] == result["global_step"] == 2 * epoch
    assert [p["step"] for p in result["val_curve"]] == [epoch, 2 * epoch]
    assert math.isfinite(result["val_curve"][0]["val_loss"])
    assert result["val_curve"][1]["val_loss"] is None  # NaN, written as JSON has it: null
    assert _checkpoint_steps(run_dir) == {f"epoch=0-step={epoch}.ckpt": (epoch, True),
                                          "last.ckpt": (epoch, True)}


@pytest.mark.parametrize("corrupt_at, max_epochs, found_at", [
    (2, 4, 50),   # epoch 0 ends unvalidated at 26: no check there, the next at 50
    (51, 2, 52),  # after the check at 50, inside the last epoch: checked at its end
    (55, 4, 78),  # epoch 2 ends with a validation at 78: checked before it
])
def test_with_fewer_validations_the_epoch_ends_checked_are_those_that_save(
        corrupt_at, max_epochs, found_at, shared_home, tmp_path, monkeypatch):
    """--val-every-n-epochs 3: the weights are checked every 50 steps and at the end of an
    epoch that a validation and its checkpoints follow, or that ends the fit; not at every
    epoch's end (a wait for the GPU each epoch). Whatever ends the fit saves no NaN."""
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64)
    assert epoch == 26  # the steps above are counted for this split
    with pytest.raises(Diverged, match=rf"NaN or inf at step {found_at} "):
        run_in_process(tmp_path, monkeypatch, stop=CorruptBatchAt(corrupt_at),
                       dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=max_epochs,
                       val_every_n_epochs=3)
    result = strict_json(_the_run(tmp_path) / "result.json")
    assert result["diverged"]["step"] == result["global_step"] == found_at
    saved = _checkpoint_steps(_the_run(tmp_path))
    assert all(finite for _, finite in saved.values()), saved
    assert [p["step"] for p in result["val_curve"]] == ([78] if found_at > 78 else [])


@pytest.mark.slow
def test_simulated_nodes_say_the_divergence_once(shared_home, tmp_path):
    home = _home(tmp_path, shared_home)
    done = _trainup(home, "--num-nodes", "2", "--lr", "1e30", "--batch-size", "64",
                    script=REPO / "trainup_cpu.py")
    line = _one_line(done)
    assert "diverged: the weights are NaN or inf" in line and "other nodes" not in line, line
    assert strict_json(_the_run(home) / "result.json")["diverged"]["step"] > 0


@pytest.mark.parametrize("corrupt_at, max_epochs, found_at", [
    (2, 4, 51),   # the check at 50 has no save after it: read at the next batch's end
    (51, 2, 52),  # the last epoch's end: read at once, the fit ends there
    (55, 4, 78),  # a validation follows: read at once, before it
])
def test_read_late_as_on_a_gpu_only_the_checks_between_saves_wait_a_batch(
        corrupt_at, max_epochs, found_at, shared_home, tmp_path, monkeypatch):
    tiny = shared_home / "data" / "tiny"
    read_late(monkeypatch)
    with pytest.raises(Diverged, match=rf"NaN or inf at step {found_at} "):
        run_in_process(tmp_path, monkeypatch, stop=CorruptBatchAt(corrupt_at),
                       dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=max_epochs,
                       val_every_n_epochs=3, steps_per_execution=1)
    result = strict_json(_the_run(tmp_path) / "result.json")
    assert result["diverged"]["step"] == result["global_step"] == found_at
    saved = _checkpoint_steps(_the_run(tmp_path))
    assert all(finite for _, finite in saved.values()), saved


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=64),
       st.sampled_from([math.nan, math.inf, -math.inf, None]), st.data())
def test_weights_finite_exactly_when_every_element_is(values, bad, data):
    """Float32's (and float16's) extremes side by side sum to more than the type holds:
    still finite."""
    tensor = torch.tensor(values, dtype=torch.float32)
    parts = [tensor, torch.full((3,), 3.4e38), torch.full((2,), -3.4e38),
             torch.full((4,), 6e4, dtype=torch.float16)]
    if bad is not None:
        parts[0][data.draw(st.integers(0, len(values) - 1))] = bad
    assert weights_finite(parts) is (bad is None)


def test_json_text_writes_what_is_no_number_as_null():
    data = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (2, "x"), "e": None}
    assert json.loads(json_text(data)) == {"a": None, "b": [1.5, None, {"c": None}],
                                           "d": [2, "x"], "e": None}


def test_a_checkpoint_holding_nan_weights_is_not_trained_on(shared_home, tmp_path, monkeypatch):
    """A checkpoint saved with NaN weights (by a kosmoss that kept them): resumed, the run
    stops before its first step."""
    tiny = shared_home / "data" / "tiny"
    flags = dict(dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=3)
    run_in_process(tmp_path, monkeypatch, max_steps=5, **flags)
    run_dir = _the_run(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=False)
    state["state_dict"]["net.0.weight"][0, 0] = math.nan
    torch.save(state, last)
    with pytest.raises(Diverged, match="the weights resumed from are NaN or inf at step 5;"):
        run_in_process(tmp_path, monkeypatch, resume=run_dir.name, max_steps=9, **flags)
    assert strict_json(run_dir / "result.json")["global_step"] == 5


@pytest.mark.parametrize("late", [False, True], ids=["read at once", "read late"])
def test_a_sigterm_at_the_step_that_finds_nan_weights_saves_none_of_them(
        late, shared_home, tmp_path, monkeypatch):
    """The stop and the divergence at one step: the divergence wins (exit 1, no
    preempted.ckpt of NaN weights), the checkpoint before it stays the newest. Read late
    (a GPU's), the check is decided before the stop's checkpoint, not a batch later."""
    import signal

    import kosmoss.run.train as train_module
    from stops import SignalAt

    if late:
        read_late(monkeypatch)
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64)
    build = train_module.build_trainer
    both = [CorruptBatchAt(CORRUPT_AT), SignalAt(CHECK_EVERY_STEPS - 1, signal.SIGTERM)]
    monkeypatch.setattr(train_module, "build_trainer",
                        lambda plan, callbacks: build(plan, callbacks + both))
    with pytest.raises(Diverged, match=f"at step {CHECK_EVERY_STEPS} "):
        run_in_process(tmp_path, monkeypatch, dataset=str(tiny), batch_size=64, hidden=(16,),
                       max_epochs=5, steps_per_execution=1)
    run_dir = _the_run(tmp_path)
    assert strict_json(run_dir / "result.json")["stopped_by"] is None
    assert _checkpoint_steps(run_dir) == {f"epoch=0-step={epoch}.ckpt": (epoch, True),
                                          "last.ckpt": (epoch, True)}


class _SourceWithNaN:
    """RandomSource whose first column holds a NaN input and an inf target."""

    def __init__(self, n_columns: int):
        from helpers import RandomSource
        self.inner = RandomSource(n_columns)
        self.schema, self.n_columns = self.inner.schema, n_columns

    def iter_chunks(self, chunk_size):
        for index, blocks in enumerate(self.inner.iter_chunks(chunk_size)):
            if index == 0:
                blocks["sca_inputs"][0, 1] = math.nan
                blocks[OUTPUT_BLOCK][0, 0, 0] = math.inf
            yield blocks

    def describe(self):
        return {"name": "random-with-nan"}


def test_a_dataset_holding_nan_is_refused_before_the_run_starts(tmp_path):
    """It used to train, diverge at the first check and blame the rate."""
    from kosmoss.data.store import prepare

    home = tmp_path / "home"
    folder = prepare(_SourceWithNaN(600), home / "data" / "broken", shard_size=256).path
    done = _trainup(home, "--dataset", str(folder), "--batch-size", "64",
                    script=REPO / "trainup_cpu.py")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0] == (f"trainup_cpu.py: error: --dataset {folder}: 1 input and 1 output "
                        "feature(s) hold NaN or inf values (their mean or std is no number): "
                        "every step would be NaN; prepare it again from a clean source")
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_preparing_a_dataset_holding_nan_warns_in_one_line(tmp_path, recwarn, capsys):
    from kosmoss.commands import data
    from kosmoss.data.store import prepare

    said = []
    prepare(_SourceWithNaN(600), tmp_path / "broken", shard_size=256, log=said.append)
    assert said == [f"warning: {tmp_path / 'broken'}: 1 input and 1 output feature(s) hold "
                    "NaN or inf values; a run on it is refused until it is prepared from a "
                    "clean source"]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]  # numpy's
    assert data.main(["info", str(tmp_path / "broken"), "--json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert item["not_numbers_xy"] == [1, 1]


@pytest.mark.parametrize("k", [1, 8])
def test_nan_weights_at_the_last_step_are_found_there_and_not_saved(k, shared_home, tmp_path,
                                                                    monkeypatch):
    """--max-steps 40 ends between two checks: the last step is checked too, and the end of
    training saves no last.ckpt of it, runs no final validation or test."""
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64)
    with pytest.raises(Diverged, match="the weights are NaN or inf at step 40 "):
        run_in_process(tmp_path, monkeypatch, stop=CorruptBatchAt(CORRUPT_AT),
                       dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=5,
                       max_steps=40, steps_per_execution=k)
    run_dir = _the_run(tmp_path)
    result = strict_json(run_dir / "result.json")
    assert [p["step"] for p in result["val_curve"]] == [epoch] and result["test_loss"] is None
    assert _checkpoint_steps(run_dir) == {f"epoch=0-step={epoch}.ckpt": (epoch, True),
                                          "last.ckpt": (epoch, True)}


def test_a_final_validation_that_is_no_number_fails_the_run_with_its_weights_kept(
        shared_home, tmp_path, monkeypatch):
    """The fit ended with numbers (last.ckpt holds them); the validation after it is NaN:
    the run fails all the same, naming it."""
    tiny = shared_home / "data" / "tiny"
    with pytest.raises(Diverged, match="the final val_loss is nan at step 40;"):
        run_in_process(tmp_path, monkeypatch, stop=CorruptBatchAt(0, where="final"),
                       dataset=str(tiny), batch_size=64, hidden=(16,), max_epochs=5,
                       max_steps=40)
    run_dir = _the_run(tmp_path)
    assert strict_json(run_dir / "result.json")["val_loss"] is None
    assert _checkpoint_steps(run_dir)["last.ckpt"] == (40, True)
