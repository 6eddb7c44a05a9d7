"""Every checker, run for real, on every answer its exercise's catalogue lists.

- The reference solution is "correct" (for a distributed exercise: at 2, 3 and 4 ranks).
- Every catalogued mistake is rejected with a message that names it (``Mistake.says``),
  and, for a distributed exercise, at exactly the world sizes where it is wrong: a
  hard-coded world size of 2 passes at 2 ranks and must fail at 3 and 4.
- The shipped skeleton is "not answered yet".

The in-process exercises run in one launch of one process, the distributed ones in one
launch of 4 gloo processes (starting interpreters costs more than the checks).
"""
from __future__ import annotations

import re

import pytest
from right_answers import RIGHT

from kosmoss.exercises import check, exercises, skeleton, statement
from kosmoss.exercises.core import (CORRECT, ERROR, LESSON_MODULES, WORLD_SIZES, WRONG, find,
                                    marked_id, run_cell)
from kosmoss.exercises.judging import cell_source, judge_checked, judge_sources, prejudged

ALL = exercises()
IN_PROCESS = [e for e in ALL if not e.distributed]
DISTRIBUTED = [e for e in ALL if e.distributed]
REJECTED = (WRONG, ERROR)  # a mistake that raises (a division by zero) is rejected too


def _catalogue_items(chosen):
    """(exercise, mistake name — None for the reference, "right N" for another right
    answer — cell source)."""
    items = []
    for exercise in chosen:
        items.append((exercise, None, exercise.cell(exercise.reference)))
        items += [(exercise, f"right {i}", exercise.cell(body))
                  for i, body in enumerate(RIGHT.get(exercise.id, []))]
        items += [(exercise, name, exercise.cell(m.body))
                  for name, m in exercise.mistakes.items()]
    return items


def _judged(chosen, **limits):
    items = _catalogue_items(chosen)
    verdicts = judge_sources([(e, source) for e, _, source in items], **limits)
    judged = {}
    for (exercise, name, _), verdict in zip(items, verdicts):
        judged.setdefault(exercise.id, {})[name] = verdict
    return judged


@pytest.fixture(scope="module")
def in_process_verdicts():
    return _judged(IN_PROCESS)


@pytest.fixture(scope="module")
def distributed_verdicts(distributed_catalogue):
    """As judge_sources judges each catalogued cell, from the session's one launch."""
    judged = {}
    for exercise in DISTRIBUTED:
        for _, name, source, result in distributed_catalogue[exercise.id]:
            said = prejudged(exercise, source) or judge_checked(exercise, result)
            judged.setdefault(exercise.id, {})[None if name == "reference" else name] = said
    return judged


def test_every_lesson_has_one_to_three_exercises():
    per_lesson = {lesson: [e for e in ALL if e.lesson == lesson] for lesson in LESSON_MODULES}
    assert all(1 <= len(found) <= 3 for found in per_lesson.values()), per_lesson
    assert len({e.id for e in ALL}) == len(ALL)
    assert {e.id for e in DISTRIBUTED} >= {"03.average_gradients", "metrics.exact_val_loss",
                                           "09.ring_all_reduce", "10.sum_stats",
                                           "11.zero1_step"}


def test_every_exercise_has_a_right_answer_written_another_way():
    missing = [e.id for e in ALL if not RIGHT.get(e.id)]
    assert not missing, f"add a right answer to tests/exercises/right_answers.py: {missing}"


@pytest.mark.parametrize("exercise", ALL, ids=lambda e: e.id)
def test_exercise_is_complete(exercise):
    assert len(exercise.mistakes) >= 4, "a catalogue of at least four plausible mistakes"
    for name, mistake in exercise.mistakes.items():
        assert len(mistake.says) >= 8, f"{name}: the phrase its verdict must hold"
        assert set(exercise.wrong_at(name)) <= set(exercise.world_sizes or (0,)) | {0}, name
    if exercise.distributed:
        assert exercise.world_sizes == WORLD_SIZES
    assert statement(exercise.id).startswith(f"**{exercise.title}**")
    assert marked_id(skeleton(exercise.id)) == exercise.id
    assert exercise.checker_cell == (f'from kosmoss.exercises import check; '
                                     f'check("{exercise.id}", globals())')
    for name in exercise.names:
        assert f"`{name}(" in exercise.statement or f"`{name}`" in exercise.statement
        assert re.search(rf"^(def {name}\(|class {name}\b)", exercise.skeleton, re.M)


