"""The helpers the lessons share: ``script``, ``sh`` and ``on_ranks``."""
import json
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO

from kosmoss.lessons.course import (NOTEBOOK_COLUMNS, QUICK_ENV, forked, on_ranks, quick,
                                    quiet_lightning, script, sh, source_root)


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
    with pytest.raises(RuntimeError, match="exited with code 3$"):
        sh([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="exited with code 2: error: --gpus 2: no GPU$"):
        sh([sys.executable, "-c", "print('error: --gpus 2: no GPU\\n'); raise SystemExit(2)"])
    assert sh([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode == 3


def test_sh_sizes_tables_to_a_notebook_unless_columns_are_set(capsys, monkeypatch):
    printed = [sys.executable, "-c", "import os; print(os.environ['COLUMNS'])"]
    monkeypatch.delenv("COLUMNS", raising=False)  # a kernel's environment has none
    assert sh(printed).stdout.strip() == str(NOTEBOOK_COLUMNS)
    monkeypatch.setenv("COLUMNS", "80")  # a learner's own width is kept
    assert sh(printed).stdout.strip() == "80"


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


def _sum_ranks(rank, world_size, port, folder):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    (folder / f"rank{rank}.json").write_text(json.dumps(
        {"sum": total.item(), "threads": torch.get_num_threads()}))
    dist.destroy_process_group()


def test_on_ranks_runs_a_function_of_this_process_on_forked_gloo_ranks(tmp_path):
    on_ranks(_sum_ranks, 3, tmp_path)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert seen == [{"sum": 6.0, "threads": 1}] * 3


def _stuck(rank, world_size, port, folder):
    (folder / f"pid{rank}").write_text("")
    time.sleep(600)


@pytest.mark.slow
def test_on_ranks_that_hang_fail_the_cell_with_their_stacks_and_are_ended(tmp_path):
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(TimeoutError, match="did not finish within 3 s") as raised:
        on_ranks(_stuck, 2, tmp_path, timeout_s=3)
    assert "_stuck" in str(raised.value)  # py-spy's stack names where each rank was
    time.sleep(0.5)
    assert {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE} \
        <= before


@pytest.mark.parametrize("cores, ranks", [(4, 2), (16, 2), (16, 3), (16, 4)])
def test_ranks_forked_by_lightnings_notebook_launcher_do_not_hang_on_many_cores(cores, ranks):
    """Lightning gives each forked rank cores ÷ ranks OpenMP threads; more than one in a
    rank forked from a kernel that computed on several threads hangs (GNU OpenMP's pool does
    not survive a fork): lessons 3 and 3b hung on the 16 cores of a GPU machine, never on
    CI's 2. The script pretends to have ``cores`` cores; without the guard it hangs (checked
    by hand: ``python tests/lessons/notebook_launcher.py 8 2 bare``)."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "lessons" / "notebook_launcher.py"),
                           str(cores), str(ranks), "guarded"], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    # The kernel's own threads and environment are back.
    assert "fit returned; threads 2 OMP_NUM_THREADS None" in done.stdout


def _where_and_threads(base):
    import os

    import torch

    return os.getpid(), torch.get_num_threads(), base ** 2


def _fails():
    raise ValueError("the function's own error")


def test_forked_runs_a_function_in_another_process_and_returns_its_result():
    import os

    pid, threads, squared = forked(_where_and_threads, 12)
    assert pid != os.getpid() and threads == 1 and squared == 144
    with pytest.raises(ValueError, match="the function's own error"):
        forked(_fails)
