"""``kosmoss data`` as a user runs it."""
import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from helpers import REPO, run_script

from kosmoss.commands import data
from kosmoss.core.errors import UsageError
from kosmoss.data import presets
from kosmoss.data.stats import Statistics
from kosmoss.data.catalog import DEFAULT_SHARD_SIZE
from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare, sha256_of


def test_prepare_then_info(tmp_path):
    home = tmp_path / "home"
    proc = run_script(["-m", "kosmoss", "data", "prepare", "--columns", "300", "--levels", "6",
                       "--shard-size", "128", "--name", "mini"], home)
    assert proc.returncode == 0, proc.stderr
    assert "300 columns" in proc.stdout
    info = run_script(["-m", "kosmoss", "data", "info", "--json"], home)
    (item,) = json.loads(info.stdout)
    assert (item["name"], item["n_samples"], item["levels"], item["shards"]) == ("mini", 300, 6, 3)
    one = run_script(["-m", "kosmoss", "data", "info", "mini", "--verify", "--json"], home)
    assert json.loads(one.stdout)[0]["n_x"] == 17 + 6 * 27 + 7 * 2 + 5


SMALL = ["--columns", "64", "--levels", "3", "--shard-size", "32"]


@pytest.fixture
def data_cli(kosmoss_home, capsys):
    """``kosmoss data ARGS`` in this process (``python -m kosmoss`` imports torch first,
    seconds on a loaded machine; test_prepare_then_info runs that path):
    (exit code, stdout lines, stderr lines)."""

    def run(*args):
        try:
            code = data.main(list(args))
        except SystemExit as exit:  # argparse's errors
            code = exit.code
        out, err = capsys.readouterr()
        return code, out.strip().splitlines(), err.strip().splitlines()

    return run


@pytest.fixture
def tiny_preset(monkeypatch):
    monkeypatch.setitem(presets.PRESETS, "tiny", presets.Preset("tiny", 64, 32, "test", levels=3))


def test_info_lists_a_broken_dataset_without_failing(data_cli, kosmoss_home):
    (kosmoss_home / "data" / "broken").mkdir(parents=True)
    code, out, _ = data_cli("info", "--json")
    assert code == 0
    assert "metadata.json" in json.loads("\n".join(out))[0]["error"]


def test_bad_inputs_are_one_line_exit_2(data_cli, kosmoss_home):
    for args, names in [(["prepare", "--columns", "0"], "--columns 0"),
                        (["prepare", "huge"], "unknown preset 'huge'"),
                        (["info", "nope"], "dataset nope"),
                        (["prepare", "--source", "web"], "--source")]:
        code, _, err = data_cli(*args)
        assert code == 2 and len(err) == 1 and names in err[0], err
    assert not kosmoss_home.exists()


def test_existing_folder_is_not_overwritten(data_cli, kosmoss_home):
    mine = kosmoss_home / "data" / "tiny"
    mine.mkdir(parents=True)
    (mine / "thesis.txt").write_text("precious")
    code, _, err = data_cli("prepare", "tiny")
    assert code == 2 and len(err) == 1 and "not a kosmoss dataset" in err[0]
    assert "--force" not in err[0]  # --force would not replace it either
    assert (mine / "thesis.txt").read_text() == "precious"


def test_maelstrom_without_the_extra_names_the_install(data_cli, kosmoss_home):
    if find_spec("climetlab"):
        pytest.skip("climetlab is installed: the real download would start")
    code, _, err = data_cli("prepare", "--source", "maelstrom")
    assert code == 2 and len(err) == 1, err
    assert "--source maelstrom" in err[0] and "kosmoss[maelstrom]" in err[0]
    assert not (kosmoss_home / "data").exists() or not any((kosmoss_home / "data").iterdir())


# ------------------------------------------------ requests, names, --force


def _metadata(folder):
    return json.loads((folder / "metadata.json").read_text())


