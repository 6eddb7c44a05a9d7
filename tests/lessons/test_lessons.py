"""Every lesson runs top to bottom in a real Jupyter kernel, as a learner gets it.

The lessons are copied with ``kosmoss lessons`` into a working folder and the notebooks
there are executed with nbclient (this venv's python3 kernel), in a private KOSMOSS_HOME
shared by all lessons so each dataset is prepared once, with ``KOSMOSS_LESSON_QUICK=1``
(lesson 4's experiment at half length; its verdict is still computed and asserted). Each
exercise cell gets its reference solution and its checker cell must print ``correct``.
Each kernel follows PyTorch's autograd rule of a GPU machine (autograd_as_on_a_gpu.py): after
a backward in the kernel, ranks forked from it cannot run one — as on the GPU, not as here.
The lessons assert their own claims, so a wrong number fails here. Cheap checks of their
shape (what you will learn, time, exercises, a GPU note, no number — in digits, in words
or as inline code — and no verdict stated in prose) run first.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import REPO, run_script

import autograd_as_on_a_gpu

from kosmoss.lessons.course import LESSON_GLOB, QUICK_ENV

LESSONS = sorted(p.name for p in (REPO / "notebooks").glob(LESSON_GLOB))
CELL_TIMEOUT_S = 600  # lesson 8's cell runs `kosmoss bench --quick --only ...` (2 minutes here)
TIMINGS_FILE = "lesson-timings.json"
EXECUTED_FOLDER = "executed-lessons"  # tests/site builds the web site from what is saved here
TIME_LINE = r"Time: ~(\d+) min; the cells run in ~(\d+) min on 2 CPU cores"
EXERCISE_LINE = re.compile(r"\A# exercise: (\S+)")
# A verdict stated in prose instead of computed: the lessons print these from variables.
VERDICT = re.compile(r"(?i)\b(wins|won|beats|outperforms?|(is|are|was|were) (clearly )?"
                     r"(better|worse|faster|slower) than)\b")
# Numbers written as words. "one" to "nine" alone name a set-up ("two ranks"); from "ten"
# up, or as an estimate ("some seventy"), a ratio ("three times", "twice as") or a share
# ("half an hour", "a third of"), a word is a figure that the lesson must compute instead.
_UNITS = "one|two|three|four|five|six|seven|eight|nine"
_LARGE = ("ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|"
          "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundreds?|thousands?|"
          "millions?|billions?|dozens?")
_COUNT = rf"(?:(?:{_LARGE})(?:-(?:{_UNITS}))?|{_UNITS})"
NUMBER_WORDS = re.compile(
    rf"(?i)\b(?:(?:some|about|around|roughly|nearly|almost|approximately|over|under|more than"
    rf"|less than|at least|at most)\s+(?:{_COUNT}|a few|half)"
    rf"|{_COUNT}\s+times|(?:{_LARGE})(?:-(?:{_UNITS}))?"
    rf"|(?:twice|half)\s+(?:as|the|an?)|a (?:third|quarter|half) of)\b")
# Inline code that is only a number (with a unit): a figure dressed as code.
INLINE_NUMBER = re.compile(r"`\s*[~≈<>]?\s*[-+]?\d[\d.,_]*(?:e[-+]?\d+)?\s*"
                           r"(?:%|x|×|[kKMG]i?B?|B|ms|µs|us|s|min|h|W m-2)?\s*`")


def _read(path):
    import jupytext

    return jupytext.read(path)


def _markdown(notebook) -> list:
    return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]


def stated_numbers(markdown: str) -> list:
    """Numbers written in prose. Code (fenced or inline), HTML tags, link targets, the
    lesson's own number and its time estimate are not prose."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    code_numbers = [m.group(0) for m in INLINE_NUMBER.finditer(text)]
    text = re.sub(r"`[^`]*`", " ", text)
    words = [m.group(0) for m in NUMBER_WORDS.finditer(re.sub(r"<[^>]*>|\]\([^)]*\)", " ", text))]
    text = re.sub(r"(?m)^\s*\d+\.\s", " ", text)  # a numbered list's markers
    text = re.sub(r"<[^>]*>|\]\([^)]*\)", " ", text)
    text = re.sub(r"(?i)lessons? \d+b?(( and|,|–| to) \d+b?)*|" + TIME_LINE, " ", text)
    text = re.sub(r"\bissues? \d+", " ", text)  # an issue's number names it
    text = re.sub(r"[A-Z][a-z]+(\s+et\s+al\.)?,?\s+\(?(19|20)\d\d\b\)?", " ", text)  # a citation
    text = re.sub(r"(?i)\b(steps?|causes?) \d+(( and|,) \d+)*", " ", text)  # a section's name
    text = re.sub(r"\b(rank|node)s?\s+\d+( and \d+)?", " ", text)  # names of ranks and nodes
    text = re.sub(r"\b(Lightning|PyTorch|torch|Python|Horovod|CUDA|NCCL)\s+\d([\d.]*\d)?",
                  " ", text)  # versions
    return re.findall(r"(?<![\w.\-+/^])\d[\d.,]*(?![\w])", text) + words + code_numbers


