"""The distributed exercises' catalogues checked once for the whole session: the checks
run in one launch of gloo processes at 2, 3 and 4 ranks (starting them costs more than
the checks); test_checkers.py judges the results, test_mutants.py judges the same results
with mutated judges. Under pytest-xdist the workers share that one launch through a file.
"""
from __future__ import annotations

import os
import pickle

import pytest
from filelock import FileLock  # a requirement of torch's own
from right_answers import answers

from kosmoss.exercises import exercises
from kosmoss.exercises.distributed import run_checks


@pytest.fixture(scope="session")
def distributed_catalogue(tmp_path_factory):
    """{exercise id: [(kind, name, cell source, what the ranks returned)]}, in the order
    of ``answers``."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _launched()
    # The workers' folders share a parent: the first worker launches, the others read
    # (pytest-xdist's documented way to run a session fixture once).
    shared = tmp_path_factory.getbasetemp().parent / "distributed-catalogue.pickle"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_bytes(pickle.dumps(_launched()))
        return pickle.loads(shared.read_bytes())


def _launched():
    items = [(exercise, kind, name, exercise.cell(body))
             for exercise in exercises() if exercise.distributed
             for kind, name, body in answers(exercise)]
    # no entry hangs: a loaded CI is slow
    checked = run_checks([(e, source) for e, _, _, source in items], exercise_timeout_s=600)
    found = {}
    for (exercise, kind, name, source), result in zip(items, checked):
        found.setdefault(exercise.id, []).append((kind, name, source, result))
    return found
