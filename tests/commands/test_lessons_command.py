"""``kosmoss lessons``: copies the course into a working folder, never over the learner's
changes, and finds the lessons after a plain (non-editable) install too."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO, run_script

from kosmoss import cli
from kosmoss.commands import lessons as command
from kosmoss.lessons.course import COMPANIONS, MANIFEST, SCRIPTS, lesson_sources

LESSONS = [p.name for p in lesson_sources(REPO)]
NOTEBOOKS = [name.replace(".py", ".ipynb") for name in LESSONS]
COPIED = len(LESSONS) + len(SCRIPTS) + len(COMPANIONS)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_copies_each_lesson_once_with_its_scripts_and_documents(tmp_path):
    dest = tmp_path / "course"
    proc = run_script(["-m", "kosmoss", "lessons", "--dest", str(dest)], tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    # One notebook per lesson: JupyterLab (with jupytext) would list a .py as a second copy.
    assert _files(dest) == sorted(NOTEBOOKS + list(SCRIPTS) + list(COMPANIONS) + [MANIFEST])
    assert f"cd {dest} && jupyter lab" in proc.stdout
    assert f"{COPIED} written" in proc.stdout
    for name in ("slurm/submit.sbatch",) + COMPANIONS:  # what the lessons point to is there
        assert (dest / name).read_bytes() == (REPO / name).read_bytes()
    assert not (tmp_path / "home").exists()  # nothing lands in KOSMOSS_HOME


def test_every_file_a_lesson_names_is_copied_with_it(tmp_path):
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    shipped = set(_files(tmp_path))
    for name in LESSONS:
        text = (REPO / "notebooks" / name).read_text()
        named = set(re.findall(r"\b((?:docs|scripts|slurm)/[\w./-]+\.(?:md|sh|sbatch))", text))
        assert named <= shipped, f"{name} points to files a learner does not get: {named - shipped}"


def test_notebooks_match_their_sources_and_open_clean(tmp_path):
    import jupytext
    import nbformat
    from ipykernel.ipkernel import IPythonKernel

    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    for name in LESSONS:
        path = tmp_path / name.replace(".py", ".ipynb")
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        source = jupytext.read(REPO / "notebooks" / name)
        assert [c.source for c in notebook.cells] == [c.source for c in source.cells]
        assert notebook.metadata["kernelspec"]["name"] == "python3"
        # What the kernel reports on start is already there, so opening adds nothing, and
        # saving an unchanged notebook (as Jupyter writes it) gives the same bytes.
        assert notebook.metadata["language_info"] == IPythonKernel.language_info
        nbformat.write(notebook, tmp_path / "saved.ipynb")
        assert (tmp_path / "saved.ipynb").read_bytes() == path.read_bytes()


def test_second_run_keeps_the_learners_changes(tmp_path, capsys):
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    capsys.readouterr()
    worked = tmp_path / NOTEBOOKS[0]
    worked.write_text(worked.read_text().replace("What you will learn", "My notes"))
    mine = worked.read_bytes()
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert worked.read_bytes() == mine
    assert f"kept {worked.name}: you changed it" in out
    assert f"{COPIED - 1} unchanged, 1 kept" in out


def test_an_older_copy_that_was_not_changed_is_updated(tmp_path, capsys):
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    # As if an older kosmoss had written this file: the manifest knows its checksum.
    shipped = (tmp_path / NOTEBOOKS[1]).read_bytes()
    older = b'{"cells": []}\n'
    (tmp_path / NOTEBOOKS[1]).write_bytes(older)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["files"][NOTEBOOKS[1]] = hashlib.sha256(older).hexdigest()
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    assert "1 updated" in capsys.readouterr().out
    assert (tmp_path / NOTEBOOKS[1]).read_bytes() == shipped


def test_files_there_before_kosmoss_are_the_learners(tmp_path, capsys):
    (tmp_path / NOTEBOOKS[0]).write_text("my own file\n")
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    assert (tmp_path / NOTEBOOKS[0]).read_text() == "my own file\n"
    assert f"kept {NOTEBOOKS[0]}" in capsys.readouterr().out


def test_dest_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert cli.main(["lessons", "--dest", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--dest {target}: is a file" in err
    assert target.read_text() == "mine"


def test_dest_that_cannot_be_created_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    assert cli.main(["lessons", "--dest", str(tmp_path / "file" / "course")]) == 2
    assert f"{tmp_path / 'file'} is a file, not a folder; give another folder" in \
        capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "mine"


def test_without_jupytext_the_py_lessons_are_copied_and_it_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "installed", lambda module: module != "jupytext")
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no .ipynb written, the .py sources instead: jupytext is missing" in out
    assert not list(tmp_path.glob("*.ipynb"))
    assert sorted(p.name for p in tmp_path.glob("*.py")) == sorted(LESSONS + ["trainup_cpu.py",
                                                                             "trainup_gpu.py"])
    for name in LESSONS:
        assert (tmp_path / name).read_bytes() == (REPO / "notebooks" / name).read_bytes()


def test_without_jupyterlab_it_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "installed", lambda module: module != "jupyterlab")
    assert cli.main(["lessons", "--dest", str(tmp_path)]) == 0
    assert 'pip install torch==2.13.0 -e ".[lessons]"' in capsys.readouterr().out


@pytest.mark.slow
def test_a_non_editable_install_ships_the_lessons(tmp_path):
    """Build the wheel, install it into a folder of its own and copy the lessons from
    there: the checkout is not reachable from the installed package."""
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation,
                    "-w", str(tmp_path / "wheel"), str(REPO)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "wheel").glob("kosmoss-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--no-compile",
                    "--target", str(tmp_path / "site"), str(wheel)], check=True)
    env_code = ("import kosmoss, kosmoss.lessons.course as l, kosmoss.cli as c, sys; "
                "print(kosmoss.__file__); print(l.source_root()); "
                "sys.exit(c.main(['lessons', '--dest', 'work']))")
    proc = subprocess.run([sys.executable, "-c", env_code], cwd=tmp_path, capture_output=True,
                          text=True, env={**_clean_env(), "PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stderr
    package, root = proc.stdout.splitlines()[:2]
    assert package.startswith(str(tmp_path / "site")) and str(REPO) not in root
    assert sorted(p.name for p in (tmp_path / "work").glob("*.ipynb")) == sorted(NOTEBOOKS)
    for name in SCRIPTS + COMPANIONS:
        assert (tmp_path / "work" / name).is_file(), f"{name} is not installed with kosmoss"


def _clean_env():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