def lesson_id(name: str) -> str:
    """"03b_ddp_metrics.py" -> "3b": the number in the lesson's title."""
    return name.split("_")[0].lstrip("0")


def test_the_lessons_are_numbered_in_order_a_b_lesson_after_its_own():
    ids = [lesson_id(name) for name in LESSONS]
    numbers = [i for i in ids if i.isdigit()]
    assert numbers == [str(n) for n in range(1, len(numbers) + 1)], LESSONS
    for index, lesson in enumerate(ids):  # "3b" comes right after "3"
        if not lesson.isdigit():
            assert lesson.endswith("b") and ids[index - 1] == lesson[:-1], LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    notebook = _read(REPO / "notebooks" / name)
    cells = _markdown(notebook)
    opening = cells[0]
    assert opening.startswith(f"# Lesson {lesson_id(name)} ")
    assert "What you will learn" in opening and re.search(TIME_LINE, opening), \
        "say how long the lesson takes, and how long its cells run"
    start = next(i for i, cell in enumerate(cells) if "## Exercises" in cell)
    exercises = "\n".join(cells[start:])[cells[start].index("## Exercises"):]
    assert "<details><summary>Solution</summary>" in exercises
    assert any("With a GPU" in cell for cell in cells), "say what changes with a GPU"
    # Exercise statements (a bold first line) define tasks: their numbers are the task's.
    prose = [cell for cell in cells if not cell.startswith("**")]
    numbers = {cell[:60]: stated_numbers(cell) for cell in prose if stated_numbers(cell)}
    assert not numbers, f"numbers in prose must be printed by code instead: {numbers}"
    verdicts = {cell[:60]: VERDICT.findall(_prose_only(cell)) for cell in prose
                if VERDICT.search(_prose_only(cell))}
    assert not verdicts, f"verdicts in prose must be computed and printed instead: {verdicts}"
    solutions = re.findall(r"<details><summary>Solution</summary>\s*```python\n(.*?)```",
                           exercises, flags=re.S)
    assert solutions, "the solution is Python in a <details> block"
    for code in solutions:
        compile(code, f"{name} solution", "exec")  # no SyntaxError for a learner to find
    checked = _checked_exercises(notebook)
    assert checked, "the lesson ends with exercises that check themselves"
    for exercise_id, checker in checked:
        assert checker == f'from kosmoss.exercises import check; check("{exercise_id}", globals())'


def _prose_only(markdown: str) -> str:
    return re.sub(r"```.*?```|`[^`]*`", " ", markdown, flags=re.S)


def _checked_exercises(notebook) -> list:
    """(exercise id, the checker cell after it) for every exercise cell."""
    cells = notebook.cells
    found = []
    for index, cell in enumerate(cells):
        match = EXERCISE_LINE.match(cell.source) if cell.cell_type == "code" else None
        if match:
            found.append((match.group(1), cells[index + 1].source.strip()))
    return found


