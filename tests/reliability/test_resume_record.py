"""A resume takes the run's settings from its record, refuses a flag that contradicts them
(one line naming both values), never touches a finished run unless asked to train further,
names a readable checkpoint when the newest one is corrupt, and appends to the run's
metrics and validation curve."""
import hashlib
import json
from pathlib import Path

import pytest
from helpers import run_script

from kosmoss.core.errors import ConfigError
from kosmoss.run import RunConfig
from kosmoss.run.flags import in_flag_terms


def _run(home, *args):
    return run_script(["trainup_cpu.py", "--no-progress", *args], home, timeout=300)


def _snapshot(folder: Path):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(home, monkeypatch, expected, **flags):
    """What ``trainup_cpu.py --resume ...`` says (in this process: the same prepare())."""
    from kosmoss.run.plan import prepare

    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    with pytest.raises(ConfigError) as refused:
        prepare(RunConfig(**flags, given=frozenset(flags)))
    message = in_flag_terms(refused.value)
    assert expected in message, message
    return message


@pytest.mark.slow
def test_a_finished_run_is_continued_only_when_asked_and_keeps_its_history(
        shared_home, tmp_path, monkeypatch):
    home = tmp_path / "home"
    first = _run(home, "--dataset", str(shared_home / "data" / "tiny"), "--batch-size", "64",
                 "--hidden", "16", "--max-steps", "30")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = next((home / "runs").iterdir())
    run_id, before = run_dir.name, _snapshot(run_dir)
    metrics_before = (run_dir / "csv" / "metrics.csv").read_text().splitlines()

    _refused(home, monkeypatch, f"--hidden 50 contradicts the resumed run's --hidden 16 (run "
             f"{run_id})", resume=run_id, hidden=(50,))
    # Left unset, the run scaled from its per-device batch: the value a resume keeps.
    _refused(home, monkeypatch, "--base-batch-size 32 contradicts the resumed run's "
             f"--base-batch-size 64 (run {run_id})", resume=run_id, base_batch_size=32)
    _refused(home, monkeypatch, "the run finished; to train it further give a larger "
             "--max-epochs or --max-steps", resume=run_id)
    assert _snapshot(run_dir) == before  # run.json still finished, metrics.csv intact

    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a torn write
    best = next((run_dir / "checkpoints").glob("epoch=*.ckpt"))
    _refused(home, monkeypatch, "checkpoints/last.ckpt cannot be read (", resume=run_id,
             max_steps=60)
    _refused(home, monkeypatch, f"resume from an older checkpoint with --resume {best}",
             resume=run_id, max_steps=60)

    resumed = _run(home, "--resume", str(best), "--max-steps", "60")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: --max-steps 60 (the stopped run had 30)" in resumed.stdout
    result = json.loads((run_dir / "result.json").read_text())
    stop = result["resumed_from_step"]
    assert result["trained_from_step"] == stop  # the trainer began there, not at step 0
    assert (result["global_step"], result["world_size"], result["config"]["hidden"],
            result["config"]["batch_size"]) == (60, 1, [16], 64)  # from the record
    steps = [point["step"] for point in result["val_curve"]]
    assert steps[0] <= stop < steps[1] and steps == sorted(steps) and steps[-1] == 60
    # The rows logged before the checkpoint stay; those after it are logged again, once.
    metrics = (run_dir / "csv" / "metrics.csv").read_text().splitlines()
    kept = [row for row in metrics_before[1:] if int(row.split(",")[1]) < stop]
    assert metrics[1:len(kept) + 1] == kept and len(metrics) > len(metrics_before)
    rows = [tuple(row.split(",")[1:]) for row in metrics[1:]]
    steps = [int(r[0]) for r in rows]
    assert len(set(rows)) == len(rows) and steps == sorted(steps)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "finished" and record["attempts"][-1]["state"] == "finished"


