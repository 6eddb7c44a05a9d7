"""Every lesson carries its exercises as the catalogue has them, and ``kosmoss check``
reads them from the shipped notebook.

- Each lesson's notebook holds each exercise's statement, skeleton and checker cell
  exactly as the catalogue has them, so `kosmoss check 09` finds what the lesson shows.
- `kosmoss check NN --notebook` on the shipped lesson says "not answered" (exit 1); with
  the reference answers pasted in, "correct" (exit 0).

What each wrong answer is told is tests/exercises/test_checkers.py's (the catalogues).
"""
from __future__ import annotations

import pytest
from helpers import REPO

from kosmoss import cli
from kosmoss.exercises import exercises
from kosmoss.exercises.core import LESSON_MODULES, notebook_glob

LESSONS = {key: next(p.name for p in (REPO / "notebooks").glob(notebook_glob(key) + ".py"))
           for key in LESSON_MODULES}


def _lesson(lesson):
    import jupytext

    return jupytext.read(REPO / "notebooks" / LESSONS[lesson])


def _answered(lesson, tmp_path):
    """The shipped lesson with every exercise cell replaced by its reference solution."""
    import jupytext

    notebook = _lesson(lesson)
    for cell in notebook.cells:
        for exercise in exercises(lesson):
            if cell.cell_type == "code" and cell.source.strip() == exercise.skeleton.strip():
                cell.source = exercise.cell(exercise.reference)
    path = tmp_path / LESSONS[lesson]
    jupytext.write(notebook, path, fmt="py:percent")
    return path


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_carries_its_exercises_as_the_catalogue_has_them(lesson):
    cells = [(cell.cell_type, cell.source.strip()) for cell in _lesson(lesson).cells]
    found = exercises(lesson)
    assert 1 <= len(found) <= 3
    for exercise in found:
        index = cells.index(("code", exercise.skeleton.strip()))
        assert cells[index - 1] == ("markdown", exercise.statement.strip()), exercise.id
        assert cells[index + 1] == ("code", exercise.checker_cell), exercise.id


@pytest.mark.parametrize("lesson", LESSONS)
def test_check_the_shipped_lesson_says_not_answered(lesson, capsys):
    assert cli.main(["check", lesson, "--notebook", str(REPO / "notebooks" / LESSONS[lesson])]) == 1
    out = capsys.readouterr().out
    assert out.count("not answered yet") == len(exercises(lesson)), out


def test_check_the_answered_lessons_says_correct(tmp_path, capsys):
    # The in-process exercises only, one launch per lesson: the distributed ones' references
    # run in test_checkers.py and in tests/lessons (each launch of 4 processes costs seconds).
    for lesson in LESSONS:
        path = _answered(lesson, tmp_path)
        here = [e for e in exercises(lesson) if not e.distributed]
        whole = len(here) == len(exercises(lesson))
        for names in ([[]] if whole else [[e.name] for e in here]):
            assert cli.main(["check", lesson, *names, "--notebook", str(path)]) == 0, \
                capsys.readouterr()
        out = capsys.readouterr().out
        assert all(f"  correct: {e.id} — " in out for e in here), out
