"""Every checker, run for real: on its reference solution it must say "correct", on each
wrong solution what differs, on the shipped skeleton "not answered yet". The distributed
ones run in 2 gloo processes, all in one launch."""
from __future__ import annotations

import re

import pytest

from kosmoss.exercises import check, exercises, skeleton, statement
from kosmoss.exercises.core import CORRECT, ERROR, LESSON_MODULES, WRONG, find, marked_id, run_cell
from kosmoss.exercises.judging import cell_source, judge_sources

ALL = exercises()
IN_PROCESS = [e for e in ALL if not e.distributed]
DISTRIBUTED = [e for e in ALL if e.distributed]


def test_every_lesson_has_one_to_three_exercises():
    per_lesson = {lesson: [e for e in ALL if e.lesson == lesson] for lesson in LESSON_MODULES}
    assert all(1 <= len(found) <= 3 for found in per_lesson.values()), per_lesson
    assert len({e.id for e in ALL}) == len(ALL)
    assert {e.id for e in DISTRIBUTED} >= {"03.average_gradients", "metrics.exact_val_loss"}


@pytest.mark.parametrize("exercise", ALL, ids=lambda e: e.id)
def test_exercise_is_complete(exercise):
    assert exercise.wrong, "at least one wrong solution"
    assert statement(exercise.id).startswith(f"**{exercise.title}**")
    assert marked_id(skeleton(exercise.id)) == exercise.id
    assert exercise.checker_cell == (f'from kosmoss.exercises import check; '
                                     f'check("{exercise.id}", globals())')
    for name in exercise.names:
        assert f"`{name}(" in exercise.statement or f"`{name}`" in exercise.statement
        assert re.search(rf"^def {name}\(", exercise.skeleton, re.M)


@pytest.mark.parametrize("exercise", IN_PROCESS, ids=lambda e: e.id)
def test_checker_accepts_reference_and_names_each_mistake(exercise):
    items = [(exercise, exercise.cell(exercise.reference))]
    items += [(exercise, exercise.cell(wrong)) for wrong in exercise.wrong.values()]
    reference, *wrongs = judge_sources(items)
    assert reference.status == CORRECT, reference.line
    for name, verdict in zip(exercise.wrong, wrongs):
        assert verdict.status == WRONG, (name, verdict.line)
        assert "not answered" not in verdict.message and len(verdict.message) > 20, verdict.line


@pytest.mark.slow
def test_distributed_checkers_in_one_two_process_launch():
    average, exact = find("03.average_gradients"), find("metrics.exact_val_loss")
    only_rank0 = average.cell('''
        import torch.distributed as dist

        def average_gradients(model):
            if dist.get_rank() == 0:  # rank 1 never joins: rank 0 waits, then times out
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
        ''')
    raising = exact.cell('''
        def exact_val_loss(losses):
            return losses.sum() / 0 if False else 1 // 0
        ''')
    cases = ([(e, e.cell(e.reference), CORRECT) for e in DISTRIBUTED]
             + [(e, e.cell(w), WRONG) for e in DISTRIBUTED for w in e.wrong.values()]
             + [(exact, raising, ERROR), (average, only_rank0, ERROR)])
    verdicts = judge_sources([(e, source) for e, source, _ in cases], timeout_s=3)
    assert [v.status for v in verdicts] == [status for *_, status in cases], \
        "\n".join(v.line for v in verdicts)
    lines = {v.line for v in verdicts}
    assert any("2x DDP's" in line and "divide by the world size" in line for line in lines)
    assert any("average of the ranks' means" in line for line in lines)
    assert "ZeroDivisionError" in verdicts[-2].message
    assert "line 3 of your cell" in verdicts[-2].message
    assert verdicts[-1].message.startswith("rank 0: was left alone in a collective")


def test_untouched_skeleton_is_not_answered_without_starting_processes():
    verdicts = judge_sources([(e, e.skeleton) for e in ALL])
    assert all(v.status == WRONG and "not answered yet" in v.message for v in verdicts)


def test_checker_cell_prints_one_line_and_never_raises(capsys):
    exercise = find("04.scaled_lr")
    assert check("04.scaled_lr", run_cell(exercise, exercise.cell(exercise.reference))) is True
    wrong = run_cell(exercise, exercise.cell(next(iter(exercise.wrong.values()))))
    assert check("04.scaled_lr", wrong) is False
    raising = run_cell(exercise, exercise.cell('''
        def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
            return base_lr / 0
        '''))
    assert check("04.scaled_lr", raising) is False
    assert check("04.no_such_exercise", {}) is False
    assert check("04.scaled_lr", {}) is False
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("correct: 04.scaled_lr — ")
    assert lines[1].startswith("wrong: 04.scaled_lr — rule ")
    assert lines[2] == ("error: 04.scaled_lr — your code raised ZeroDivisionError: float "
                        "division by zero (line 3 of your cell)")
    assert lines[3].startswith("error: 04.no_such_exercise — unknown exercise")
    assert lines[4] == ("wrong: 04.scaled_lr — your cell does not define `scaled_lr`: run the "
                        "exercise cell first")
    assert len(lines) == 5


def test_distributed_source_is_the_last_run_of_the_marked_cell():
    exercise = find("03.average_gradients")
    first, latest = exercise.cell("def average_gradients(model): pass"), exercise.skeleton
    history = ["import torch", first, "print(1)", latest, "check(...)"]
    assert cell_source(exercise, {"In": history}) == latest
    assert cell_source(exercise, {"In": ["import torch"]}) is None