def test_default_names_spell_out_the_request(data_cli, kosmoss_home):
    # Once: --seed 1 then --seed 2 printed the same folder, holding seed 1.
    code, first, _ = data_cli("prepare", *SMALL, "--seed", "1")
    assert code == 0
    code, second, _ = data_cli("prepare", *SMALL, "--seed", "2")
    assert code == 0
    one = kosmoss_home / "data" / "synthetic-64col-3lev-seed1-shard32"
    two = kosmoss_home / "data" / "synthetic-64col-3lev-seed2-shard32"
    assert first[0].startswith(f"{one}: 64 columns") and second[0].startswith(f"{two}: 64 ")
    assert (_metadata(one)["seed"], _metadata(two)["seed"]) == (1, 2)
    code, again, err = data_cli("prepare", *SMALL, "--seed", "2")
    assert code == 0 and err == [] and len(again) == 1
    assert again[0].startswith(f"{two}: reused, already prepared from this request")


def test_a_name_given_twice_with_another_request_is_refused(data_cli, kosmoss_home):
    assert data_cli("prepare", *SMALL, "--seed", "1", "--name", "mine")[0] == 0
    code, out, err = data_cli("prepare", *SMALL, "--seed", "2", "--name", "mine")
    assert code == 2 and out == [] and len(err) == 1
    assert "mine: holds another dataset: seed 1 (asked 2)" in err[0]
    assert _metadata(kosmoss_home / "data" / "mine")["seed"] == 1


def test_a_preset_folder_holding_something_else_is_named(data_cli, tiny_preset, kosmoss_home):
    code, _, err = data_cli("prepare", "tiny", "--seed", "3")
    assert code == 0 and (kosmoss_home / "data" / "tiny-seed3").is_dir()
    folder = kosmoss_home / "data" / "tiny"
    # What an older kosmoss could leave there; the command itself refuses to (below).
    prepare(SyntheticSource(64, levels=3), folder, shard_size=DEFAULT_SHARD_SIZE)
    code, _, err = data_cli("prepare", "tiny")
    assert code == 2 and len(err) == 1 and "shard_size 4096 (asked 32)" in err[0]
    with pytest.raises(UsageError, match=r"^--dataset tiny: .* holds another dataset than the "
                                         r"preset tiny: shard_size 4096 \(asked 32\); replace it: "
                                         r"`kosmoss data prepare tiny --force`$"):
        presets.resolve("tiny")
    assert data_cli("prepare", "tiny", "--force")[0] == 0
    assert presets.resolve("tiny").path == folder and _metadata(folder)["shard_size"] == 32


@pytest.mark.parametrize("where", [["--name", "tiny"], ["--name", "small"], ["--out", "tiny"]])
def test_a_presets_folder_takes_that_preset_only(data_cli, tiny_preset, kosmoss_home, where):
    """`--name tiny` on another request would shadow the preset that `--dataset tiny`
    reads: refused before anything is written, the preset itself still accepted there."""
    if where[0] == "--out":
        where = ["--out", str(kosmoss_home / "data" / "tiny")]
    code, _, err = data_cli("prepare", *SMALL, "--seed", "5", *where)
    preset = Path(where[1]).name
    assert code == 2 and len(err) == 1, err
    assert f"the folder of the preset {preset}, which this request is not" in err[0]
    assert f"`kosmoss data prepare {preset}`" in err[0]
    assert not (kosmoss_home / "data").exists()
    if preset == "tiny":  # the preset itself goes there
        assert data_cli("prepare", "tiny", *where)[0] == 0
        assert presets.resolve("tiny").n_samples == 64


def test_force_never_deletes_a_folder_that_is_not_a_dataset(data_cli, tiny_preset, tmp_path):
    mine = tmp_path / "d"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    code, _, err = data_cli("prepare", "tiny", "--out", str(mine))
    assert code == 2 and len(err) == 1 and "not a kosmoss dataset" in err[0]
    assert "--force" not in err[0]
    code, _, err = data_cli("prepare", "tiny", "--out", str(mine), "--force")
    assert code == 2 and len(err) == 1 and "--force does not replace it; nothing deleted" in err[0]
    assert (mine / "thesis.txt").read_text() == "precious" and len(list(mine.iterdir())) == 1


