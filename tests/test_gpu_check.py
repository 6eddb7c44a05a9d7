"""scripts/gpu_check.sh on a CPU machine, as CI runs it (CI never has a GPU): the dry run
prints the plan and checks every wheel and file the GPU run needs; bad input is one line on
stderr and exit 2, with nothing written.

    .venv/bin/python -m pytest tests/test_gpu_check.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List

import pytest
from helpers import REPO

SCRIPTS = REPO / "scripts"
WHEEL_CMD = "bash scripts/gpu_wheels.sh"
KOSMOSS_WHEEL = "kosmoss-0.1.0-py3-none-any.whl"
LESSONS = "kosmoss-0.1.0.data/data/share/kosmoss/lessons/"
HEADLINE = "trainup_gpu.py --strategy ddp --gpus 1 --num-nodes 2"


def carried(which: str = "CARRIED") -> List[str]:
    """The wheels gpu_wheels.sh fetches (NAME==VERSION), read from the script itself:
    CARRIED for every call, LESSON_CARRIED for the lessons profile."""
    listed = subprocess.run(["bash", "-c", 'source scripts/gpu_wheels.sh; printf "%s\\n" '
                             f'"${{{which}[@]}}"'], cwd=REPO, capture_output=True, text=True,
                            check=True)
    return listed.stdout.split()


def carried_name(spec: str) -> str:
    name, version = spec.split("==")
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"  # pip's file name rule


def checkout_modules() -> List[Path]:
    return sorted(p for p in (REPO / "kosmoss").rglob("*.py") if "__pycache__" not in p.parts)


def write_kosmoss_wheel(folder: Path, changed: str = None, left_out: str = None) -> None:
    """A wheel holding the checkout's modules (one changed or left out, if asked)."""
    with zipfile.ZipFile(folder / KOSMOSS_WHEEL, "w") as wheel:
        for source in checkout_modules():
            name = source.relative_to(REPO).as_posix()
            if name == left_out:
                continue
            data = source.read_bytes() + (b"# edited\n" if name == changed else b"")
            wheel.writestr(name, data)
        wheel.write(REPO / "trainup_gpu.py", LESSONS + "trainup_gpu.py")


