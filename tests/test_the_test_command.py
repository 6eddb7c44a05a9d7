"""Most tests may run in two pytest-xdist workers (docs/maintaining.md), the ``whole_machine``
ones alone afterwards (tests/conftest.py): a test that ends every home's ghosts or counts
the machine's namespaces must not run beside another worker's runs."""
import os
import re
import subprocess
import sys

from helpers import REPO, WHOLE_MACHINE

# What looks beyond a test's own KOSMOSS_HOME: ending every ghost of the user, listing the
# machine's namespaces, running the course's lessons (6, 10 and 12 do both).
MACHINE_WIDE = re.compile(r'"ghosts",[^\]\n]*"--kill"|existing_namespaces\(|kosmoss_namespaces\('
                          r'|execute_lessons\(|LESSON_GLOB')


def test_what_looks_at_the_whole_machine_is_in_a_whole_machine_folder():
    outside = [path.relative_to(REPO) for path in (REPO / "tests").rglob("*.py")
               if path.parent.name not in WHOLE_MACHINE and path.name != "test_the_test_command.py"
               and MACHINE_WIDE.search(path.read_text())]
    assert not outside, f"move these under one of {WHOLE_MACHINE}, or narrow them: {outside}"


def test_whole_machine_tests_given_workers_stop_pytest_saying_how_to_run_them():
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYTEST_XDIST")}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile",
                          "-p", "no:cacheprovider", "tests/ghosts/test_cli.py",
                          "tests/test_model.py"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 4, ran.stdout[-2000:]  # pytest's usage error
    assert re.search(r"tests/ghosts/test_cli\.py::.+? \(and \d+ more\) look at the whole machine "
                     r'and must run alone: add -m "not whole_machine" to this -n run', ran.stdout)
    assert " passed" not in ran.stdout  # stopped before any test ran