def test_verdict_words_are_found_in_prose_only():
    assert VERDICT.search("so the linear rule wins at k = 16")
    assert VERDICT.search("Adam is clearly better than SGD")
    assert not VERDICT.search("which rule is best? The cell below prints it")


def test_stated_numbers_finds_numbers_written_as_words_or_as_code():
    assert stated_numbers("some seventy trainings, thirty-two times larger, in half an hour") \
        == ["some seventy", "thirty-two times", "half an"]
    assert stated_numbers("a hundred runs; twice as fast; a third of the memory; over half") \
        == ["hundred", "twice as", "a third of", "over half"]
    assert stated_numbers("the loss is `0.013`, a share of `25 %`, `4K` bytes") == \
        ["`0.013`", "`25 %`", "`4K`"]
    assert stated_numbers("two ranks, one process, three seeds; `--max-steps 20`, `k = 8`, "
                          "`2(n-1)/n`, `W = nodes × devices`") == []
    assert stated_numbers("Seventy") == ["Seventy"]


def test_stated_numbers_finds_prose_numbers_only():
    assert stated_numbers("a loss of 0.013 after 20 steps") == ["0.013", "20"]
    assert stated_numbers("`--max-steps 20`, float32, W m-2, SIGUSR1, 3dcorrection") == []
    assert stated_numbers("# Lesson 3 — DDP\nTime: ~25 min; the cells run in ~1 min on 2 CPU cores\n```\nx = 4\n```") == []
    assert stated_numbers("(Goyal et al., 2017), 2048 columns") == ["2048"]
    assert stated_numbers("Goyal et al. (2017) and You et\nal., 2020; Step 2, steps 2 and 3") == []
    assert stated_numbers("rank 0 of Lightning 2 (lesson 3); Horovod 0.28.1 took 12 s") == ["12"]
    assert stated_numbers("Time: ~30 min; the cells run in ~2 min on 2 CPU cores") == []
    assert stated_numbers("(pytorch issue 25162) in lesson 3b: 201 columns") == ["201"]


@pytest.fixture(scope="session")
def executed_folder(tmp_path_factory):
    """Every lesson as it ran, for tests/site: the site reuses these runs instead of its own."""
    folder = tmp_path_factory.getbasetemp() / EXECUTED_FOLDER
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def lesson_folder(tmp_path_factory):
    """The working folder a learner gets from ``kosmoss lessons``."""
    root = tmp_path_factory.mktemp("lessons")
    home = root / "kosmoss-home"
    proc = run_script(["-m", "kosmoss", "lessons", "--dest", str(root / "work")], home)
    assert proc.returncode == 0, proc.stderr
    return root / "work", home


@pytest.fixture(scope="session")
def gpu_autograd_ipython(tmp_path_factory):
    """An IPYTHONDIR whose kernels follow a GPU machine's autograd-and-fork rule."""
    return autograd_as_on_a_gpu.startup_folder(tmp_path_factory.mktemp("ipython"))


