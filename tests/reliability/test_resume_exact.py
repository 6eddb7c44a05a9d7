"""A run stopped anywhere and resumed ends as the run never stopped: the same final weights
(torch.equal), the same metrics.csv rows (no duplicate, no gap), the same validation
curve. Stops derived from the epoch's length: inside an epoch, on an epoch's last batch,
during a validation, inside a chunk of K steps, on the step that reaches --max-steps; one
step a batch (K = 1) and eight (K = 8); SIGTERM and SIGUSR1 (in this process: a second a
run), SIGKILL (trainup_cpu.py, resumed from the newest checkpoint on disk). A fit that an
exception ends keeps the rows it trained, read late as on a GPU or not."""
from __future__ import annotations

import signal
import threading
from csv import DictReader
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from late_reads import read_late
from stops import Finished, SignalAt, batches_per_epoch, compare, run_in_process, run_script

BATCH, HIDDEN = 64, (16,)
TERM, USR1, KILL = signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL


@pytest.fixture(scope="module")
def tiny(shared_home):
    return shared_home / "data" / "tiny"


@pytest.fixture(scope="module")
def epoch(tiny):
    return batches_per_epoch(tiny, BATCH)  # 26 for the tiny preset at batch 64


def _max_steps(epoch: int) -> int:
    return 5 * epoch + 10  # ends inside an epoch: the final validation comes after the fit


def _flags(tiny, epoch, k):
    return dict(dataset=str(tiny), batch_size=BATCH, hidden=HIDDEN, max_epochs=100,
                max_steps=_max_steps(epoch), steps_per_execution=k)


def _straight_runs(tmp_path_factory, tiny, epoch, name, **extra):
    """The runs never stopped, K = 1 and K = 8, with ``extra`` flags."""
    runs = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for k in (1, 8):
            home = tmp_path_factory.mktemp(f"{name}-k{k}")
            result = run_in_process(home, monkeypatch, **dict(_flags(tiny, epoch, k), **extra))
            runs[k] = Finished.of(result["run_dir"])
    return runs


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny, epoch):
    """The runs never stopped, K = 1 and K = 8 (run once for the module)."""
    return _straight_runs(tmp_path_factory, tiny, epoch, "straight")


