"""scripts/mutants_report.py sorts mutmut's survivors: a mutant that only rewords a verdict
is set apart from one that changes what a checker computes, the ones a maintainer reads."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutants_report.py"
_spec = importlib.util.spec_from_file_location("mutants_report", SCRIPT)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

NAME = "kosmoss.exercises.lesson03.x_batch_judge__mutmut_7"


def diff(removed: str, added: str) -> str:
    return f"--- a.py\n+++ b.py\n@@ -1 +1 @@\n-{removed}\n+{added}\n"


@pytest.mark.parametrize("removed, added", [
    ('    return failed(f"yours {got!r}: return a pair")', '    return failed(None)'),
    ('    why = "NCCL refuses two ranks on one GPU"',
     '    why = "XXNCCL refuses two ranks on one GPUXX"'),
    ("    hint = 'rounded up' if gpus else ''", "    hint = 'ROUNDED UP' if gpus else ''"),
    ('    return passed(f"matches in {n} set-ups")', '    return passed(None)'),
])
def test_a_mutant_that_only_rewords_is_words(removed, added):
    assert report.only_words(NAME, diff(removed, added))


@pytest.mark.parametrize("removed, added", [
    ("    if not isinstance(raised.original, ValueError):",
     "    if isinstance(raised.original, ValueError):"),
    ("    return bool(named) or any(w in message for w in REASONS)",
     "    return bool(named) and any(w in message for w in REASONS)"),
    ('    if backend == "nccl" and gpus:',  # a compared string
     '    if backend == "XXncclXX" and gpus:'),
    ("    cases = (0, 1, 2, 3)", "    cases = (0, 2, 2, 3)"),
])
def test_a_mutant_that_changes_what_is_computed_is_logic(removed, added):
    assert not report.only_words(NAME, diff(removed, added))


def test_a_hint_functions_mutants_are_words():
    assert report.only_words("kosmoss.exercises.lesson04.x__warmup_hint__mutmut_29",
                             diff("    if warmup == 0:", "    if warmup == 1:"))
