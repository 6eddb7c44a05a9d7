"""Exercises that check themselves: the learner writes code in a marked cell, a checker
runs it (distributed ones at 2, 3 and 4 real gloo processes) and says "correct" or what
differs.

The contract (the lessons and ``kosmoss check`` rely on it):

- An **exercise cell** is a code cell whose first line is ``# exercise: <lesson>.<name>``
  (e.g. ``# exercise: 03.average_gradients``). It defines the function(s) named in the
  exercise's statement and must work on its own: the checker may run the cell alone, in
  a fresh namespace or in new processes, so it imports what it uses.
- The **checker cell** right after it is::

      from kosmoss.exercises import check; check("03.average_gradients", globals())

  It prints one line and returns a bool; it never raises for a wrong answer:
  ``correct: 03.average_gradients — ...`` / ``wrong: 03.average_gradients — <what
  differs>`` / ``error: 03.average_gradients — <the error your code raised>``.
  Distributed exercises take the cell's source from IPython's input history (``In``),
  or from ``inspect.getsource`` of the functions, and run it at 2, 3 and 4 gloo processes.
- From a terminal (the learner's notebook is only read, never modified)::

      kosmoss check 03                          # every exercise of lesson 03
      kosmoss check 03 average_gradients        # one exercise
      kosmoss check 03 --notebook my/03_data_parallelism.ipynb   # .ipynb or jupytext .py
      kosmoss check --list [--json]             # every lesson's exercises, one line each
      kosmoss check 03 --json

  The default notebook is the lesson's copy in the working folder of ``kosmoss lessons``
  (the current folder if it holds that folder's manifest, else ``./kosmoss-lessons``);
  when both ``.ipynb`` and ``.py`` are there, the one saved last. Exit code 0: all
  correct; 1: one is wrong (or not answered yet); 2: unknown lesson or exercise, no
  marked cell, or a cell that raises, defines another name, hangs, prints megabytes or
  ends its own process (one line naming the exercise; the others are still checked).
- ``statement("03.average_gradients")`` is the exercise's markdown (its first line is the
  one-line summary ``--list`` prints); ``skeleton(...)`` the exercise cell to start from;
  ``checker_cell(...)`` the line above; ``exercises(lesson=None)`` the catalogue.

Lessons: ``01`` .. ``11`` and ``metrics`` (the DDP-metrics lab, whose notebook's file name
contains ``metrics``). Each lesson's module (``lesson01.py`` .. ``lesson11.py``,
``metrics.py``) holds its exercises: statement, skeleton, checker, a reference solution
and a catalogue of at least four plausible mistakes each; tests/exercises runs the checker
on all of them at every world size (docs/exercises.md).
"""
from __future__ import annotations

from typing import Any, Dict, Optional


def check(exercise_id: str, namespace: Optional[Dict[str, Any]] = None) -> bool:
    """The checker cell: judge what the notebook defined, print one line, return True if
    correct. Never raises for a wrong answer or for an error in the learner's code."""
    from .judging import check_in_notebook

    return check_in_notebook(exercise_id, namespace)


def statement(exercise_id: str) -> str:
    from .core import find

    return find(exercise_id).statement


def skeleton(exercise_id: str) -> str:
    from .core import find

    return find(exercise_id).skeleton


def checker_cell(exercise_id: str) -> str:
    from .core import find

    return find(exercise_id).checker_cell


def exercises(lesson: Optional[str] = None):
    """Every exercise, in lesson order (or one lesson's)."""
    from .core import catalogue

    return catalogue(lesson)
