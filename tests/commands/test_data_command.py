"""``kosmoss data`` as a user runs it."""
import json

import pytest

from helpers import run_script


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


def test_info_lists_a_broken_dataset_without_failing(tmp_path):
    home = tmp_path / "home"
    (home / "data" / "broken").mkdir(parents=True)
    proc = run_script(["-m", "kosmoss", "data", "info", "--json"], home)
    assert proc.returncode == 0
    assert "metadata.json" in json.loads(proc.stdout)[0]["error"]


def test_bad_inputs_are_one_line_exit_2(tmp_path):
    home = tmp_path / "home"
    for args, names in [(["prepare", "--columns", "0"], "--columns 0"),
                        (["prepare", "huge"], "unknown preset 'huge'"),
                        (["info", "nope"], "dataset nope"),
                        (["prepare", "--source", "web"], "--source")]:
        proc = run_script(["-m", "kosmoss", "data", *args], home)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and names in lines[0], proc.stderr
    assert not home.exists()


def test_existing_folder_is_not_overwritten(tmp_path):
    home = tmp_path / "home"
    mine = home / "data" / "tiny"
    mine.mkdir(parents=True)
    (mine / "thesis.txt").write_text("precious")
    proc = run_script(["-m", "kosmoss", "data", "prepare", "tiny"], home)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert (mine / "thesis.txt").read_text() == "precious"


def test_maelstrom_without_the_extra_names_the_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("climetlab"):
        pytest.skip("climetlab is installed: the real download would start")
    home = tmp_path / "home"
    proc = run_script(["-m", "kosmoss", "data", "prepare", "--source", "maelstrom"], home)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--source maelstrom" in lines[0] and "kosmoss[maelstrom]" in lines[0]
    assert not (home / "data").exists() or not any((home / "data").iterdir())