@pytest.mark.parametrize("name", ["../../x", "../x", "/tmp/x", "a/b", "..", ".hidden", "a..b"])
def test_names_cannot_leave_the_data_folder(data_cli, kosmoss_home, tmp_path, name):
    code, _, err = data_cli("prepare", *SMALL, "--name", name)
    assert code == 2 and len(err) == 1 and f"--name {name}: a dataset name is one folder" in err[0]
    assert list(tmp_path.iterdir()) == []  # neither the home nor ../../x was created


def test_flags_that_do_not_apply_are_refused(data_cli, kosmoss_home):
    for args, names in [(["--columns", "64", "--date", "20200102"], "--date: only with --source"),
                        (["tiny", "--columns", "64"], "--columns and preset 'tiny'"),
                        (["--source", "maelstrom", "--seed", "3"], "--seed: synthetic data only"),
                        (["--source", "maelstrom", "--date", "2020/01/01"], "--date 2020/01/01"),
                        (["--name", "a", "--out", "b"], "--name a and --out b")]:
        code, _, err = data_cli("prepare", *args)
        assert code == 2 and len(err) == 1 and names in err[0], err
    assert not kosmoss_home.exists()


def test_maelstrom_names_carry_date_timestep_and_patches(monkeypatch):
    monkeypatch.setattr(data, "find_spec", lambda name: True)  # no climetlab needed to name it
    parser = argparse.ArgumentParser()
    data.add_arguments(parser)
    names = {data._request(parser.parse_args(["prepare", "--source", "maelstrom", *extra]))[1]
             for extra in ([], ["--patch", "2"], ["--patch", "0", "2"], ["--timestep", "3"],
                           ["--date", "20200102"], ["--shard-size", "100"])}
    assert names == {"maelstrom-20200101-t0-p0", "maelstrom-20200101-t0-p2",
                     "maelstrom-20200101-t0-p0-2", "maelstrom-20200101-t3-p0",
                     "maelstrom-20200102-t0-p0", "maelstrom-20200101-t0-p0-shard100"}


# ------------------------------------------------ advice that works, stats that fit


def _corrupt_first_shard(folder):
    shard = folder / "x_00000.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))


def _advice(line):
    command = shlex.split(line.split("`")[1])
    assert command[:3] == ["kosmoss", "data", "prepare"], line
    return command[2:]


@pytest.mark.parametrize("prepared, name, expected", [
    (["tiny"], "tiny", "`kosmoss data prepare tiny --force`"),
    ([*SMALL, "--seed", "5", "--name", "mini"], "mini",
     "`kosmoss data prepare --columns 64 --levels 3 --seed 5 --shard-size 32 --name mini --force`"),
])
def test_the_advice_after_a_checksum_error_fixes_it(data_cli, tiny_preset, kosmoss_home,
                                                     prepared, name, expected):
    # Once: the advised `kosmoss data prepare tiny` exited 0 and changed nothing.
    assert data_cli("prepare", *prepared)[0] == 0
    _corrupt_first_shard(kosmoss_home / "data" / name)
    code, _, err = data_cli("info", name, "--verify")
    assert code == 2 and len(err) == 1 and "x_00000.npy: checksum does not match" in err[0]
    assert err[0].endswith(f"prepare it again: {expected}")
    code, out, _ = data_cli(*_advice(err[0]))
    assert code == 0 and "reused" not in out[0]
    assert data_cli("info", name, "--verify", "--json")[0] == 0


def test_advice_for_another_dataset_in_a_presets_folder_puts_the_preset_back(
        data_cli, tiny_preset, kosmoss_home):
    """What an older kosmoss let `--name tiny` write: the command that fixes it is the
    preset's own, since a `--name tiny` line would now be refused."""
    folder = kosmoss_home / "data" / "tiny"
    prepare(SyntheticSource(48, seed=9, levels=3), folder, shard_size=16)
    _corrupt_first_shard(folder)
    code, _, err = data_cli("info", "tiny", "--verify")
    assert code == 2 and err[0].endswith("prepare it again: `kosmoss data prepare tiny --force`")
    assert data_cli(*_advice(err[0]))[0] == 0
    assert presets.resolve("tiny").n_samples == 64


