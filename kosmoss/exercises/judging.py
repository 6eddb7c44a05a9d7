"""Judging learners' cells: in this process, or in gloo ranks (:mod:`.distributed`), and
turning what a checker found into one :class:`~.core.Verdict` line."""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.errors import UsageError
from .core import (CORRECT, ERROR, WRONG, Exercise, LearnerRaised, NotAnswered, Verdict, find,
                   marked_id, run_cell)
from .distributed import run_in_ranks


def verdict(exercise: Exercise, judged: Callable[[], Tuple[bool, str]]) -> Verdict:
    try:
        ok, message = judged()
    except NotAnswered as err:
        return Verdict(exercise.id, WRONG, str(err))
    except LearnerRaised as err:
        return Verdict(exercise.id, ERROR, str(err))
    return Verdict(exercise.id, CORRECT if ok else WRONG, message)


def judge_sources(items: Sequence[Tuple[Exercise, str]], *,
                  timeout_s: Optional[float] = None) -> List[Verdict]:
    """Judge cells given as source, in order. The distributed ones share one launch of
    2 gloo processes (starting processes costs more than the checks)."""
    verdicts: Dict[int, Verdict] = {}
    for i, (exercise, source) in enumerate(items):
        if untouched(exercise, source):  # no need to start processes to say so
            verdicts[i] = Verdict(exercise.id, WRONG, "not answered yet: your cell is still "
                                  "the one the lesson ships")
    spread = [(i, ex, src) for i, (ex, src) in enumerate(items)
              if ex.distributed and i not in verdicts]
    for i, (exercise, source) in enumerate(items):
        if not exercise.distributed and i not in verdicts:
            verdicts[i] = verdict(exercise, lambda e=exercise, s=source: e.judge(run_cell(e, s)))
    if spread:
        outcomes = run_in_ranks([(ex, src) for _, ex, src in spread], timeout_s=timeout_s)
        for (i, exercise, _), ranks in zip(spread, outcomes):
            verdicts[i] = verdict(exercise, lambda e=exercise, r=ranks: judge_ranks(e, r))
    return [verdicts[i] for i in range(len(items))]


def untouched(exercise: Exercise, source: str) -> bool:
    return source.split() == exercise.skeleton.split()


def judge_ranks(exercise: Exercise, ranks) -> Tuple[bool, str]:
    """Every rank ran; raise what a rank raised (timeouts explained), else judge."""
    for rank, outcome in enumerate(ranks):
        if outcome.kind == "not-answered":
            raise NotAnswered(outcome.value)
        if outcome.kind == "raised":
            raise LearnerRaised(f"rank {rank}: {outcome.value}")
    return exercise.judge([outcome.value for outcome in ranks])


def check_in_notebook(exercise_id: str, namespace: Optional[Dict[str, Any]]) -> bool:
    """The checker cell. Prints one line; never raises (a bad id prints it too)."""
    try:
        exercise = find(exercise_id)
    except UsageError as err:
        print(f"error: {exercise_id} — {err}")
        return False
    if namespace is None:
        namespace = sys._getframe(2).f_globals  # check("id") without globals(): the caller's
    if exercise.distributed:
        source = cell_source(exercise, namespace)
        if source is None:
            result = Verdict(exercise.id, WRONG, "could not find your cell's code: run the "
                             f"cell that starts with `# exercise: {exercise.id}` first")
        else:
            result = judge_sources([(exercise, source)])[0]
    else:
        result = verdict(exercise, lambda: exercise.judge(namespace))
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