@pytest.fixture
def wheels(tmp_path) -> Path:
    """Every wheel the GPU run installs: empty files named as the carried ones (the dry run
    checks presence), and a kosmoss wheel whose contents match the checkout."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for spec in carried() + carried("LESSON_CARRIED"):
        (folder / carried_name(spec)).write_bytes(b"")
    write_kosmoss_wheel(folder)
    return folder


def gpu_check(tmp_path: Path, *args: str, path_first: Path = None, **env: str):
    environ = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path),
               "GPU_CHECK_SCRATCH": str(tmp_path / "scratch"), **env}
    environ.pop("OUT", None)
    if path_first:
        environ["PATH"] = f"{path_first}{os.pathsep}{environ['PATH']}"
    return subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), *args], cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=60)


def one_line_error(proc, *words: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check.sh: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def fake_nvidia_smi(tmp_path: Path, listing: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '{listing}'\n" + ("exit 0\n" if listing else "exit 9\n"))
    tool.chmod(0o755)
    return folder


def steps_of(plan: str) -> List[str]:
    return [line.split()[0] for line in plan.splitlines() if line.startswith("  ")]


def test_the_dry_run_prints_the_check_profile_and_writes_nothing(tmp_path, wheels):
    out = tmp_path / "out"
    proc = gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    assert HEADLINE in plan and "--batch-size 16384" in plan
    assert "-m pytest -m gpu" in plan
    assert "--precision bf16-mixed --mode device" in plan
    assert "torch.distributed.run" in plan and "kosmoss ghosts --kill" in plan
    assert "--no-index --no-deps" in plan and KOSMOSS_WHEEL in plan
    assert steps_of(plan) == ["install", "env", "data", "pytest", "headline", "bf16", "ghost"]
    assert "jupytext" not in plan  # the lessons' wheels travel only for their profile
    assert not out.exists() and not (tmp_path / "scratch").exists()
    assert not list(tmp_path.glob("gpu_check_helper.*"))  # its temporary file is removed


@pytest.mark.parametrize("profile, steps, words", [
    ("bench", ["install", "data", "bench", "sweep", "anatomy"],
     ["kosmoss bench --only raw-gpu lightning-gpu fabric-gpu kosmoss-gpu nodes-gpu-2x1 "
      "raw-gpu-bf16 kosmoss-gpu-bf16", "kosmoss.bench.ddp_anatomy --device cuda"]),
    ("ladder", ["install", "data", "ladder", "top"],
     ["-m kosmoss.bench.ladder --device cuda", "--batch-size 16384 max --steps 300",
      "kosmoss bench --only kosmoss-gpu kosmoss-gpu-top kosmoss-gpu-top-max"]),
    ("lessons", ["install", "lessons"], ["KOSMOSS_LESSON_QUICK=1", "jupytext==", "nbclient=="]),
])
def test_each_profile_runs_its_own_steps(tmp_path, wheels, profile, steps, words):
    proc = gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--profile", profile)
    assert proc.returncode == 0, proc.stderr
    assert steps_of(proc.stdout) == steps
    for word in words:
        assert word in proc.stdout, word


def test_the_lessons_wheels_are_checked_only_for_their_profile(tmp_path, wheels):
    spec = carried("LESSON_CARRIED")[0]
    (wheels / carried_name(spec)).unlink()
    assert gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels)).returncode == 0
    one_line_error(gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--profile",
                             "lessons"), "missing wheel", spec, WHEEL_CMD)


def test_only_keeps_the_install_and_the_data_its_steps_need(tmp_path, wheels):
    proc = gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--only", "bench,ghost")
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert steps == ["install", "data", "ghost", "bench"]


def test_tests_names_what_the_pytest_step_collects(tmp_path, wheels):
    proc = gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--only", "pytest",
                     "--tests", "tests/ghosts/test_gpu.py,tests/gpu")
    assert proc.returncode == 0, proc.stderr
    assert "--continue-on-collection-errors tests/ghosts/test_gpu.py tests/gpu" in proc.stdout


@pytest.mark.parametrize("which", ["carried", "kosmoss"])
def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(tmp_path, wheels, which):
    wheel = wheels / (carried_name(carried()[0]) if which == "carried" else KOSMOSS_WHEEL)
    wheel.unlink()
    name = carried()[0].split("==")[0] if which == "carried" else "kosmoss"
    line = one_line_error(gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels)),
                          "missing wheel", WHEEL_CMD)
    assert f"({name}" in line


@pytest.mark.parametrize("how", ["changed", "left_out"])
def test_a_kosmoss_wheel_older_than_the_checkout_is_refused(tmp_path, wheels, how):
    module = "kosmoss/core/paths.py"
    write_kosmoss_wheel(wheels, **{how: module})
    words = (module + " differs",) if how == "changed" else (module + " is missing",)
    one_line_error(gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels)),
                   *words, "does not match the checkout", WHEEL_CMD)


def test_no_gpu_is_one_line_and_writes_nothing(tmp_path, wheels):
    out = tmp_path / "out"
    no_gpu = fake_nvidia_smi(tmp_path, "")  # as on a machine with a driver but no GPU
    one_line_error(gpu_check(tmp_path, "--wheels", str(wheels), "--out", str(out),
                             path_first=no_gpu), "no NVIDIA GPU", "--dry-run")
    assert not out.exists() and not (tmp_path / "scratch").exists()


def test_a_gpu_torch_cannot_use_is_one_line(tmp_path, wheels):
    listed = fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\\n")
    one_line_error(gpu_check(tmp_path, "--wheels", str(wheels), path_first=listed,
                             CUDA_VISIBLE_DEVICES=""),
                   "torch.cuda.is_available() is False", "PYTHON")


@pytest.mark.parametrize("args, words", [
    (["--only", "nope"], ["--only nope", "choose from"]),
    (["--profile", "nope"], ["--profile nope", "check, bench, ladder, lessons"]),
    (["--profile", "check", "--only", "env"], ["--profile and --only"]),
    (["--gpu-batch", "0"], ["--gpu-batch 0", ">= 1"]),
    (["--gpu-batch", "65536", "--columns", "65536"], ["--gpu-batch 65536", "--columns"]),
    (["--budget"], ["--budget needs a value"]),
    (["--fast"], ["unknown argument --fast"]),
    (["--tests", "tests/nope.py"], ["--tests tests/nope.py", "not in the checkout"]),
])
def test_bad_flags_are_one_line(tmp_path, args, words):
    one_line_error(gpu_check(tmp_path, "--dry-run", *args), *words)


def test_an_output_folder_of_someone_else_is_refused(tmp_path, wheels):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    one_line_error(gpu_check(tmp_path, "--dry-run", "--wheels", str(wheels), "--out", str(out)),
                   f"--out {out}", "gpu-report.md")
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheels.sh"])
def test_the_scripts_parse(script):
    checked = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stderr


def helper_module(tmp_path):
    """The script's Python half, as write_helper writes it, imported."""
    import importlib.util

    script = (SCRIPTS / "gpu_check.sh").read_text()
    start = script.index("<<'PYTHON'\n", script.index("write_helper() {")) + len("<<'PYTHON'\n")
    path = tmp_path / "gpu_check_helper.py"
    path.write_text(script[start:script.index("\nPYTHON\n", start)])
    spec = importlib.util.spec_from_file_location("gpu_check_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kosmoss_at_the_top_is_set_against_the_ladders_last_rung(tmp_path):
    """The report's target line takes the top rung from the ladder it reads (its last
    rung on the ladder, not an off-ladder row measured after it), at kosmoss's own batch."""
    helper = helper_module(tmp_path)
    ladder = {"limit_samples_per_s": 100e6, "rows": [
        {"rung": "graphs-k8", "batch_size": 16384, "samples_per_s": 11e6},
        {"rung": "bf16-store", "batch_size": 16384, "samples_per_s": 20e6},
        {"rung": "bf16-store", "batch_size": 131072, "samples_per_s": 40e6},
        {"rung": "tf32", "batch_size": 16384, "samples_per_s": 9e6, "off_ladder": True}]}
    rows = {"kosmoss-gpu-top": {"batch_size": 16384, "samples_per_s": 19e6},
            "kosmoss-gpu-top-max": {"batch_size": 131072, "samples_per_s": 30e6}}
    lines = helper.ladder_targets(rows, ladder)
    assert lines[0] == ("- kosmoss-gpu-top ÷ the bf16-store rung, batch 16,384: 0.95 "
                        "(target ≥ 0.90: met).")
    assert lines[1].startswith("- kosmoss-gpu-top-max ÷ the bf16-store rung, batch 131,072: "
                               "0.75") and "missed" in lines[1]
    assert lines[2] == ("- kosmoss bf16, fastest: 30.0 M samples/s, 30.0% of the limit "
                        "(target ≥ 20 M: met).")


def test_the_lessons_step_runs_the_named_lessons_in_the_order_given(tmp_path, monkeypatch):
    """A short window names the lessons that matter most first: they run first (the H200
    window of 2026-11-28 ran them sorted, and the budget ended before the ones it named
    first)."""
    import nbformat

    import kosmoss.lessons.course as course
    import kosmoss.lessons.site as site

    helper = helper_module(tmp_path)
    ran = []
    monkeypatch.setattr(course, "copy_lessons", lambda *args: None)
    monkeypatch.setattr(course, "bundle", lambda *args: None)
    monkeypatch.setattr(site, "execute_notebook",
                        lambda path: ran.append(path.stem) or nbformat.v4.new_notebook())
    monkeypatch.delenv("KOSMOSS_LESSON_QUICK", raising=False)  # the step sets it; restored
    named = ["11_memory_and_beyond_ddp", "05_devices", "08b_saturating_one_gpu"]
    assert helper.lessons(tmp_path, tmp_path, *named) == 0
    assert ran == named
    ran.clear()
    assert helper.lessons(tmp_path, tmp_path) == 0
    assert ran == sorted(ran) and len(ran) == len(course.lesson_sources())
