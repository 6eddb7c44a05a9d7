"""The exercises of lessons 09-11 (communication; when it hangs or crashes; memory and
beyond DDP), run for real.

- Each lesson's notebook carries its exercises exactly as the catalogue has them
  (statement, skeleton, checker cell), so `kosmoss check 09` finds what the lesson shows.
- `kosmoss check NN --notebook` on the shipped lesson says "not answered" (exit 1); with
  the reference answers pasted in, "correct" (exit 0).
- Every wrong solution is rejected with the diagnosis a learner needs, not only "wrong"
  (test_checkers.py checks that each is rejected; this checks what it says).
"""
from __future__ import annotations

import pytest

from helpers import REPO
from kosmoss import cli
from kosmoss.exercises import exercises
from kosmoss.exercises.core import CORRECT, WRONG, find
from kosmoss.exercises.judging import judge_sources

LESSONS = {"09": "09_communication.py", "10": "10_when_it_hangs.py",
           "11": "11_memory_and_beyond_ddp.py"}

# What the checker must say for each wrong solution: the cause, in the learner's terms.
DIAGNOSES = {
    "09.ring_all_reduce": {
        "reduce-scatter only": "the all-gather must pass them round",
        "the whole buffer to the neighbour": "a ring sends chunks of 1/n",
        "calls all_reduce": "called dist.all_reduce",
    },
    "09.buckets": {
        "never over the cap": "DDP closes a bucket once it *reaches* the cap",
        "one cap for every bucket": "the first bucket has its own cap, first_cap",
    },
    "10.sum_stats": {
        "the dict's own order": "rank 1's 'batches': the ranks reduced their entries in "
                                "different orders",
        "one tensor in the dict's order": "agree on one order (sorted names)",
    },
    "10.stragglers": {
        "the rank that waits most": "the rank that waits longest is the fast one",
        "the slowest step, busy + wait": "yours [0], kosmoss watch flags [1]",
        "no noise floor": "a gap under 2 ms",
    },
    "11.accumulate": {
        "sums the slices' losses": "your step is 4x the full batch's",
        "zero_grad in the loop": "your step follows the last slice only",
        "the whole batch at once": "your forward passes saw [32] columns",
    },
    "11.zero1_step": {
        "every rank keeps every buffer": "ZeRO-1 keeps only the owner's share",
        "no broadcast": "broadcast every parameter from the rank that owns it",
    },
}


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


def test_every_wrong_solution_has_its_diagnosis():
    for exercise in exercises():
        if exercise.lesson in LESSONS:
            assert set(DIAGNOSES[exercise.id]) == set(exercise.wrong), exercise.id


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
    # The in-process exercises only: the distributed ones' references run in the test below
    # and in tests/lessons (each launch of 2 processes costs seconds).
    for lesson in LESSONS:
        path = _answered(lesson, tmp_path)
        for exercise in exercises(lesson):
            if not exercise.distributed:
                assert cli.main(["check", lesson, exercise.name, "--notebook", str(path)]) == 0
                assert f"  correct: {exercise.id} — " in capsys.readouterr().out


@pytest.mark.parametrize("exercise_id", [e for e in DIAGNOSES
                                         if not find(e).distributed])
def test_in_process_checker_names_each_mistake(exercise_id):
    exercise = find(exercise_id)
    verdicts = judge_sources([(exercise, exercise.cell(body)) for body in exercise.wrong.values()])
    for name, verdict in zip(exercise.wrong, verdicts):
        assert verdict.status == WRONG and DIAGNOSES[exercise_id][name] in verdict.message, \
            (name, verdict.line)


@pytest.mark.slow
def test_distributed_checkers_name_each_mistake_in_one_launch():
    spread = [find(e) for e in DIAGNOSES if find(e).distributed]
    assert {e.id for e in spread} == {"09.ring_all_reduce", "10.sum_stats", "11.zero1_step"}
    cases = [(e, e.cell(e.reference), None) for e in spread]
    cases += [(e, e.cell(body), name) for e in spread for name, body in e.wrong.items()]
    verdicts = judge_sources([(e, source) for e, source, _ in cases], timeout_s=5)
    for (exercise, _, name), verdict in zip(cases, verdicts):
        if name is None:
            assert verdict.status == CORRECT, verdict.line
        else:
            assert verdict.status == WRONG, (name, verdict.line)
            assert DIAGNOSES[exercise.id][name] in verdict.message, (name, verdict.line)
