"""Several optimizer steps per step of Lightning's loop (kosmoss.run.chunks): the same
training bit for bit as one step a batch, the same logs, exact --max-steps, a resume that
changes K mid-epoch lands on the same weights, and a K the run cannot take is one line."""
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run_script

from kosmoss.core.errors import ConfigError
from kosmoss.run.chunks import ChunkedBatchLoader
from kosmoss.data.loading import RankBatchSampler
from kosmoss.engines import get as get_engine
from kosmoss.run.chunks import STEPS_PER_EXECUTION, steps_per_execution


class Rows:
    def __init__(self):
        self.read = []

    def __getitem__(self, batch):
        self.read.append(int(batch[0]))
        return batch


def _loader(rows: Rows, n: int = 20, k: int = 8) -> ChunkedBatchLoader:
    return ChunkedBatchLoader(rows, RankBatchSampler(np.arange(n), 1, shuffle=False), k)


def test_chunks_are_cut_from_the_epochs_start_and_read_when_taken():
    rows = Rows()
    loader = _loader(rows)
    chunks = list(loader)
    assert len(loader) == len(chunks) == 3 and [c.steps for c in chunks] == [8, 8, 4]
    assert rows.read == []  # handing out a chunk reads nothing
    first = iter(chunks[0])
    next(first), next(first)
    assert rows.read == [0, 1] and loader.state_dict() == {"epoch": 0, "batches_done": 2}


def test_a_resumed_epoch_fills_its_first_chunk_up_to_the_boundary():
    rows = Rows()
    loader = _loader(rows)
    loader.load_state_dict({"epoch": 0, "batches_done": 5})
    chunks = list(loader)
    assert [c.steps for c in chunks] == [3, 8, 4]  # len() - (chunks done, rounded down)
    for chunk in chunks[:2]:
        list(chunk)
    assert rows.read[0] == 5 and loader.state_dict()["batches_done"] == 16


def test_keep_leaves_the_rest_of_a_chunk_unread():
    rows = Rows()
    loader = _loader(rows)
    chunk = next(iter(loader))
    chunk.keep(3)
    assert len(list(chunk)) == 3 and chunk.samples == 3 and len(chunk.step_ends) == 4
    assert loader.state_dict()["batches_done"] == 3


def test_k_is_chosen_where_a_loop_step_can_hold_several_and_refused_elsewhere():
    ddp, horovod = get_engine("ddp"), get_engine("horovod")
    assert steps_per_execution(None, 1, ddp, "cpu", "controlled", 0) == STEPS_PER_EXECUTION
    assert steps_per_execution(None, 1, ddp, "gpu", "device", 0) == STEPS_PER_EXECUTION
    assert steps_per_execution(None, 2, ddp, "cpu", "controlled", 0) == 1
    assert steps_per_execution(None, 1, horovod, "cpu", "controlled", 0) == 1
    assert steps_per_execution(None, 1, ddp, "gpu", "controlled", 0) == 1  # pinned host batches
    assert steps_per_execution(None, 1, ddp, "cpu", "efficient", 1) == 1
    assert steps_per_execution(3, 1, ddp, "cpu", "controlled", 0) == 3
    assert steps_per_execution(1, 2, ddp, "cpu", "controlled", 0) == 1
    with pytest.raises(ConfigError) as refused:
        steps_per_execution(4, 2, ddp, "cpu", "controlled", 2)
    assert "this run has 2 processes, 2 data workers: give 1" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        steps_per_execution(4, 1, ddp, "gpu", "efficient", 0)
    assert "a GPU fed from host memory (--mode efficient)" in str(refused.value)


