"""The two helpers the lessons share: ``script`` and ``sh``."""
import sys

import pytest

from helpers import REPO
from kosmoss.lessons import script, sh, source_root


def test_source_root_is_this_checkout():
    assert source_root() == REPO


def test_script_prefers_the_learners_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert script("trainup_cpu.py") == REPO / "trainup_cpu.py"
    (tmp_path / "trainup_cpu.py").write_text("# my edited copy\n")
    assert script("trainup_cpu.py") == tmp_path / "trainup_cpu.py"


def test_sh_shows_the_command_and_its_output(capsys):
    done = sh([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    printed = capsys.readouterr().out
    assert printed.startswith("$ python -c ") and "out\n" in printed and "err\n" in printed
    assert done.returncode == 0 and "out" in done.stdout


def test_sh_stops_the_lesson_when_a_step_fails(capsys):
    with pytest.raises(RuntimeError, match="exited with code 3"):
        sh([sys.executable, "-c", "raise SystemExit(3)"])
    assert sh([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode == 3