@pytest.mark.parametrize("exercise", IN_PROCESS, ids=lambda e: e.id)
def test_checker_accepts_reference_and_names_each_mistake(exercise, in_process_verdicts):
    judged = in_process_verdicts[exercise.id]
    assert judged[None].status == CORRECT, judged[None].line
    for i, _ in enumerate(RIGHT.get(exercise.id, [])):
        assert judged[f"right {i}"].status == CORRECT, judged[f"right {i}"].line
    for name, mistake in exercise.mistakes.items():
        verdict = judged[name]
        assert verdict.status in REJECTED, (name, verdict.line)
        assert mistake.says in verdict.message, (name, mistake.says, verdict.line)


@pytest.mark.slow
@pytest.mark.parametrize("exercise", DISTRIBUTED, ids=lambda e: e.id)
def test_distributed_checker_rejects_each_mistake_where_it_is_wrong(exercise,
                                                                    distributed_verdicts):
    judged = distributed_verdicts[exercise.id]
    reference = judged[None]
    assert reference.status == CORRECT, reference.line
    assert [(size, ok) for size, ok, _ in reference.per_world_size] == \
        [(size, True) for size in WORLD_SIZES]
    for i, _ in enumerate(RIGHT.get(exercise.id, [])):
        assert judged[f"right {i}"].status == CORRECT, judged[f"right {i}"].line
    for name, mistake in exercise.mistakes.items():
        verdict = judged[name]
        assert verdict.status in REJECTED, (name, verdict.line)
        assert mistake.says in verdict.message, (name, mistake.says, verdict.line)
        if verdict.status == WRONG:
            wrong_at = tuple(size for size, ok, _ in verdict.per_world_size if not ok)
            assert wrong_at == exercise.wrong_at(name), (name, verdict.per_world_size)


@pytest.mark.slow
def test_a_rank_that_raises_or_is_left_alone_is_an_error_naming_the_rank():
    average, exact = find("03.average_gradients"), find("metrics.exact_val_loss")
    only_rank0 = average.cell('''
        import torch.distributed as dist

        def average_gradients(model):
            if dist.get_rank() == 0:  # the others never join: rank 0 waits, then times out
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
        ''')
    raising = exact.cell('''
        def exact_val_loss(losses):
            return losses.sum() / 0 if False else 1 // 0
        ''')
    verdicts = judge_sources([(exact, raising), (average, only_rank0)], timeout_s=3)
    assert [v.status for v in verdicts] == [ERROR, ERROR], [v.line for v in verdicts]
    assert "ZeroDivisionError" in verdicts[0].message
    assert "line 3 of your cell" in verdicts[0].message
    assert verdicts[0].message.startswith("at 2 ranks, rank 0: ")
    assert verdicts[1].message.startswith("at 2 ranks, rank 0: was left alone in a collective")


def test_untouched_skeleton_is_not_answered_without_starting_processes():
    verdicts = judge_sources([(e, e.skeleton) for e in ALL])
    assert all(v.status == WRONG and "not answered yet" in v.message for v in verdicts)


def test_checker_cell_prints_one_line_and_never_raises(capsys):
    exercise = find("04.scaled_lr")
    assert check("04.scaled_lr", run_cell(exercise, exercise.cell(exercise.reference))) is True
    wrong = run_cell(exercise, exercise.cell(next(iter(exercise.mistakes.values())).body))
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


def test_distributed_judges_run_no_backward_in_the_learners_kernel(distributed_catalogue,
                                                                    monkeypatch):
    """Judging runs in the notebook's kernel; a backward there, with a GPU visible, would stop
    every rank the lesson forks afterwards (kosmoss.lessons.forks): the ranks compute what
    needs autograd, the kernel only compares."""
    import torch.autograd
    import torch.autograd.graph

    ran = []

    def engine(*args, **kwargs):
        ran.append(judging_now[0])
        return real(*args, **kwargs)

    real, judging_now = torch.autograd.graph._engine_run_backward, [None]
    monkeypatch.setattr(torch.autograd.graph, "_engine_run_backward", engine)
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", engine)
    for exercise in DISTRIBUTED:
        for _, name, source, result in distributed_catalogue[exercise.id]:
            judging_now[0] = exercise.id
            judge_checked(exercise, result)
    assert not ran, f"judges that ran a backward in this process: {sorted(set(ran))}"