@pytest.mark.slow
def test_a_finished_run_trained_further_goes_on_from_its_last_step(shared_home, tmp_path):
    """``--max-steps 30`` ends mid-epoch (26 steps an epoch), after the last validation:
    trained further to 40 steps, the run starts at step 30, not at that validation, and ends
    with the weights of a run given 40 steps from the start."""
    flags = ("--dataset", str(shared_home / "data" / "tiny"), "--batch-size", "64",
             "--hidden", "16")
    straight_home, home = tmp_path / "straight", tmp_path / "home"
    straight = _run(straight_home, *flags, "--max-steps", "40")
    first = _run(home, *flags, "--max-steps", "30")
    assert straight.returncode == 0 and first.returncode == 0, first.stderr[-3000:]
    run_dir = next((home / "runs").iterdir())
    resumed = _run(home, "--resume", run_dir.name, "--max-steps", "40")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    reference = json.loads((next((straight_home / "runs").iterdir()) / "result.json").read_text())
    assert (result["resumed_from_step"], result["trained_from_step"], result["global_step"]) \
        == (30, 30, 40)
    assert result["replica_checksums"] == reference["replica_checksums"]


@pytest.mark.slow
def test_resuming_a_run_that_still_runs_is_one_line_and_touches_nothing(shared_home, tmp_path):
    from fault_helpers import end_all, run_dir, start, wait_for

    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--hidden", "16")
    try:
        # After the first validation (26 steps an epoch) there is a last.ckpt to resume from.
        wait_for(lambda: run_dir(home) and (run_dir(home) / "checkpoints" / "last.ckpt").is_file(),
                 "the first last.ckpt")
        folder = run_dir(home)
        record = json.loads((folder / "run.json").read_text())
        refused = _run(home, "--resume", folder.name)
        assert refused.returncode == 2, refused.stderr[-3000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and f"the run is still running (launcher pid {launcher.pid})" \
            in lines[0], refused.stderr[-3000:]
        after = json.loads((folder / "run.json").read_text())
        assert (after["state"], len(after["attempts"])) == ("running", len(record["attempts"]))
        assert launcher.poll() is None  # the run trains on
    finally:
        end_all(home, launcher)


def test_a_bare_resume_keeps_every_recorded_flag_and_run_json_its_config(shared_home, tmp_path,
                                                                          monkeypatch):
    """--steps-per-execution 1, --no-progress, --result-json, --max-steps... come back."""
    import signal

    from stops import SignalAt, run_in_process

    home, out = tmp_path / "home", tmp_path / "result.json"
    flags = dict(dataset=str(shared_home / "data" / "tiny"), batch_size=64, hidden=(16,),
                 max_steps=40, steps_per_execution=1, result_json=out, num_workers=0)
    stopped = run_in_process(home, monkeypatch, stop=SignalAt(10, signal.SIGTERM), **flags)
    run_dir = Path(stopped["run_dir"])
    recorded = json.loads((run_dir / "run.json").read_text())["config"]
    resumed = run_in_process(home, monkeypatch, resume=stopped["run_id"])
    assert (resumed["steps_per_execution"], resumed["global_step"]) == (1, 40)
    assert json.loads(out.read_text())["run_id"] == stopped["run_id"]  # --result-json kept
    config = json.loads((run_dir / "run.json").read_text())["config"]
    assert config is not None
    # The batch the rate is scaled from, left unset, is written out: the per-device batch.
    assert (recorded["base_batch_size"], config["base_batch_size"]) == (None, 64)
    assert {k: v for k, v in config.items() if k not in ("resume", "base_batch_size")} == \
        {k: v for k, v in recorded.items() if k not in ("resume", "base_batch_size")}


def test_a_failed_checkpoint_write_advises_a_resume_that_works(shared_home, tmp_path,
                                                                monkeypatch):
    """last.ckpt fails on a full disk after epoch=0-step=26.ckpt was written: the one line
    advises --resume RUN, and that resumes from the newest checkpoint of any kind."""
    import errno

    from stops import run_in_process

    from kosmoss.core.errors import RunFailed
    from kosmoss.run import faults

    write = faults._save_to

    def full_for_last(checkpoint, handle):  # the disk fills up as last.ckpt is written
        if Path(handle.name).name.startswith(".last.ckpt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(checkpoint, handle)

    home = tmp_path / "home"
    monkeypatch.setattr(faults, "_save_to", full_for_last)
    with pytest.raises(RunFailed) as failed:
        run_in_process(home, monkeypatch, dataset=str(shared_home / "data" / "tiny"),
                       batch_size=64, hidden=(16,), max_steps=40)
    monkeypatch.setattr(faults, "_save_to", write)
    (run_dir,) = (home / "runs").iterdir()
    assert "could not be written (No space left on device)" in str(failed.value)
    assert f"then resume with --resume {run_dir.name}" in str(failed.value)
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["epoch=0-step=26.ckpt"]
    resumed = run_in_process(home, monkeypatch, resume=run_dir.name)
    assert (resumed["resumed_from_step"], resumed["global_step"]) == (26, 40)


def test_a_resume_on_a_dataset_prepared_again_with_other_data_is_refused(tmp_path,
                                                                        monkeypatch):
    """The folder's name is the run's, its data is not (prepared again with another seed,
    --force): the resumed run trained on the new data with the old normalisation, without
    a word. Its checkpoint's normalisation tells; the same data prepared again resumes."""
    from stops import run_in_process

    from kosmoss.data.sources import SyntheticSource
    from kosmoss.data.store import prepare as prepare_data

    folder = tmp_path / "data"
    prepare_data(SyntheticSource(600, seed=1), folder, shard_size=256)
    flags = dict(dataset=str(folder), batch_size=64, hidden=(8,), max_epochs=3)
    result = run_in_process(tmp_path / "home", monkeypatch, max_steps=3, **flags)
    prepare_data(SyntheticSource(600, seed=2), folder, shard_size=256, force=True)
    before = _snapshot(Path(result["run_dir"]))
    _refused(tmp_path / "home", monkeypatch,
             f"--dataset {folder}: it holds other data than run {result['run_id']} was "
             "trained on (its x_mean differs from the checkpoint's); resume with that data, "
             "or start a new run", resume=result["run_id"], max_steps=6)
    assert _snapshot(Path(result["run_dir"])) == before  # refused before anything is written
    prepare_data(SyntheticSource(600, seed=1), folder, shard_size=256, force=True)
    again = run_in_process(tmp_path / "home", monkeypatch, resume=result["run_id"], max_steps=6)
    assert again["global_step"] == 6 and again["resumed_from_step"] == 3


@pytest.mark.parametrize("result", ["[1, 2]", "null", '"done"', "{broken"])
def test_a_damaged_result_leaves_the_settings_unknown_not_a_traceback(tmp_path, result):
    """No run.json (a run recorded before it kept the settings), result.json no object: no
    stored settings (the checkpoint's model and the typed flags decide), not an
    AttributeError."""
    from kosmoss.run.resume import _stored_run

    (tmp_path / "result.json").write_text(result)
    assert _stored_run(tmp_path, "R")["config"] is None


@pytest.mark.parametrize("damage", ["{broken", "[1, 2]", "null", "fifo", "folder"])
def test_a_finished_run_whose_run_json_is_damaged_is_refused_and_kept(tmp_path, monkeypatch,
                                                                      damage):
    """run.json says whether the run finished. Unreadable, it was taken for absent: the
    resume trained the finished run for no step and wrote its result.json over the real one
    ("too few steps to time" instead of its samples/s)."""
    import os

    from stops import run_in_process

    from kosmoss.data.sources import SyntheticSource
    from kosmoss.data.store import prepare as prepare_data

    folder = tmp_path / "data"
    prepare_data(SyntheticSource(600, seed=1), folder, shard_size=256)
    flags = dict(dataset=str(folder), batch_size=64, hidden=(8,), max_epochs=1)
    result = run_in_process(tmp_path / "home", monkeypatch, **flags)
    run_file = Path(result["run_dir"]) / "run.json"
    run_file.unlink()
    if damage == "fifo":
        os.mkfifo(run_file)
    elif damage == "folder":
        run_file.mkdir()
    else:
        run_file.write_text(damage)
    before = _snapshot(Path(result["run_dir"]))
    _refused(tmp_path / "home", monkeypatch, f"--resume {result['run_id']}: its {run_file} "
             "cannot be read (", resume=result["run_id"], **flags)
    assert _snapshot(Path(result["run_dir"])) == before

# A run stopped at step 26 + 6 of tiny at batch 64 (26 batches an epoch): 1 epoch done and
# part of the next. Limits below it, or the epoch it is inside of, are past it.
PAST = [(dict(max_steps=30), "--max-steps 30: run {run} is past it, its checkpoint at step 32 "
         "with 1 epoch(s) done and part of the next; give a larger --max-steps, or drop it to "
         "keep the run's no limit"),
        (dict(max_steps=31), "--max-steps 31: run {run} is past it"),
        (dict(max_epochs=1), "--max-epochs 1: run {run} is past it, its checkpoint at step 32 "
         "with 1 epoch(s) done and part of the next; give a larger --max-epochs, or drop it "
         "to keep the run's 100"),
        (dict(max_epochs=0), "--max-epochs 0")]


def test_a_resume_limit_the_run_is_past_is_refused_and_the_record_kept(shared_home, tmp_path,
                                                                        monkeypatch):
    """Lightning raised a MisconfigurationException for --max-epochs below the checkpoint's
    epoch after the record had taken it (so every bare resume raised too), and ended the
    stopped run at once, finished, for --max-steps below its step."""
    import signal

    from stops import SignalAt, run_in_process

    home = tmp_path / "home"
    flags = dict(dataset=str(shared_home / "data" / "tiny"), batch_size=64, hidden=(16,),
                 max_epochs=100, num_workers=0, steps_per_execution=1)
    stopped = run_in_process(home, monkeypatch, stop=SignalAt(26 + 5, signal.SIGTERM), **flags)
    assert stopped["global_step"] == 32
    run_dir, before = Path(stopped["run_dir"]), _snapshot(Path(stopped["run_dir"]))
    for limit, said in PAST:
        _refused(home, monkeypatch, said.format(run=stopped["run_id"]),
                 resume=stopped["run_id"], **limit)
    refused = _run(home, "--resume", stopped["run_id"], "--max-epochs", "1")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--max-epochs 1: run" in refused.stderr
    assert _snapshot(run_dir) == before  # nothing of the run touched
    resumed = run_in_process(home, monkeypatch, resume=stopped["run_id"], max_steps=33)
    assert (resumed["resumed_from_step"], resumed["global_step"]) == (32, 33)
    # Stopped on an epoch's last batch: a limit of the epochs done is no refusal; it finishes.
    at_end = run_in_process(tmp_path / "end", monkeypatch,
                            stop=SignalAt(2 * 26 - 1, signal.SIGTERM), **flags)
    assert at_end["global_step"] == 2 * 26
    finished = run_in_process(tmp_path / "end", monkeypatch, resume=at_end["run_id"], max_epochs=2)
    assert (finished["global_step"], finished["stopped_by"]) == (2 * 26, None)


def test_an_override_of_a_flag_the_run_left_unset_says_it_had_the_default():
    from kosmoss.run.resume import merge

    config = RunConfig(num_processes=2, max_steps=80, given=frozenset({"num_processes",
                                                                     "max_steps"}))
    merged, notes = merge(config, {"num_processes": None, "max_steps": 40}, "20261203-000000-abc")
    assert (merged.num_processes, merged.max_steps) == (2, 80)
    assert notes == ("resume: --max-steps 80 (the stopped run had 40)",
                     "resume: --num-processes 2 (the stopped run had the default)")


# A value unlike the default for each field a resume takes from the record.
RECORDED = dict(batch_size=64, lr=0.01, scale_lr="linear", base_batch_size=32, warmup_steps=5,
                dataset="tiny", seed=7, hidden=(16,), precision="bf16-mixed", max_epochs=3,
                max_steps=40, val_every_n_epochs=2, mode="controlled", num_workers=1,
                collective_timeout_s=30.0, gpu_ids=(1,), num_processes=1, num_nodes=2,
                strategy="horovod", steps_per_execution=1, progress=False,
                result_json="/tmp/r.json", require_gpu=True, compile=True, cuda_graphs=True,
                hosts="netns", link_rate="1gbit")


def test_every_setting_of_a_run_is_kept_by_a_bare_resume_or_decided_again():
    """A field added to RunConfig is sorted here: --compile, --hosts and --link-rate were
    left out of the list, so a bare resume of a compiled run trained eagerly (its weights
    then off the straight run's by a float32 rounding) and one on netns hosts on loopback."""
    from dataclasses import fields

    from kosmoss.run.resume import CARRIED, DECIDED_AGAIN, FIXED, merge

    names = {f.name for f in fields(RunConfig)}
    assert set(FIXED + CARRIED + DECIDED_AGAIN) == names and set(RECORDED) == set(FIXED + CARRIED)
    merged, notes = merge(RunConfig(given=frozenset()), RECORDED, "20261207-000000-abc")
    kept = {name: getattr(merged, name) for name in RECORDED}
    assert kept == {**RECORDED, "result_json": Path("/tmp/r.json")} and notes == ()
    assert all(RECORDED[name] != getattr(RunConfig(), name) for name in RECORDED)


def test_no_compile_drops_the_compile_of_the_resumed_run_and_says_so():
    import argparse

    from kosmoss.devices.policy import MachineGpu
    from kosmoss.run.flags import add_gpu_flags, add_run_flags, config_from_args
    from kosmoss.run.resume import merge

    parser = argparse.ArgumentParser()  # trainup_gpu.py's flags
    add_run_flags(parser, processes=False)
    add_gpu_flags(parser)
    typed = config_from_args(parser.parse_args(["--resume", "x", "--no-compile"]),
                             machine=MachineGpu.from_environment("none"), use_gpu=False)
    merged, notes = merge(typed, {"compile": True, "cuda_graphs": True}, "20261207-000000-abc")
    assert (merged.compile, merged.cuda_graphs) == (False, True)
    assert notes == ("resume: --compile False (the stopped run had True)",)


def test_a_resume_on_another_world_size_trains_on_at_the_stopped_runs_rate(
        shared_home, tmp_path, monkeypatch):
    """--scale-lr scales from the per-device batch when --base-batch-size is not given: a
    resume on 2 processes of a run stopped on 1 printed twice the rate and kept it in the
    checkpoint's hyper-parameters, while the optimizer state restored trained on at the old
    one. The base is now the stopped run's, written out: one rate, printed and trained."""
    import signal

    import torch
    from stops import SignalAt, run_in_process

    home = tmp_path / "home"
    flags = dict(dataset=str(shared_home / "data" / "tiny"), batch_size=64, hidden=(16,),
                 scale_lr="linear", lr=0.001, max_epochs=2, num_workers=0)
    stopped = run_in_process(home, monkeypatch, stop=SignalAt(5, signal.SIGTERM), **flags)
    assert stopped["stopped_by"] == "SIGTERM"
    # A world the kept batch does not divide: the world size is what to change.
    _refused(home, monkeypatch, "--num-processes: a world of 3 processes cannot share the "
             "resumed run's --batch-size 64 evenly (a resume keeps it): resume on a world size "
             "that divides 64, e.g. 2 or 4", resume=stopped["run_id"], num_processes=3)
    resumed = _run(home, "--resume", stopped["run_id"], "--num-processes", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "learning rate   = 0.001 (base, tuned for batch 64) x 1 (linear) = 0.001" in \
        resumed.stdout, resumed.stdout
    last = torch.load(Path(stopped["run_dir"]) / "checkpoints" / "last.ckpt",
                      map_location="cpu", weights_only=False)
    trained = {group["lr"] for group in last["optimizer_states"][0]["param_groups"]}
    assert trained == {last["hyper_parameters"]["lr"]} == {0.001}
    record = json.loads((Path(stopped["run_dir"]) / "run.json").read_text())
    assert (record["world_size"], record["config"]["base_batch_size"]) == (2, 64)


def test_a_resume_under_a_launcher_leaves_the_placement_to_it(monkeypatch):
    """A run started with --num-nodes 2 --hosts netns and resumed under torchrun was refused:
    "--num-nodes 2 contradicts torchrun's --nnodes 1", a flag the user had not typed."""
    from kosmoss.run.plan import _placed_by_the_launcher

    stopped = dict(num_processes=2, num_nodes=2, hosts="netns", link_rate="1gbit", max_epochs=9)
    bare = RunConfig(**stopped, given=frozenset({"max_epochs"}))
    for variable in ("TORCHELASTIC_RUN_ID", "HOROVOD_RANK"):
        monkeypatch.delenv(variable, raising=False)
    assert _placed_by_the_launcher(bare) == (bare, ())  # no launcher: the run's own
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # what torchrun sets, Lightning reads
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(name, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.get(name, "0"))
    placed, notes = _placed_by_the_launcher(bare)
    assert (placed.num_processes, placed.num_nodes, placed.hosts, placed.link_rate,
            placed.max_epochs) == (None, None, "loopback", None, 9)
    assert notes == tuple(f"resume: torchrun places the ranks: the stopped run's {flag} is left "
                          "to it" for flag in ("--num-processes 2", "--num-nodes 2",
                                               "--hosts netns", "--link-rate 1gbit"))
    typed = RunConfig(**stopped, given=frozenset({"num_nodes"}))  # typed: torchrun's check says
    assert _placed_by_the_launcher(typed)[0].num_nodes == 2


def test_leaving_the_hosts_on_resume_leaves_their_link_rate():
    """--resume R --hosts loopback of a netns run was refused: "--link-rate 1gbit: only with
    --hosts netns", a rate carried from the record, not typed."""
    from kosmoss.run.resume import merge

    stored = {"hosts": "netns", "link_rate": "1gbit", "num_nodes": 2}
    merged, notes = merge(RunConfig(hosts="loopback", given=frozenset({"hosts"})), stored,
                          "20261207-000000-abc")
    assert (merged.hosts, merged.link_rate, merged.num_nodes) == ("loopback", None, 2)
    assert notes[-1] == "resume: --link-rate 1gbit dropped with --hosts loopback (no link to shape)"
    kept, _ = merge(RunConfig(given=frozenset()), stored, "20261207-000000-abc")
    assert (kept.hosts, kept.link_rate) == ("netns", "1gbit")


def test_a_dataset_that_moved_resumes_from_its_new_folder_once_checked(tmp_path, monkeypatch):
    """Data staged elsewhere (a job's scratch folder, a moved home): the bare resume said
    "no such dataset folder", and --dataset NEW was refused as contradicting the run's
    --dataset. The new folder is taken when it holds the data the checkpoint trained on."""
    import shutil

    from stops import run_in_process

    from kosmoss.data.sources import SyntheticSource
    from kosmoss.data.store import prepare as prepare_data

    home, first, moved, other = (tmp_path / name for name in ("home", "a", "b", "other"))
    prepare_data(SyntheticSource(600, seed=1), first, shard_size=256)
    prepare_data(SyntheticSource(600, seed=2), other, shard_size=256)
    flags = dict(dataset=str(first), batch_size=64, hidden=(8,), max_epochs=3)
    result = run_in_process(home, monkeypatch, max_steps=3, **flags)
    shutil.move(first, moved)
    _refused(home, monkeypatch, f"the resumed run's --dataset {first}: no such dataset folder",
             resume=result["run_id"], max_steps=6)
    message = _refused(home, monkeypatch, "it holds other data than run",
                       resume=result["run_id"], max_steps=6, dataset=str(other))
    assert message.startswith(f"--dataset {other}: ")
    again = run_in_process(home, monkeypatch, resume=result["run_id"], max_steps=6,
                           dataset=str(moved))
    assert (again["global_step"], again["resumed_from_step"]) == (6, 3)
    recorded = json.loads((Path(result["run_dir"]) / "run.json").read_text())["config"]
    assert recorded["dataset"] == str(moved)  # the next resume finds it there
    import torch  # a checkpoint without the normalisation cannot tell: the folder stays fixed

    for checkpoint in (Path(result["run_dir"]) / "checkpoints").glob("*.ckpt"):
        content = torch.load(checkpoint, map_location="cpu", weights_only=False)
        for name in ("x_mean", "x_std", "y_mean", "y_std"):
            content["state_dict"].pop(name)
        torch.save(content, checkpoint)
    shutil.move(moved, first)
    _refused(home, monkeypatch, f"--dataset {first}: the checkpoint of run {result['run_id']} "
             f"keeps no normalisation to check other data against; resume with --dataset "
             f"{moved}", resume=result["run_id"], max_steps=9, dataset=str(first))