def _train(home: Path, dataset: Path, k: int, *flags: str) -> dict:
    result = home / f"result-{k}.json"
    done = run_script(["trainup_cpu.py", "--no-progress", "--dataset", str(dataset),
                       "--batch-size", "64", "--hidden", "16", "--steps-per-execution", str(k),
                       "--result-json", str(result), *flags], home, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(result.read_text())


def _rows(result: dict) -> list:
    return (Path(result["run_dir"]) / "csv" / "metrics.csv").read_text().splitlines()


@pytest.mark.slow
def test_k_steps_a_batch_train_log_and_stop_as_one_step_a_batch(shared_home, tmp_path):
    """Weights, losses and every logged row (train_loss at its own steps, validation after
    each epoch) are the same for K = 1, 3 and 8, warm-up included; --max-steps ends inside a
    chunk."""
    dataset = shared_home / "data" / "tiny"
    flags = ("--max-steps", "57", "--warmup-steps", "10", "--scale-lr", "linear",
             "--base-batch-size", "32")
    one, three, eight = (_train(tmp_path / f"k{k}", dataset, k, *flags) for k in (1, 3, 8))
    assert [r["steps_per_execution"] for r in (one, three, eight)] == [1, 3, 8]
    for other in (three, eight):
        assert other["global_step"] == one["global_step"] == 57
        assert other["replica_checksums"] == one["replica_checksums"]
        assert (other["val_loss"], other["test_loss"]) == (one["val_loss"], one["test_loss"])
        assert _rows(other) == _rows(one)
    assert "train_loss" in _rows(eight)[0].split(",")
    assert eight["train_samples_per_s"] > 0 and eight["step_time_cv"][0] > 0
    # Lightning's loop between chunks, measured where it runs once per chunk only.
    assert eight["loop_step_s"] > 0 and one["loop_step_s"] is None


def test_a_multi_rank_prediction_pays_back_the_loop_the_1_rank_row_ran_once_per_chunk():
    from kosmoss.bench.runner import loop_paid_back_s

    assert loop_paid_back_s({"steps_per_execution": 8, "loop_step_s": 0.0004}) == \
        pytest.approx(0.0004 * 7 / 8)
    assert loop_paid_back_s({"steps_per_execution": 1, "loop_step_s": None}) == 0.0
    assert loop_paid_back_s({}) == 0.0


def test_kosmoss_project_starts_from_the_reference_as_if_it_ran_one_step_a_batch():
    from kosmoss.scaling.projection import one_step_a_batch

    # 256 samples in 5 ms a step, with a loop of 0.4 ms run once per 8 steps.
    slower = one_step_a_batch(256 / 0.005, 256, {"steps_per_execution": 8, "loop_step_s": 4e-4})
    assert slower == pytest.approx(256 / (0.005 + 4e-4 * 7 / 8))
    assert one_step_a_batch(1000.0, 10, {"steps_per_execution": 1}) == pytest.approx(1000.0)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(8, 1), (1, 8), (8, 3)])
def test_a_resume_that_changes_k_mid_epoch_ends_on_the_same_weights(shared_home, tmp_path,
                                                                     before, after):
    dataset = shared_home / "data" / "tiny"
    straight = _train(tmp_path / "straight", dataset, 1, "--max-steps", "45")
    home = tmp_path / "home"
    first = _train(home, dataset, before, "--max-steps", "29")  # 3 steps into epoch 2
    resumed = run_script(["trainup_cpu.py", "--no-progress", "--resume", first["run_id"],
                          "--max-steps", "45", "--steps-per-execution", str(after)], home,
                         timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((Path(first["run_dir"]) / "result.json").read_text())
    assert (result["trained_from_step"], result["global_step"]) == (29, 45)
    assert result["replica_checksums"] == straight["replica_checksums"]


def test_a_k_the_run_cannot_take_is_one_line(shared_home, kosmoss_home):
    dataset = str(shared_home / "data" / "tiny")
    for flags, said in ((["--num-processes", "2", "--steps-per-execution", "4"],
                         "--steps-per-execution 4: several steps per batch need one process "
                         "of the ddp engine"),
                        (["--steps-per-execution", "0"], "--steps-per-execution 0")):
        done = run_script(["trainup_cpu.py", "--dataset", dataset, *flags],
                          kosmoss_home, timeout=120)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_run_stopped_by_max_steps_and_trained_past_its_epoch_ends_on_the_same_weights(
        shared_home, tmp_path):
    """Lightning closes the epoch where --max-steps stops it; the resumed run finishes that
    epoch's batches and goes on with the next epoch's own shuffle, not the one after."""
    dataset = shared_home / "data" / "tiny"
    straight = _train(tmp_path / "straight", dataset, 8, "--max-steps", "60")
    home = tmp_path / "home"
    first = _train(home, dataset, 8, "--max-steps", "30")
    resumed = run_script(["trainup_cpu.py", "--no-progress", "--resume", first["run_id"],
                          "--max-steps", "60"], home, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((Path(first["run_dir"]) / "result.json").read_text())
    assert (result["epochs"], result["global_step"]) == (straight["epochs"], 60)
    assert result["replica_checksums"] == straight["replica_checksums"]
