"""``kosmoss bench`` and ``kosmoss comm`` stopped part-way, as users stop them: Ctrl-C (SIGINT
to the terminal's whole process group) or ``kill PID`` (SIGTERM to the command alone). One
line, exit 128 + the signal, no process left behind (a bench's row run, a comm's ranks),
and a bench keeps the repeats it measured. Before, Ctrl-C printed a KeyboardInterrupt
traceback per process and SIGTERM left the row's training run or the ranks running on."""
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from helpers import REPO, wait_until
from kosmoss.commands import bench
from kosmoss.core.errors import Interrupted

pytestmark = pytest.mark.slow

HOW = {"ctrl-c": (signal.SIGINT, True), "kill": (signal.SIGTERM, False)}


def _start(args, home, log):
    env = {**os.environ, "KOSMOSS_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    with open(log, "w") as sink:
        return subprocess.Popen([sys.executable, "-m", "kosmoss", *args], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=sink,
                                start_new_session=True)  # its own group, as a terminal's job


def _stop(proc, how) -> int:
    number, whole_group = HOW[how]
    if whole_group:
        os.killpg(proc.pid, number)
    else:
        os.kill(proc.pid, number)
    return proc.wait(timeout=120)


def _left(marker: str):
    """Processes whose command line holds ``marker`` (this test's own folder)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []) and process.pid != os.getpid():
            found.append(process)
    return found


def _gone(marker: str) -> bool:
    _, alive = psutil.wait_procs(_left(marker), timeout=15)
    return not alive


@pytest.mark.parametrize("how", sorted(HOW))
def test_a_stopped_bench_writes_what_it_measured_and_leaves_no_row_running(
        shared_home, tmp_path, how):
    out, log = tmp_path / "bench", tmp_path / "bench.log"
    proc = _start(["bench", "--quick", "--only", "raw-cpu", "kosmoss-cpu", "--steps", "3",
                   "--repeats", "5", "--out", str(out)], shared_home, log)
    try:
        wait_until(lambda: "repeat 1/5 kosmoss-cpu" in log.read_text(), 600,
                   "the first round of repeats", log)
        wait_until(lambda: _left(str(out / "rows")), 120, "a row of the second round to start",
                   log)
        code = _stop(proc, how)
    finally:
        proc.kill()
    lines = log.read_text().splitlines()
    number = HOW[how][0]
    assert code == 128 + number, lines[-20:]
    assert lines[-1] == (f"kosmoss bench: stopped by {number.name}; the repeats measured "
                         f"before it are in {out / 'bench.json'}"), lines[-20:]
    assert "Traceback" not in log.read_text()
    assert _gone(str(out)), "a row's run outlived the bench"
    result = json.loads((out / "bench.json").read_text())
    assert result["stopped_by"] == number.name and result["prediction"] is None
    rows = {row["id"]: row for row in result["rows"]}
    assert rows["raw-cpu"]["status"] == rows["kosmoss-cpu"]["status"] == "measured"
    assert 1 <= len(rows["kosmoss-cpu"]["repeats"]) < 5
    assert bench.output_folder(out) == out  # the same --out is taken again, no cleaning first


@pytest.mark.parametrize("how", sorted(HOW))
def test_a_stopped_comm_ends_its_ranks_with_one_line(shared_home, tmp_path, how):
    out, log = tmp_path / "comm", tmp_path / "comm.log"
    proc = _start(["comm", "--ranks", "3", "--sizes", "8M", "32M", "--repeats", "5000",
                   "--out", str(out)], shared_home, log)
    try:
        wait_until(lambda: len(psutil.Process(proc.pid).children(recursive=True)) >= 3, 300,
                   "the 3 ranks to start", log)
        ranks = psutil.Process(proc.pid).children(recursive=True)
        code = _stop(proc, how)
    finally:
        proc.kill()
    number = HOW[how][0]
    text = log.read_text()
    assert code == 128 + number, text[-3000:]
    assert text.splitlines()[-1] == f"kosmoss comm: stopped by {number.name}", text[-3000:]
    assert "Traceback" not in text
    _, alive = psutil.wait_procs(ranks, timeout=15)
    assert not alive, "ranks outlived kosmoss comm"
    assert not out.exists()  # nothing half-measured is written


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_unwinds_once_then_again_after_the_grace(monkeypatch, capsys, number):
    """In-process: the first signal raises where the command is; one more at once is
    ignored (it would cut short what the first is ending); a later one raises again, in case
    a library swallowed the first. The caller's handlers come back after."""
    import time

    from kosmoss.core import commandline

    monkeypatch.setattr(commandline, "UNWIND_S", 0.5)
    before = signal.getsignal(number)
    ended = []

    def command():
        try:
            try:
                os.kill(os.getpid(), number)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), number)  # pressed again while it ends: ignored
                time.sleep(0.1)
                ended.append("cleaned up")
        except Interrupted:
            time.sleep(0.6)
            os.kill(os.getpid(), number)  # a library swallowed the first: this one stops
            time.sleep(5)

    with commandline.stop_signals_unwind():
        code = commandline.run_command("kosmoss demo", command)
    assert code == 128 + number and ended == ["cleaned up"]
    assert capsys.readouterr().err == f"kosmoss demo: stopped by {number.name}\n"
    assert signal.getsignal(number) is before