def test_advice_for_a_dataset_outside_the_home_names_its_folder(data_cli, tmp_path):
    out = tmp_path / "elsewhere"
    assert data_cli("prepare", *SMALL, "--out", str(out))[0] == 0
    (out / "stats.npz").unlink()
    code, _, err = data_cli("info", str(out))
    assert code == 2 and len(err) == 1 and "stats.npz: missing" in err[0]
    assert data_cli(*_advice(err[0]))[0] == 0 and data_cli("info", str(out), "--verify")[0] == 0


def test_statistics_that_do_not_fit_the_data_fail_verify_and_training(data_cli, kosmoss_home):
    assert data_cli("prepare", *SMALL, "--name", "mini")[0] == 0
    folder = kosmoss_home / "data" / "mini"
    stats = Statistics.load(folder / "stats.npz")
    fewer = Statistics(stats.x_mean, stats.x_std, stats.y_mean[:5], stats.y_std[:5])
    fewer.save(folder / "stats.npz")
    metadata = _metadata(folder)
    metadata["stats"]["sha256"] = sha256_of(folder / "stats.npz")
    (folder / "metadata.json").write_text(json.dumps(metadata))
    code, _, err = data_cli("info", "mini", "--verify")
    assert code == 2 and len(err) == 1 and "stats.npz: y_mean has shape (5,)" in err[0]
    with pytest.raises(UsageError, match=r"stats.npz: y_mean has shape \(5,\)"):
        presets.resolve("mini", verify=False)  # what a training run opens


def test_info_counts_constant_features(data_cli):
    assert data_cli("prepare", *SMALL, "--name", "mini")[0] == 0
    code, out, _ = data_cli("info", "mini", "--json")
    (item,) = json.loads("\n".join(out))
    assert 0 < item["constant_x"] < item["n_x"] and item["shard_size"] == 32
    assert item["not_numbers_xy"] == [0, 0]  # no feature holds a NaN or inf


# ------------------------------------------------ kill -9 during preparation


@pytest.mark.slow
def test_kill_9_during_prepare_leaves_a_folder_that_info_reports_and_removes(data_cli,
                                                                             kosmoss_home):
    # Once: such a folder (290-360 MB for `small`) was never removed nor reported.
    env = {**os.environ, "KOSMOSS_HOME": str(kosmoss_home)}
    # The command's own module: `python -m kosmoss` would spend seconds importing torch first.
    writer = subprocess.Popen([sys.executable, "-m", "kosmoss.commands.data", "prepare",
                               "--columns", "16384", "--shard-size", "256", "--name", "big"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list((kosmoss_home / "data").glob(f".big.tmp-{writer.pid}@*/y_00000.npy")):
            assert writer.poll() is None, f"prepare ended first: {writer.stderr.read()}"
            assert time.monotonic() < deadline, "no shard written in 120 s"
            time.sleep(0.005)
        os.kill(writer.pid, signal.SIGSTOP)  # a writer at work, frozen: its folder must stay
        (tmp,) = (kosmoss_home / "data").glob(".big.tmp-*")
        code, _, err = data_cli("info")
        assert code == 0 and tmp.is_dir() and len(err) == 1
        assert err[0].startswith(f"kosmoss data: {tmp}: ")
        assert err[0].endswith(f"by pid {writer.pid} on {socket.gethostname()}, still running; "
                               "left alone")
    finally:
        writer.kill()
        writer.wait()
    code, out, err = data_cli("info", "--json")
    assert code == 0 and json.loads("\n".join(out)) == [] and len(err) == 1
    megabytes = float(err[0].split(f"{tmp}: ")[1].split(" MB")[0])
    assert megabytes >= 0.5  # at least one shard of 256 x 4680 float32
    assert err[0].endswith(f"left by an interrupted preparation (pid {writer.pid} on "
                           f"{socket.gethostname()}, gone); removed")
    assert not tmp.exists()