def expected_stop(step: int, epoch: int, k: int, max_steps: int, where: str = "train",
                  val_every: int = 1) -> int:
    """Where a signal that arrives while ``step`` trains stops the run: at the end of the
    step of Lightning's loop that holds it (K batches, cut from the epoch's start); one
    that arrives during the first validation at or after ``step``: at that epoch's end."""
    if where == "val":
        every = val_every * epoch
        return min(-(-step // every) * every, max_steps)
    start = step - step % epoch
    chunk_end = start + min(epoch, (step % epoch // k + 1) * k)
    return min(chunk_end, max_steps)


def _stop_and_resume(home, monkeypatch, flags, stop: SignalAt, expected: int) -> Finished:
    stopped = run_in_process(home, monkeypatch, stop=stop, **flags)
    assert (stopped["stopped_by"], stopped["global_step"]) == \
        (signal.Signals(stop.sig).name, expected), stopped
    resumed = run_in_process(home, monkeypatch, resume=stopped["run_id"])
    assert resumed["resumed_from_step"] == resumed["trained_from_step"] == expected, resumed
    assert not [w for w in resumed["warnings"] if "torch threads" in w], resumed["warnings"]
    return Finished.of(resumed["run_dir"])


def test_a_resume_on_other_torch_threads_says_its_weights_will_not_match_bit_for_bit(
        tmp_path, monkeypatch, tiny, epoch, straight):
    """A matmul's rounding depends on its threads: the resume continues every step and row,
    and says that its weights' last bits cannot be the straight run's."""
    flags, home = _flags(tiny, epoch, 1), tmp_path / "home"
    stopped = run_in_process(home, monkeypatch, stop=SignalAt(epoch + 13, TERM), **flags)
    saved_on = torch.get_num_threads()
    other = 1 if saved_on > 1 else 2
    try:
        torch.set_num_threads(other)
        resumed = run_in_process(home, monkeypatch, resume=stopped["run_id"])
    finally:
        torch.set_num_threads(saved_on)
    assert resumed["torch_threads"] == other and stopped["torch_threads"] == saved_on
    (said,) = [w for w in resumed["warnings"] if "torch threads" in w]
    assert said.startswith(f"resumed on {other} torch threads where the checkpoint was saved "
                           f"on {saved_on}") and f"OMP_NUM_THREADS={saved_on}" in said
    finished = Finished.of(resumed["run_dir"])

    def when(run):  # each row's step and what it holds, not its value (the rounding differs)
        return [(r["step"], sorted(k for k, v in r.items() if v)) for r in run.rows]

    assert when(finished) == when(straight[1])
    assert finished.result["global_step"] == straight[1].result["global_step"]


# (name, K, the step the signal arrives in (in epochs: a, b -> a * epoch + b), where, signal)
STOPS = [
    ("mid-epoch", 1, (1, 13), "train", TERM),
    ("epoch end", 1, (2, -1), "train", USR1),
    ("validation", 1, (3, 0), "val", TERM),
    ("max steps", 1, (5, 9), "train", USR1),
    ("inside a chunk", 8, (1, 3), "train", USR1),
    ("epoch end", 8, (2, -1), "train", TERM),
    ("validation", 8, (3, 0), "val", USR1),
    ("max steps", 8, (5, 9), "train", TERM),
]


@pytest.mark.parametrize("name,k,at,where,sig", STOPS,
                         ids=[f"{s[0]}-k{s[1]}-{signal.Signals(s[4]).name}" for s in STOPS])
def test_a_stop_resumes_exactly(name, k, at, where, sig, tmp_path, monkeypatch, tiny, epoch,
                                straight):
    flags = _flags(tiny, epoch, k)
    step = at[0] * epoch + at[1]
    expected = expected_stop(step, epoch, k, flags["max_steps"], where)
    resumed = _stop_and_resume(tmp_path / "home", monkeypatch, flags, SignalAt(step, sig, where),
                               expected)
    assert compare(resumed, straight[k]) is None, compare(resumed, straight[k])


SCORES = ("val_loss", "val_rmse_wm2", "test_loss", "test_rmse_wm2")


def _scores(finished: Finished) -> dict:
    return {name: finished.result[name] for name in SCORES}


@pytest.fixture(scope="module")
def straight_to_an_epochs_end(tmp_path_factory, tiny, epoch):
    """The runs never stopped whose fit ends on an epoch's last batch (--max-steps of five
    epochs): the epoch's validation is the fit's last; none comes after it."""
    return _straight_runs(tmp_path_factory, tiny, epoch, "straight-epoch-end", max_steps=5 * epoch)


@pytest.mark.parametrize("k, sig, where", [(1, TERM, "train"), (8, USR1, "train"),
                                           (1, USR1, "val"), (8, TERM, "val")])
def test_a_stop_on_the_fits_last_step_at_an_epochs_end_resumes_exactly(
        k, sig, where, tmp_path, monkeypatch, tiny, epoch, straight_to_an_epochs_end):
    """The stop lands where the fit ends anyway (its last batch, or the validation after
    it: the test pass is left to the resume, as from a signal during it): the resume trains
    nothing, and scores the weights as the run never stopped did (a validation of a step
    validated already stays one point of the curve and no row more). Once: a traceback,
    val_loss None."""
    flags = dict(_flags(tiny, epoch, k), max_steps=5 * epoch)
    resumed = _stop_and_resume(tmp_path / "home", monkeypatch, flags,
                               SignalAt(5 * epoch - (where == "train"), sig, where), 5 * epoch)
    straight = straight_to_an_epochs_end[k]
    assert straight.result["val_curve"][-1]["step"] == 5 * epoch
    assert compare(resumed, straight) is None, compare(resumed, straight)
    assert _scores(resumed) == _scores(straight)


@pytest.mark.parametrize("fit_ends", ["inside an epoch", "on an epoch's end"])
def test_a_stop_while_the_run_tests_resumes_to_the_same_scores(
        fit_ends, tmp_path, monkeypatch, tiny, epoch, straight, straight_to_an_epochs_end):
    """After the fit, before its test scores: the stop is one line (records.Stopped), and
    --resume writes what the run never stopped wrote."""
    from kosmoss.launch import records

    epochs_end = fit_ends == "on an epoch's end"
    flags = dict(_flags(tiny, epoch, 8), **({"max_steps": 5 * epoch} if epochs_end else {}))
    home = tmp_path / "home"
    with pytest.raises(records.Stopped):
        run_in_process(home, monkeypatch, stop=SignalAt(0, TERM, "test"), **flags)
    (run_dir,) = (home / "runs").iterdir()
    resumed = Finished.of(run_in_process(home, monkeypatch, resume=run_dir.name)["run_dir"])
    reference = (straight_to_an_epochs_end if epochs_end else straight)[8]
    assert compare(resumed, reference) is None, compare(resumed, reference)
    assert _scores(resumed) == _scores(reference)


def test_two_stops_in_a_row_resume_exactly(tmp_path, monkeypatch, tiny, epoch, straight):
    """Stopped inside an epoch, resumed, stopped again on an epoch's last batch, resumed."""
    home, flags = tmp_path / "home", _flags(tiny, epoch, 8)
    first = run_in_process(home, monkeypatch, stop=SignalAt(epoch + 3, TERM), **flags)
    again = run_in_process(home, monkeypatch, stop=SignalAt(3 * epoch - 1, USR1),
                           resume=first["run_id"])
    assert (again["resumed_from_step"], again["global_step"]) == (epoch + 8, 3 * epoch)
    last = run_in_process(home, monkeypatch, resume=first["run_id"])
    assert compare(Finished.of(last["run_dir"]), straight[8]) is None


@pytest.mark.parametrize("at, sig", [((1, 3), USR1), ((2, -1), TERM)],
                         ids=["inside a chunk", "epoch end"])
def test_rows_read_late_as_on_a_gpu_are_all_written_in_order(at, sig, tmp_path, monkeypatch,
                                                              tiny, epoch, straight):
    """On a GPU a train_loss row waits for its value until a validation, a checkpoint or the
    fit's end needs it (here: every row waits so): the run, and a stop and its resume,
    write the rows of the run whose rows were written at once."""
    read_late(monkeypatch)
    flags = _flags(tiny, epoch, 8)
    late = run_in_process(tmp_path / "straight", monkeypatch, **flags)
    assert compare(Finished.of(late["run_dir"]), straight[8]) is None
    step = at[0] * epoch + at[1]
    expected = expected_stop(step, epoch, 8, flags["max_steps"])
    resumed = _stop_and_resume(tmp_path / "home", monkeypatch, flags, SignalAt(step, sig),
                               expected)
    assert compare(resumed, straight[8]) is None, compare(resumed, straight[8])


def test_rows_read_late_are_on_disk_before_each_checkpoint(tmp_path, monkeypatch, tiny, epoch):
    """What a SIGKILL after a checkpoint leaves: every train_loss row of the steps before it
    (the checkpoints after a validation, last.ckpt, a stop signal's inside an epoch)."""
    import pytorch_lightning as pl

    read_late(monkeypatch)
    saved, save = [], pl.Trainer.save_checkpoint

    def save_and_look(trainer, filepath, *args, **kwargs):
        save(trainer, filepath, *args, **kwargs)
        (csv,) = (tmp_path / "runs").glob("*/csv/metrics.csv")
        with open(csv, newline="") as handle:
            steps = {row["step"] for row in DictReader(handle) if row["train_loss"]}
        every = trainer.log_every_n_steps
        saved.append((Path(filepath).name, steps == {str(step) for step in
                                                      range(trainer.global_step)
                                                      if (step + 1) % every == 0}))

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", save_and_look)
    # Stopped at 102, after the row of step 99 and before the validation at 104.
    run_in_process(tmp_path, monkeypatch, stop=SignalAt(4 * epoch - 4, TERM),
                   **_flags(tiny, epoch, 8))
    assert [name for name, _ in saved][-3:] == ["epoch=2-step=78.ckpt", "last.ckpt",
                                                "preempted.ckpt"], saved
    assert all(complete for _, complete in saved), saved


class FailAt(pl.Callback):
    """Raises in the optimizer step of step ``step`` (0-based), the steps before it done:
    a failure inside a step, inside a chunk of K > 1."""

    def __init__(self, step: int) -> None:
        self.step, self.reached = step, None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step >= self.step:
            self.reached = trainer.global_step
            raise RuntimeError("a failure mid-fit")


@pytest.mark.parametrize("k, val_every", [(8, 1), (1, 1), (8, 2)],
                         ids=["inside a chunk", "one step a batch", "validation every other epoch"])
def test_rows_read_late_are_written_when_a_failure_ends_the_fit(k, val_every, tmp_path,
                                                                monkeypatch, tiny, epoch,
                                                                straight, straight_sparse):
    """On a GPU the rows since the last validation wait for their values: an exception
    must not lose them. metrics.csv holds the straight run's rows up to it."""
    read_late(monkeypatch)
    failing = FailAt(4 * epoch - 4)  # after the row of step 99, before the validation at 104
    flags = dict(_flags(tiny, epoch, k), val_every_n_epochs=val_every)
    with pytest.raises(RuntimeError, match="a failure mid-fit"):
        run_in_process(tmp_path, monkeypatch, stop=failing, **flags)
    written = _train_loss_rows(tmp_path)
    reference = (straight if val_every == 1 else straight_sparse)[k]
    expected = [(int(row["step"]), float(row["train_loss"])) for row in reference.rows
                if row["train_loss"] and int(row["step"]) < failing.reached]
    validated = max(p["step"] for p in reference.result["val_curve"] if p["step"] < failing.reached)
    assert expected[-1][0] >= validated, "no row waits: the case tests nothing"
    assert written == expected


def _train_loss_rows(home: Path) -> list:
    (csv,) = (home / "runs").glob("*/csv/metrics.csv")
    with open(csv, newline="") as handle:
        return [(int(row["step"]), float(row["train_loss"])) for row in DictReader(handle)
                if row["train_loss"]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_rows_owed_at_a_failure_are_written(tmp_path, monkeypatch, tiny, epoch):
    """The CUDA path itself, nothing patched: each row's value a copy from the GPU that the
    failure's daemon thread reads (LaterRead.value off the main thread). The rows before the
    failure are a run never stopped's, the same steps and values within float rounding."""
    flags = dict(_flags(tiny, epoch, 8), machine_gpu="offer", use_gpu=True, require_gpu=True,
                 mode="device")
    straight = run_in_process(tmp_path / "straight", monkeypatch, **flags)
    assert straight["accelerator"] == "gpu", straight["accelerator"]
    failing = FailAt(4 * epoch - 4)  # after the row of step 99, before the validation at 104
    with pytest.raises(RuntimeError, match="a failure mid-fit"):
        run_in_process(tmp_path / "failed", monkeypatch, stop=failing, **flags)
    expected = [row for row in _train_loss_rows(tmp_path / "straight") if row[0] < failing.reached]
    written = _train_loss_rows(tmp_path / "failed")
    assert expected[-1][0] > 3 * epoch, "no row waits: the case tests nothing"
    assert [step for step, _ in written] == [step for step, _ in expected]
    assert [loss for _, loss in written] == pytest.approx([loss for _, loss in expected], rel=1e-4)


def _never(self):
    threading.Event().wait()  # a stream stuck in a collective with a dead rank


def _failed_gpu(self):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("read, says",
                         [(_failed_gpu, r"1 train_loss row\(s\) not written: CUDA error"),
                          (_never, "did not reach the host in 0.5 s")],
                         ids=["a failed GPU", "a stuck stream"])
def test_rows_a_gpu_cannot_hand_back_are_said_and_the_failure_kept(read, says, tmp_path,
                                                                   monkeypatch, tiny, epoch):
    """Rows whose values never come: one warning says how many and why, the fit ends within
    the wait, and the failure it raised is the one the run ends with, not the read's."""
    from kosmoss.run import callbacks
    from kosmoss.run.host_reads import LaterRead

    read_late(monkeypatch)
    monkeypatch.setattr(LaterRead, "value", read)
    monkeypatch.setattr(callbacks, "ROWS_WAIT_ON_FAILURE_S", 0.5)
    with pytest.warns(UserWarning, match=says):
        with pytest.raises(RuntimeError, match="a failure mid-fit"):
            run_in_process(tmp_path, monkeypatch, stop=FailAt(epoch - 1),  # row 24 waits
                           **_flags(tiny, epoch, 8))


def test_k_changes_nothing_a_run_records(straight):
    assert compare(straight[8], straight[1]) is None


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, 5 * 26 + 9), k=st.sampled_from([1, 3, 8]),
       sig=st.sampled_from([TERM, USR1]), epochs_end=st.booleans())
def test_a_stop_at_any_step_with_any_k_resumes_exactly(step, k, sig, epochs_end, tmp_path_factory,
                                                       monkeypatch, tiny, epoch, straight,
                                                       straight_to_an_epochs_end):
    """``epochs_end``: the fit ends on an epoch's last batch, else inside the next epoch."""
    flags = dict(_flags(tiny, epoch, k), **({"max_steps": 5 * epoch} if epochs_end else {}))
    step = min(step, flags["max_steps"] - 1)  # the strategy assumes 26 batches an epoch
    expected = expected_stop(step, epoch, k, flags["max_steps"])
    home = tmp_path_factory.mktemp("any-step")
    resumed = _stop_and_resume(home, monkeypatch, flags, SignalAt(step, sig), expected)
    reference = (straight_to_an_epochs_end if epochs_end else straight)[1]
    assert compare(resumed, reference) is None, compare(resumed, reference)
    assert _scores(resumed) == _scores(reference)


# SIGKILL: the process ends where it is; --resume takes the newest checkpoint on disk.
# Read late (as on a GPU): the rows not yet written when it is killed are those after the
# newest checkpoint, which saves the rows before it.
KILLS = [
    ("during a validation", 1, (3, 0), "val", (2, 0), False),
    ("inside a chunk", 8, (4, 3), "train", (4, 0), False),
    ("inside a chunk, read late", 8, (4, 3), "train", (4, 0), True),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,k,at,where,checkpoint,late", KILLS,
                         ids=[f"{s[0]}-k{s[1]}" for s in KILLS])
def test_sigkill_resumes_exactly_from_the_newest_checkpoint(name, k, at, where, checkpoint, late,
                                                            tmp_path, tiny, epoch, straight):
    home, flags = tmp_path / "home", _flags(tiny, epoch, k)
    args = ["--dataset", str(tiny), "--batch-size", str(BATCH), "--hidden", *map(str, HIDDEN),
            "--max-epochs", "100", "--max-steps", str(flags["max_steps"]),
            "--steps-per-execution", str(k)]
    killed = run_script(home, args, SignalAt(at[0] * epoch + at[1], KILL, where),
                        late_reads=late)
    assert killed.returncode == -KILL, killed.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["resumed_from_step"] == checkpoint[0] * epoch + checkpoint[1]
    assert compare(finished, straight[k]) is None, compare(finished, straight[k])


@pytest.mark.slow
def test_three_ranks_signalled_during_a_validation_stop_at_its_end_and_resume_exactly(tmp_path,
                                                                                     tiny):
    """The signal reaches rank 0 alone, during the validation after epoch 2: the ranks
    agree on it as the validation ends and stop on that epoch's end, not a step later."""
    ranks, batch = 3, 96
    epoch = batches_per_epoch(tiny, batch, world_size=ranks)
    args = ["--dataset", str(tiny), "--batch-size", str(batch), "--hidden", *map(str, HIDDEN),
            "--num-processes", str(ranks), "--max-epochs", "100", "--max-steps", str(3 * epoch + 3)]
    straight = run_script(tmp_path / "straight", args)
    assert straight.returncode == 0, straight.stderr[-3000:]
    home = tmp_path / "home"
    stopped = run_script(home, args, SignalAt(epoch + 1, TERM, "val"))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    result = Finished.of(run_dir).result
    assert (result["stopped_by"], result["global_step"]) == ("SIGTERM", 2 * epoch), result
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["resumed_from_step"] == 2 * epoch
    reference = Finished.of(next((tmp_path / "straight" / "runs").iterdir()))
    assert compare(finished, reference) is None, compare(finished, reference)


@pytest.mark.slow
def test_a_killed_extension_of_a_finished_run_resumes_exactly(tmp_path, tiny, epoch, straight):
    """Finished at 2 epochs + 5 steps, trained further to the straight run's --max-steps,
    killed inside a chunk, resumed bare (its record has the new limit): no row twice."""
    home, max_steps = tmp_path / "home", _max_steps(epoch)
    args = ["--dataset", str(tiny), "--batch-size", str(BATCH), "--hidden", *map(str, HIDDEN),
            "--max-epochs", "100", "--steps-per-execution", "8"]
    first = run_script(home, args + ["--max-steps", str(2 * epoch + 5)])
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    killed = run_script(home, ["--resume", run_dir.name, "--max-steps", str(max_steps)],
                        SignalAt(4 * epoch + 3, KILL))
    assert killed.returncode == -KILL, killed.stderr[-3000:]
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["resumed_from_step"] == 4 * epoch
    assert compare(finished, straight[8]) is None, compare(finished, straight[8])


# Validation every other epoch (--val-every-n-epochs 2): epochs end with and without one.
SPARSE_STOPS = [
    ("epoch end, no validation after", 1, (1, -1), "train", USR1),
    ("epoch end, a validation after", 8, (2, -1), "train", TERM),
    ("validation", 8, (2, 0), "val", USR1),
    ("inside a chunk", 8, (3, 3), "train", TERM),
]


@pytest.fixture(scope="module")
def straight_sparse(tmp_path_factory, tiny, epoch):
    return _straight_runs(tmp_path_factory, tiny, epoch, "straight-sparse", val_every_n_epochs=2)


@pytest.mark.parametrize("name,k,at,where,sig", SPARSE_STOPS,
                         ids=[f"{s[0]}-k{s[1]}" for s in SPARSE_STOPS])
def test_a_stop_resumes_exactly_when_validations_skip_epochs(name, k, at, where, sig, tmp_path,
                                                             monkeypatch, tiny, epoch,
                                                             straight_sparse):
    flags = dict(_flags(tiny, epoch, k), val_every_n_epochs=2)
    step = at[0] * epoch + at[1]
    expected = expected_stop(step, epoch, k, flags["max_steps"], where, val_every=2)
    resumed = _stop_and_resume(tmp_path / "home", monkeypatch, flags, SignalAt(step, sig, where),
                               expected)
    straight = straight_sparse[k]
    assert [point["step"] for point in straight.result["val_curve"]] == \
        [2 * epoch, 4 * epoch, flags["max_steps"]]
    assert compare(resumed, straight) is None, compare(resumed, straight)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["inside a chunk", "an epoch's last batch"])
def test_a_compiled_run_resumes_exactly(tmp_path, tiny, epoch, stop):
    """--compile: a bare resume compiles too, and the first step's graph is every other
    step's (a forward hook traced into it made the resumed run's first step round apart:
    kosmoss.run.callbacks.PrecisionProbe). Processes of their own: Dynamo's cache of a
    code object would hold the earlier runs' graphs in this one."""
    args = ["--dataset", str(tiny), "--batch-size", str(BATCH), "--hidden", *map(str, HIDDEN),
            "--max-epochs", "100", "--max-steps", str(2 * epoch + 4), "--compile"]
    straight = run_script(tmp_path / "straight", args)
    assert straight.returncode == 0, straight.stderr[-3000:]
    home = tmp_path / "home"
    at = epoch + 3 if stop == "inside a chunk" else 2 * epoch - 1
    stopped = run_script(home, args, SignalAt(at, TERM))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    resumed = run_script(home, ["--resume", run_dir.name])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    finished = Finished.of(run_dir)
    assert finished.result["compile"] and finished.result["compiled_graphs"] >= 1
    assert finished.result["resumed_from_step"] == expected_stop(at, epoch, 8, 2 * epoch + 4)
    (ran,) = (tmp_path / "straight" / "runs").iterdir()
    assert compare(finished, Finished.of(ran)) is None, compare(finished, Finished.of(ran))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_reading_through_data_workers_resumes_exactly(tmp_path, monkeypatch, tiny, epoch,
                                                            straight, workers):
    """torch's DataLoader with workers (the default on a machine with cores to spare) made
    its sampler's iterator twice: the resumed epoch started over, its first batches twice."""
    flags = dict(_flags(tiny, epoch, 1), num_workers=workers)
    step = epoch + 5
    finished = _stop_and_resume(tmp_path, monkeypatch, flags, SignalAt(step, TERM),
                                expected_stop(step, epoch, 1, flags["max_steps"]))
    assert compare(finished, straight[1]) is None, compare(finished, straight[1])
