"""The distributed exercises' catalogues checked once for the whole session: the checks
run in one launch of gloo processes at 2, 3 and 4 ranks (starting them costs more than
the checks); test_checkers.py judges the results, test_mutants.py judges the same results
with mutated judges."""
from __future__ import annotations

import pytest
from right_answers import answers

from kosmoss.exercises import exercises
from kosmoss.exercises.distributed import run_checks


@pytest.fixture(scope="session")
def distributed_catalogue():
    """{exercise id: [(kind, name, cell source, what the ranks returned)]}, in the order
    of ``answers``."""
    items = [(exercise, kind, name, exercise.cell(body))
             for exercise in exercises() if exercise.distributed
             for kind, name, body in answers(exercise)]
    # no entry hangs: a loaded CI is slow
    checked = run_checks([(e, source) for e, _, _, source in items], exercise_timeout_s=600)
    found = {}
    for (exercise, kind, name, source), result in zip(items, checked):
        found.setdefault(exercise.id, []).append((kind, name, source, result))
    return found
