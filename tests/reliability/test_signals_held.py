"""Stop signals held while something must not be cut in two (kosmoss.core.signals)."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from kosmoss.core import signals
from kosmoss.core.signals import blocked, stops_held

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@pytest.fixture
def raising_handlers():
    """SIGTERM and SIGUSR1 raise KeyboardInterrupt, as kosmoss's commands make SIGTERM."""
    def stop(number, frame):
        raise KeyboardInterrupt(number)

    previous = [(number, signal.signal(number, stop)) for number in STOPS[1:]]
    yield stop
    signals.restore(previous)


@pytest.mark.parametrize("from_thread", [False, True], ids=["this_thread", "another_thread"])
def test_a_stop_inside_is_raised_at_the_end_and_the_handlers_come_back(raising_handlers,
                                                                         from_thread):
    before = [signal.getsignal(number) for number in STOPS]
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with stops_held(STOPS) as recorded:
            if from_thread:  # the kernel may hand it to any thread; Python runs it here
                sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
                sender.start()
                sender.join()
            else:
                os.kill(os.getpid(), signal.SIGTERM)
            _wait_for(lambda: recorded)
            reached_the_end = True
    assert reached_the_end and recorded == [signal.SIGTERM]
    assert [signal.getsignal(number) for number in STOPS] == before


def test_a_stop_already_dealt_with_is_dropped(raising_handlers):
    with stops_held(STOPS, drop=True) as recorded:
        os.kill(os.getpid(), signal.SIGUSR1)
        _wait_for(lambda: recorded)
    assert recorded == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is raising_handlers


def test_a_stop_raised_by_the_first_handler_restored_leaves_none_behind(raising_handlers,
                                                                       monkeypatch):
    """A stop that reached another thread late is run by the first handler given back, which
    raises at once: the handlers after it must come back all the same, or they stay
    recorders that swallow every later stop."""
    real_signal, calls = signal.signal, []

    def late_stop_after_the_first(number, handler):
        real_signal(number, handler)
        calls.append(number)
        if len(calls) == 1 and callable(handler) and handler is raising_handlers:
            raise KeyboardInterrupt("late")

    monkeypatch.setattr(signals.signal, "signal", late_stop_after_the_first)
    with pytest.raises(KeyboardInterrupt, match="late"):
        signals.restore([(signal.SIGTERM, raising_handlers), (signal.SIGUSR1, raising_handlers),
                         (signal.SIGINT, signal.default_int_handler)])
    monkeypatch.undo()
    assert calls == [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT]
    assert signal.getsignal(signal.SIGUSR1) is raising_handlers


def test_the_mask_comes_back_after_a_stop_held_inside(raising_handlers):
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pytest.raises(KeyboardInterrupt):
        with stops_held(STOPS), blocked(STOPS):
            os.kill(os.getpid(), signal.SIGTERM)  # pending here: delivered as the mask lifts
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask


def test_outside_the_main_thread_nothing_is_held():
    seen = []

    def hold():
        with stops_held(STOPS) as recorded:
            seen.append((recorded, signal.getsignal(signal.SIGINT)))

    worker = threading.Thread(target=hold)
    worker.start()
    worker.join()
    assert seen == [([], signal.getsignal(signal.SIGINT))]


def _wait_for(condition, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)  # a sleep is where Python runs a pending handler
