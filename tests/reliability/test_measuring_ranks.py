"""A measurement's ranks (kosmoss comm, ddp_anatomy): a rank that dies tearing down, after
rank 0 wrote the figures, costs nothing; one that dies before fails the measurement."""
from __future__ import annotations

import os
import signal
import threading

import pytest
import torch.multiprocessing as mp
from fault_helpers import measuring_rank, sleeping_rank

from kosmoss.launch.spawn import spawn_for_result, write_result


def test_a_rank_aborting_after_the_figures_exist_keeps_them(tmp_path, capfd):
    result = str(tmp_path / "rank0.json")
    assert spawn_for_result(measuring_rank, (result, True), 2, result) == {"samples_per_s": 123.0}
    assert "rank 1 ended with SIGABRT after its collectives had completed" in capfd.readouterr().err


def test_a_rank_aborting_before_fails_the_measurement(tmp_path):
    result = str(tmp_path / "never.json")  # rank 0 writes another file: none at this path
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawn_for_result(measuring_rank, (str(tmp_path / "other.json"), False), 2, result)


def test_figures_are_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "figures.json"
    write_result(str(path), {"a": 1})
    assert path.read_text() == '{"a": 1}' and not (tmp_path / "figures.json.partial").exists()


@pytest.mark.parametrize("other_thread", [False, True], ids=["alone", "beside_a_thread"])
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_ranks_start_ends_them(tmp_path, monkeypatch, number, other_thread):
    """Ctrl-C or SIGTERM while the ranks are being started (a loaded machine makes that
    last): held until the spawner has the ranks, then raised where it ends them. Raised
    before, it left them running, and the command's exit waited for them. Beside another
    thread the kernel hands the signal to that thread, past a mask (seen in CI): the stop
    was raised too early, or the mask was left blocking every later stop."""
    started, waiting = [], threading.Event()
    if other_thread:
        threading.Thread(target=waiting.wait, daemon=True).start()
    real_start = mp.start_processes

    def start_then_stopped(*args, **kwargs):
        context = real_start(*args, **kwargs)
        started.extend(context.processes)
        os.kill(os.getpid(), number)  # lands while the spawner still holds stop signals
        return context

    monkeypatch.setattr(mp, "start_processes", start_then_stopped)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # as kosmoss's commands
    # Python's own Ctrl-C handler: an earlier test's Trainer may have left SIGINT ignored.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        with pytest.raises(KeyboardInterrupt):
            spawn_for_result(sleeping_rank, (120,), 3, str(tmp_path / "never.json"))
        alive = [process.pid for process in started if process.is_alive()]
        after = (signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.getsignal(signal.SIGTERM),
                 signal.getsignal(signal.SIGINT))
    finally:
        waiting.set()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        for process in started:
            process.kill()
    assert len(started) == 3 and not alive, f"ranks left running: {alive}"
    assert after == (mask, _raise_keyboard_interrupt, signal.default_int_handler), \
        "the stop signals were not given back"


def test_a_spawn_that_fails_at_its_third_rank_ends_the_two_started(tmp_path, monkeypatch):
    """torch's start_processes returns nothing when a rank's start fails: the ranks it had
    started are found among the spawner's children and ended, not left to sleep."""
    from multiprocessing.context import SpawnProcess

    real_start, started = SpawnProcess.start, []

    def start_or_fail(process):
        if len(started) == 2:
            raise OSError("no room for a third rank")
        real_start(process)
        started.append(process)

    monkeypatch.setattr(SpawnProcess, "start", start_or_fail)
    try:
        with pytest.raises(OSError, match="third rank"):
            spawn_for_result(sleeping_rank, (120,), 3, str(tmp_path / "never.json"))
        alive = [process.pid for process in started if process.is_alive()]
    finally:
        for process in started:
            process.kill()
    assert len(started) == 2 and not alive, f"ranks left running: {alive}"


def _raise_keyboard_interrupt(number, frame):
    raise KeyboardInterrupt
