"""Judging learners' cells: in fresh processes (:mod:`.distributed`: the distributed ones
at 2, 3 and 4 gloo ranks), or in the notebook's own namespace, and turning what a checker
found into one :class:`~.core.Verdict` line."""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.errors import UsageError
from .core import (CORRECT, ERROR, WRONG, Exercise, LearnerRaised, NotAnswered, Verdict, find,
                   marked_id)
from .distributed import LEFT_ALONE, Checked, run_checks
from .guard import UsedReference, guarding, imported_reference, verdict_for


def verdict(exercise: Exercise, judged: Callable[[], Tuple[bool, str]]) -> Verdict:
    """Judge in this process (the notebook's namespace), the reference guarded."""
    try:
        with guarding(exercise.forbidden):
            ok, message = judged()
    except (NotAnswered, UsedReference) as err:
        return Verdict(exercise.id, WRONG, str(err))
    except LearnerRaised as err:
        return Verdict(exercise.id, ERROR, str(err))
    return Verdict(exercise.id, CORRECT if ok else WRONG, message)


def judge_sources(items: Sequence[Tuple[Exercise, str]], *,
                  timeout_s: Optional[float] = None,
                  exercise_timeout_s: Optional[float] = None) -> List[Verdict]:
    """Judge cells given as source, in order, each in fresh processes (one launch for all:
    starting processes costs more than the checks). ``timeout_s``: a collective's."""
    verdicts: Dict[int, Verdict] = {}
    for i, (exercise, source) in enumerate(items):
        said = prejudged(exercise, source)
        if said is not None:
            verdicts[i] = said
    rest = [i for i in range(len(items)) if i not in verdicts]
    checked = run_checks([items[i] for i in rest], collective_timeout_s=timeout_s,
                         exercise_timeout_s=exercise_timeout_s)
    for i, result in zip(rest, checked):
        verdicts[i] = judge_checked(items[i][0], result)
    return [verdicts[i] for i in range(len(items))]


def prejudged(exercise: Exercise, source: str) -> Optional[Verdict]:
    """The verdict of a cell that needs no process to judge: still the lesson's skeleton, or
    importing the reference; None for any other."""
    if untouched(exercise, source):
        return Verdict(exercise.id, WRONG, "not answered yet: your cell is still the one the "
                       "lesson ships")
    used = imported_reference(source, exercise.forbidden)
    return Verdict(exercise.id, WRONG, verdict_for(used)) if used else None


def untouched(exercise: Exercise, source: str) -> bool:
    return source.split() == exercise.skeleton.split()


def judge_checked(exercise: Exercise, result: Checked) -> Verdict:
    """The verdict on what came back from the processes."""
    if result.failure:
        return Verdict(exercise.id, ERROR, result.failure)
    if not exercise.distributed:
        return _in_process(exercise, result.outcomes[0][0])
    judged = []
    for size in exercise.world_sizes:
        stopped = _stopped(exercise, size, result.outcomes.get(size, []))
        if stopped:
            return stopped
        ok, message = _judge_ranks(exercise, result.outcomes[size])
        judged.append((size, ok, message))
    return _combined(exercise, tuple(judged))


def _in_process(exercise: Exercise, outcome) -> Verdict:
    if outcome.kind == "ok":
        ok, message = outcome.value
        return Verdict(exercise.id, CORRECT if ok else WRONG, message)
    return Verdict(exercise.id, ERROR if outcome.kind == "raised" else WRONG, outcome.value)


def _stopped(exercise: Exercise, size: int, outcomes) -> Optional[Verdict]:
    """A rank that raised, was not answered, or used the reference: that is the verdict
    (a rank's own error first: the others were then left alone in a collective)."""
    order = sorted(range(len(outcomes)), key=lambda r: outcomes[r].kind == "raised"
                   and outcomes[r].value.startswith(LEFT_ALONE))
    for rank in order:
        outcome = outcomes[rank]
        if outcome.kind in ("raised", "not-answered", "used-reference"):
            status = ERROR if outcome.kind == "raised" else WRONG
            where = f"at {size} ranks, rank {rank}: " if outcome.kind == "raised" else ""
            return Verdict(exercise.id, status, where + outcome.value)
    return None


def _judge_ranks(exercise: Exercise, outcomes) -> Tuple[bool, str]:
    try:
        return exercise.judge([outcome.value for outcome in outcomes])
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as err:
        # What the learner returned is not what the statement asks for.
        return False, f"the checker could not read what your code returned ({err})"


def _combined(exercise: Exercise, judged) -> Verdict:
    for size, ok, message in judged:
        if not ok:
            return Verdict(exercise.id, WRONG, f"at {size} ranks: {message}", judged)
    sizes = [str(size) for size, _, _ in judged]
    where = f"at {', '.join(sizes[:-1])} and {sizes[-1]} ranks" if len(sizes) > 1 \
        else f"at {sizes[0]} ranks"
    return Verdict(exercise.id, CORRECT, f"{where}: {judged[-1][2]}", judged)


def check_in_notebook(exercise_id: str, namespace: Optional[Dict[str, Any]]) -> bool:
    """The checker cell. Prints one line; never raises (a bad id prints it too)."""
    try:
        exercise = find(exercise_id)
    except UsageError as err:
        print(f"error: {exercise_id} — {err}")
        return False
    if namespace is None:
        namespace = sys._getframe(2).f_globals  # check("id") without globals(): the caller's
    source = cell_source(exercise, namespace)
    used = imported_reference(source, exercise.forbidden) if source else None
    if used:
        result = Verdict(exercise.id, WRONG, verdict_for(used))
    elif not exercise.distributed:
        result = verdict(exercise, lambda: exercise.judge(namespace))
    elif source is None:
        result = Verdict(exercise.id, WRONG, "could not find your cell's code: run the "
                         f"cell that starts with `# exercise: {exercise.id}` first")
    else:
        result = judge_sources([(exercise, source)])[0]
    print(result.line, flush=True)
    return result.correct


def cell_source(exercise: Exercise, namespace: Dict[str, Any]) -> Optional[str]:
    """The learner's cell as they last ran it: IPython's input history (``In``), else the
    source of the functions it defines."""
    for entry in reversed(list(namespace.get("In") or [])):
        if marked_id(entry) == exercise.id:
            return entry
    sources = []
    for name in exercise.names:
        try:
            sources.append(inspect.getsource(namespace[name]))
        except (KeyError, OSError, TypeError):
            return None
    return "\n\n".join(sources) or None
