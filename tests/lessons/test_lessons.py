"""Every lesson runs top to bottom in a real Jupyter kernel, as a learner gets it.

The lessons are copied with ``kosmoss lessons`` into a working folder and executed there
with nbclient (this venv's python3 kernel), in a private KOSMOSS_HOME shared by the eight
so each dataset is prepared once. Cheap checks of their shape (what you will learn, time,
exercises with solutions that compile, a GPU note, no number stated in prose) run first.
"""
from __future__ import annotations

import json
import re
import sys
import time

import pytest

from helpers import REPO, run_script

LESSONS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT_S = 600  # lesson 8's cell runs `kosmoss bench --quick` (about 3 minutes here)
TIMINGS_FILE = "lesson-timings.json"


def _read(path):
    import jupytext

    return jupytext.read(path)


def _markdown(notebook) -> list:
    return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]


def stated_numbers(markdown: str) -> list:
    """Numbers written in prose. Code (fenced or inline), HTML tags, link targets, the
    lesson's own number and its time estimate are not prose."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"(?m)^\s*\d+\.\s", " ", text)  # a numbered list's markers
    text = re.sub(r"<[^>]*>|\]\([^)]*\)", " ", text)
    text = re.sub(r"(?i)lessons? \d+(( and|,|–| to) \d+)*|Time: ~\d+ min", " ", text)
    text = re.sub(r"[A-Z][a-z]+( et al\.)?, (19|20)\d\d\b", " ", text)  # a citation's year
    text = re.sub(r"\b(rank|node)s?\s+\d+( and \d+)?", " ", text)  # names of ranks and nodes
    text = re.sub(r"\b(Lightning|PyTorch|torch|Python|Horovod|CUDA|NCCL)\s+\d([\d.]*\d)?",
                  " ", text)  # versions
    return re.findall(r"(?<![\w.\-+/^])\d[\d.,]*(?![\w])", text)


def test_there_are_eight_lessons():
    assert [name[:2] for name in LESSONS] == [f"{i:02d}" for i in range(1, 9)], LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    cells = _markdown(_read(REPO / "notebooks" / name))
    opening, closing = cells[0], "\n".join(cells[-3:])
    assert opening.startswith(f"# Lesson {int(name[:2])} ")
    assert "What you will learn" in opening and re.search(r"Time: ~\d+ min", opening)
    assert "## Exercises" in closing and "<details><summary>Solution</summary>" in closing
    assert any("With a GPU" in cell for cell in cells), "say what changes with a GPU"
    numbers = {cell[:60]: stated_numbers(cell) for cell in cells if stated_numbers(cell)}
    assert not numbers, f"numbers in prose must be printed by code instead: {numbers}"
    solutions = re.findall(r"<details><summary>Solution</summary>\s*```python\n(.*?)```",
                           closing, flags=re.S)
    assert solutions, "the solution is Python in a <details> block"
    for code in solutions:
        compile(code, f"{name} solution", "exec")  # no SyntaxError for a learner to find


def test_stated_numbers_finds_prose_numbers_only():
    assert stated_numbers("a loss of 0.013 after 20 steps") == ["0.013", "20"]
    assert stated_numbers("`--max-steps 20`, float32, W m-2, SIGUSR1, 3dcorrection") == []
    assert stated_numbers("# Lesson 3 — DDP\nTime: ~25 min\n```\nx = 4\n```") == []
    assert stated_numbers("(Goyal et al., 2017), 2048 columns") == ["2048"]
    assert stated_numbers("rank 0 of Lightning 2 (lesson 3); Horovod 0.28.1 took 12 s") == ["12"]


@pytest.fixture(scope="session")
def lesson_folder(tmp_path_factory):
    """The working folder a learner gets from ``kosmoss lessons``."""
    root = tmp_path_factory.mktemp("lessons")
    home = root / "kosmoss-home"
    proc = run_script(["-m", "kosmoss", "lessons", "--dest", str(root / "work")], home)
    assert proc.returncode == 0, proc.stderr
    return root / "work", home


def test_kernel_is_this_python(lesson_folder, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    folder, home = lesson_folder
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys, os; print(sys.executable); print(os.environ['KOSMOSS_HOME'])")])
    NotebookClient(nb, kernel_name="python3", timeout=60,
                   resources={"metadata": {"path": str(folder)}}).execute()
    assert nb.cells[0].outputs[0]["text"].split() == [sys.executable, str(home)]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_top_to_bottom(name, lesson_folder, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    folder, home = lesson_folder
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    notebook = _read(folder / name)
    client = NotebookClient(notebook, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(folder)}})
    started = time.monotonic()
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        nbformat.write(notebook, folder / f"executed-{name[:-3]}.ipynb")
        left_behind = _end_ghosts()
    assert not left_behind, f"the lesson left processes of its runs running: {left_behind}"
    _record_time(folder, name, time.monotonic() - started)
    errors = [out for cell in notebook.cells for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert not errors
    unrun = [cell.source[:60] for cell in notebook.cells
             if cell.cell_type == "code" and cell.source.strip() and cell.execution_count is None]
    assert not unrun, f"cells that did not run: {unrun}"


def _end_ghosts() -> list:
    """Processes of the lesson's runs still alive after it (e.g. lesson 6's ghosts if a
    cell failed): end them, so that the next lessons get the cores, and report them."""
    from kosmoss.ghosts import KOSMOSS_GHOSTS, end_ghosts, find_ghosts

    ghosts = [g for g in find_ghosts() if g.kind in KOSMOSS_GHOSTS]
    end_ghosts(ghosts, grace=2)
    return [(g.pid, g.kind, g.command[:80]) for g in ghosts]


def _record_time(folder, name, seconds: float) -> None:
    file = folder / TIMINGS_FILE
    timings = json.loads(file.read_text()) if file.exists() else {}
    timings[name] = round(seconds, 1)
    file.write_text(json.dumps(timings, indent=2))
    print(f"{name}: {seconds:.1f} s ({sum(timings.values()):.0f} s for {len(timings)} so far)")
