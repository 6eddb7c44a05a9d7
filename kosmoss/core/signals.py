"""Stop signals held while something must not be cut in two (records written, ranks started).

A handler swap rather than ``pthread_sigmask``: a mask holds one thread, and the kernel hands
a process's signal to any other thread that does not block it (torch's, gloo's, a test
runner's), after which Python runs the handler in the main thread all the same. The
standard library has no such helper; Python runs every handler in the main thread, which is
what makes the swap sufficient there."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterable, Iterator, List, Sequence, Tuple


@contextlib.contextmanager
def stops_held(signals: Iterable[int], *, drop: bool = False) -> Iterator[List[int]]:
    """Inside the block ``signals`` are recorded (the list yielded) instead of handled; at
    its end the handlers come back and the first recorded signal is raised again, unless
    ``drop`` (it is already dealt with). Outside the main thread nothing is held: only
    the main thread runs Python's handlers, and only it may set them."""
    recorded: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield recorded
        return
    previous = [(number, signal.getsignal(number)) for number in signals]
    previous = [(number, handler) for number, handler in previous
                if handler is not None]  # None: set outside Python, left as it is
    try:
        for number, _ in previous:
            signal.signal(number, lambda number, frame: recorded.append(number))
        yield recorded
    finally:
        restore(previous)
        if recorded and not drop:
            signal.raise_signal(recorded[0])


def restore(handlers: Sequence[Tuple[int, object]]) -> None:
    """Each handler back in place. A stop that reached another thread late is run by the
    first handler restored, which may raise at once: the rest still come back on the way
    out, instead of staying recorders that swallow every later stop."""
    if not handlers:
        return
    (number, handler), rest = handlers[0], handlers[1:]
    try:
        signal.signal(number, handler)
    finally:
        restore(rest)


@contextlib.contextmanager
def blocked(signals: Iterable[int]) -> Iterator[None]:
    """``signals`` blocked in this thread, and in the processes it starts (they inherit the
    mask). Used inside :func:`stops_held`, whose recorders make the mask's restore safe."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
