"""The two helpers the lessons share: ``script`` and ``sh``."""
import sys

import pytest

from helpers import REPO
from kosmoss.lessons import NOTEBOOK_COLUMNS, QUICK_ENV, quick, quiet_lightning, script, sh, source_root


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


def test_sh_sizes_tables_to_a_notebook(capsys):
    done = sh([sys.executable, "-c", "import os; print(os.environ['COLUMNS'])"])
    assert done.stdout.strip() == str(NOTEBOOK_COLUMNS)


def test_quick_mode_follows_the_environment(monkeypatch):
    monkeypatch.delenv(QUICK_ENV, raising=False)
    assert not quick()
    monkeypatch.setenv(QUICK_ENV, "1")
    assert quick()
    monkeypatch.setenv(QUICK_ENV, "0")
    assert not quick()


def test_quiet_lightning_hides_banners_and_keeps_real_warnings_on_one_line(monkeypatch, capsys):
    import logging
    import warnings

    from pytorch_lightning.utilities import rank_zero_info

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    logger = logging.getLogger("pytorch_lightning")
    monkeypatch.setattr(logger, "level", logger.level)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_lightning()
        rank_zero_info("GPU available: False, used: False")
        warnings.warn("The dataloader does not have many workers which may be a bottleneck")
        warnings.warn("a real one")
    assert not logging.getLogger("pytorch_lightning.utilities.rank_zero").isEnabledFor(logging.INFO)
    assert "GPU available" not in capsys.readouterr().err
    assert [str(w.message) for w in caught] == ["a real one"]
    assert warnings.formatwarning(UserWarning("a real one"), UserWarning, "x.py", 3) == \
        "UserWarning: a real one\n"