def test_lesson_kernels_follow_the_gpu_autograd_rule(lesson_folder, gpu_autograd_ipython,
                                                     monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    folder, home = lesson_folder
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    monkeypatch.setenv("IPYTHONDIR", str(gpu_autograd_ipython))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\nfrom kosmoss.lessons import on_ranks\n"
        "def backward(rank, world, port):\n"
        "    torch.ones(2, requires_grad=True).sum().backward()\n"
        "on_ranks(backward, 2)  # no backward in the kernel yet: the ranks run theirs\n"
        "torch.ones(2, requires_grad=True).sum().backward()\n"
        "try:\n    on_ranks(backward, 2)\n"
        "except RuntimeError as err:\n    print(err)")])
    NotebookClient(nb, kernel_name="python3", timeout=120,
                   resources={"metadata": {"path": str(folder)}}).execute()
    printed = nb.cells[0].outputs[-1]["text"]
    assert printed.startswith("on_ranks(backward, 2): a rank could not run a backward pass")
    assert "pt_autograd_0" in printed


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
def test_lesson_runs_top_to_bottom(name, lesson_folder, executed_folder, gpu_autograd_ipython,
                                   monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    folder, home = lesson_folder
    monkeypatch.setenv("KOSMOSS_HOME", str(home))
    monkeypatch.setenv("IPYTHONDIR", str(gpu_autograd_ipython))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    monkeypatch.setenv(QUICK_ENV, "1")
    notebook = nbformat.read(folder / name.replace(".py", ".ipynb"), as_version=4)
    answered = _answer_exercises(notebook)
    client = NotebookClient(notebook, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(folder)}})
    started = time.monotonic()
    own_scratch = f"lesson{name.split('_')[0]}-*"  # scratch_folder("lesson03-"), ...
    scratch_before = set(Path(tempfile.gettempdir()).glob(own_scratch))
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        nbformat.write(notebook, folder / f"executed-{name[:-3]}.ipynb")
        nbformat.write(notebook, executed_folder / f"{name[:-3]}.ipynb")
        left_behind = _end_ghosts()
    assert not left_behind, f"the lesson left processes of its runs running: {left_behind}"
    # The kernel has exited: its scratch folders (kosmoss.lessons.course.scratch_folder) are gone.
    scratch_left = set(Path(tempfile.gettempdir()).glob(own_scratch)) - scratch_before
    assert not scratch_left, f"the lesson left scratch folders: {sorted(scratch_left)}"
    seconds = time.monotonic() - started
    _record_time(folder, name, seconds)
    stated_min = int(re.search(TIME_LINE, notebook.cells[0].source).group(2))
    # Printed, not asserted: a time depends on the machine's load (speed is the bench's job).
    print(f"\n{name}: ran {seconds:.0f} s in CI's quick mode (states ~{stated_min} min)")
    printed = {cell.source: _text(cell) for cell in notebook.cells if cell.cell_type == "code"}
    for exercise_id, checker in answered:
        assert printed[checker].startswith(f"correct: {exercise_id}"), printed[checker]
    errors = [out for cell in notebook.cells for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert not errors
    unrun = [cell.source[:60] for cell in notebook.cells
             if cell.cell_type == "code" and cell.source.strip() and cell.execution_count is None]
    assert not unrun, f"cells that did not run: {unrun}"


def _answer_exercises(notebook) -> list:
    """Put each exercise's reference solution in its cell; (id, checker cell source)."""
    from kosmoss.exercises.core import find

    answered = _checked_exercises(notebook)
    for cell in notebook.cells:
        match = EXERCISE_LINE.match(cell.source) if cell.cell_type == "code" else None
        if match:
            cell.source = f"# exercise: {match.group(1)}\n{find(match.group(1)).reference}"
    return answered


def _text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream")


def _end_ghosts() -> list:
    """Processes of the lesson's runs still alive after it (e.g. lesson 6's ghosts if a
    cell failed): end them, so that the next lessons get the cores, and report them."""
    from kosmoss.ghosts.find import KOSMOSS_GHOSTS, find_ghosts
    from kosmoss.ghosts.end import end_ghosts

    # This lesson's runs only (home None: the current KOSMOSS_HOME, the lesson's own): on a
    # shared machine another user's or another test's ghosts are theirs to end.
    ghosts = [g for g in find_ghosts() if g.kind in KOSMOSS_GHOSTS and g.home is None]
    end_ghosts(ghosts, grace=2)
    return [(g.pid, g.kind, g.command[:80]) for g in ghosts]


def _record_time(folder, name, seconds: float) -> None:
    file = folder / TIMINGS_FILE
    timings = json.loads(file.read_text()) if file.exists() else {}
    timings[name] = round(seconds, 1)
    file.write_text(json.dumps(timings, indent=2))
    print(f"{name}: {seconds:.1f} s ({sum(timings.values()):.0f} s for {len(timings)} so far)")
