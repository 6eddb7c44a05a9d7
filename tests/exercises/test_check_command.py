"""``kosmoss check``: reads the learner's notebook (never writes it), says per exercise
"correct" or what differs, exit codes 0 / 1 / 2; and the checker cell in a real kernel."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from kosmoss import cli
from kosmoss.exercises import exercises
from kosmoss.exercises import distributed
from kosmoss.exercises.core import find
from kosmoss.exercises.notebook import MANIFEST, default_notebook


def notebook(path, cells):
    """Write a notebook of code cells as .ipynb or jupytext .py (by suffix)."""
    import jupytext
    import nbformat

    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    jupytext.write(book, path, fmt="py:percent" if path.suffix == ".py" else "ipynb")
    return path


def answer(exercise_id, which="reference"):
    exercise = find(exercise_id)
    body = (exercise.reference if which == "reference"
            else next(iter(exercise.mistakes.values())).body)
    return exercise.cell(body)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_list_names_every_exercise(capsys):
    assert cli.main(["check", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [e.id for e in exercises()]
    assert any(line.startswith("03.average_gradients") and "2, 3 and 4 gloo processes" in line
               for line in lines)
    assert cli.main(["check", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {item["id"] for item in listed} == {e.id for e in exercises()}
    assert all(item["title"] and item["defines"] for item in listed)


def test_wrong_answer_exit_1_and_notebook_untouched(tmp_path, capsys):
    path = notebook(tmp_path / "04_mine.ipynb", [
        "import math", answer("04.scaled_lr"), answer("04.warmup_lr", "wrong"),
        answer("04.noise_scale"), "print('end')"])
    before = sha(path)
    assert cli.main(["check", "04", "--notebook", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "correct: 04.scaled_lr — " in out
    assert "wrong: 04.warmup_lr — warm-up from 0.001 to 0.008 over 10 steps: at step 0" in out
    assert err == "kosmoss check: failed: 1 of 3 exercise(s) not correct yet: 04.warmup_lr\n"
    assert sha(path) == before
    assert cli.main(["check", "04", "scaled_lr", "--notebook", str(path), "--json"]) == 0
    answer_json = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in answer_json["results"]] == ["correct"]


def test_jupytext_py_notebook_all_correct(tmp_path, capsys):
    path = notebook(tmp_path / "05_devices.py", [answer(e.id) for e in exercises("05")])
    assert cli.main(["check", "05", "--notebook", str(path)]) == 0
    assert capsys.readouterr().out.count("correct: 05.") == 2


def test_raising_cell_and_bad_input_exit_2_with_one_line(tmp_path, capsys):
    path = notebook(tmp_path / "07.ipynb", [
        "# exercise: 07.rank_arithmetic\nimport no_such_module_here\n"])
    assert cli.main(["check", "07", "--notebook", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == ("kosmoss check: error: 07.rank_arithmetic — your code raised "
                   "ModuleNotFoundError: No module named 'no_such_module_here' (line 2 of "
                   "your cell)\n")
    for argv, needle in ((["check", "42"], "unknown lesson '42'"),
                         (["check", "07", "nope", "--notebook", str(path)], "unknown exercise"),
                         (["check", "06", "--notebook", str(path)],
                          "has no cell whose first line is `# exercise: 06.port_holder`"),
                         (["check", "07", "--notebook", str(tmp_path / "gone.ipynb")],
                          "--notebook"),
                         (["check", "03c"], "unknown lesson '03c'"),
                         (["check", "3c"], "unknown lesson '3c'"),  # as typed
                         (["check"], "give a lesson (01, 02, 03, 03b, 04,")):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
        assert "metrics" not in err, "a learner types 03b, not the lab's key"


@pytest.mark.parametrize("typed, key", [("03b", "metrics"), ("3b", "metrics"), ("3B", "metrics"), ("3", "03"),
                                        ("8b", "08b"), ("metrics", "metrics"), ("12", "12")])
def test_a_lesson_is_found_by_the_number_the_course_gives_it(typed, key, tmp_path, capsys):
    """Lesson 3b's lab answers to 03b as 08b and 09b do; one digit is the lesson's too."""
    assert cli.main(["check", "--list", typed]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [e.id for e in exercises(key)]
    one = next(e for e in exercises(key) if e.rank_task is None)  # no ranks to start
    path = notebook(tmp_path / "mine.ipynb", [answer(one.id)])
    assert cli.main(["check", typed, one.name, "--notebook", str(path)]) == 0
    assert f"correct: {one.id} — " in capsys.readouterr().out


def test_default_notebook_is_the_working_folders_last_saved_copy(tmp_path):
    folder = tmp_path / "kosmoss-lessons"
    folder.mkdir()
    py = notebook(folder / "03_data_parallelism.py", ["print(1)"])
    ipynb = notebook(folder / "03_data_parallelism.ipynb", ["print(1)"])
    os.utime(py, (1e9, 1e9))
    assert default_notebook("03", tmp_path) == ipynb  # from the parent folder
    (folder / MANIFEST).write_text("{}")
    os.utime(ipynb, (1e8, 1e8))
    assert default_notebook("03", folder) == py  # from inside it, the newer copy
    with pytest.raises(Exception, match="run `kosmoss lessons`"):
        default_notebook("04", folder)


@pytest.mark.slow
def test_checker_cell_in_a_real_kernel_runs_the_cell_in_two_ranks(tmp_path):
    """The learner's way: the checker cell executed in a Jupyter kernel takes the cell's
    source from IPython's history and runs it in 2 gloo ranks."""
    import nbclient
    import nbformat

    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        answer("metrics.exact_val_loss"),
        'from kosmoss.exercises import check; ok = check("metrics.exact_val_loss", globals())',
        "assert ok is True, 'the checker cell said no'")])
    nbclient.NotebookClient(book, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(o.get("text", "") for o in book.cells[1].outputs)
    assert printed.startswith("correct: metrics.exact_val_loss — "), book.cells[1].outputs


# A cell for 04.warmup_lr that is bad input in each way a learner's notebook can be.
BAD_WARMUP = {
    "defines another name": ("def warm_up(step, warmup_steps, base_lr, target_lr):\n"
                             "    return target_lr\n",
                             "does not define `warmup_lr` (it defines `warm_up`)"),
    "a syntax error": ("def warmup_lr(step, warmup_steps, base_lr, target_lr)\n"
                       "    return target_lr\n", "SyntaxError"),
    "hangs": ("def warmup_lr(step, warmup_steps, base_lr, target_lr):\n"
              "    while True:\n        pass\n", "did not finish within 8 s"),
    "prints megabytes": ("import sys\n\n\ndef warmup_lr(step, warmup_steps, base_lr, target_lr):\n"
                         "    for _ in range(200):\n        print('x' * 10000)\n"
                         "        print('y' * 10000, file=sys.stderr)\n"
                         "    return target_lr\n", "printed more than 1 MiB"),
    "kills its own process": ("import os, signal\n\n\n"
                              "def warmup_lr(step, warmup_steps, base_lr, target_lr):\n"
                              "    os.kill(os.getpid(), signal.SIGKILL)\n",
                              "was killed by SIGKILL"),
    "calls sys.exit": ("import sys\n\n\ndef warmup_lr(step, warmup_steps, base_lr, target_lr):\n"
                       "    sys.exit(3)\n", "SystemExit"),
}


@pytest.mark.slow
def test_a_flood_is_charged_to_the_cell_that_prints_not_to_the_one_before(tmp_path, capsys,
                                                                          monkeypatch):
    # The checker looks every POLL_S: a right cell that takes a while, then a flood that
    # starts between two looks; the look that sees the flood also sees the switch.
    monkeypatch.setattr(distributed, "POLL_S", 1.0)
    slow_right = "import time\ntime.sleep(2.5)\n" + answer("04.scaled_lr").split("\n", 1)[1]
    path = notebook(tmp_path / "04_mine.py", [
        "# exercise: 04.scaled_lr\n" + slow_right,
        "# exercise: 04.warmup_lr\n" + BAD_WARMUP["prints megabytes"][0],
        answer("04.noise_scale")])
    assert cli.main(["check", "04", "--notebook", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "correct: 04.scaled_lr — " in out, (out, err)
    assert err.startswith("kosmoss check: error: 04.warmup_lr — printed more than 1 MiB"), err


@pytest.mark.slow
@pytest.mark.parametrize("kind", BAD_WARMUP)
def test_a_bad_cell_is_one_line_exit_2_and_the_others_are_still_checked(kind, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setattr(distributed, "EXERCISE_TIMEOUT_S", 8.0)
    cell, says = BAD_WARMUP[kind]
    path = notebook(tmp_path / "04_mine.py", [
        "# exercise: 04.warmup_lr\n" + cell, answer("04.scaled_lr"), answer("04.noise_scale")])
    before = sha(path)
    assert cli.main(["check", "04", "--notebook", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "correct: 04.scaled_lr — " in out, out
    assert err.startswith("kosmoss check: error: 04.warmup_lr — ") and err.count("\n") == 1, err
    assert says in err, err
    assert len(out) < 2000, "what the cell printed is not shown"
    assert sha(path) == before


@pytest.mark.slow
def test_a_rank_that_ends_its_process_is_named_and_the_next_exercise_still_checked(tmp_path,
                                                                                  capsys):
    path = notebook(tmp_path / "03_mine.ipynb", [
        "# exercise: 03.average_gradients\nimport os, signal\nimport torch.distributed as dist"
        "\n\n\ndef average_gradients(model):\n    if dist.get_rank() == 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n", answer("03.per_device_batch")])
    assert cli.main(["check", "03", "--notebook", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "correct: 03.per_device_batch — " in out, out
    assert err.startswith("kosmoss check: error: 03.average_gradients — the checker's process 1 "
                          "was killed by SIGKILL"), err
