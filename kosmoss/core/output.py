"""Standard output that cannot take what is written to it. A command's (``kosmoss env >
/dev/full``) is bad input, told from the failure of a file the command reads by watching
sys.stdout (``watched_stdout``). A run's reader may go away while it trains (its launcher
ended: horovodrun's middlemen then stop the ranks with SIGTERM; a pipe's reader left): the
run ends as it would, recorded so, its lines going to /dev/null from then on."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, Optional


def silence_stdout() -> None:
    """Later prints, and the interpreter's last flush, write to /dev/null (the fix Python's
    docs give for SIGPIPE: docs.python.org/3/library/signal.html#note-on-sigpipe), so that
    they do not fail in their turn."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's captured stdout)
        pass


class ReaderMayLeave:
    """sys.stdout, as the file of a rich Console, whose writes stop failing once nobody
    reads them: rich's own answer to a broken pipe is SystemExit(1), which ended a fit
    mid-epoch from its progress bar."""

    lost = False

    def write(self, text: str) -> int:
        if not self.lost and sys.stdout is not None:  # None: started with stdout closed
            try:
                return sys.stdout.write(text)
            except OSError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.lost and sys.stdout is not None:
            try:
                sys.stdout.flush()
            except OSError:
                self._leave()

    def _leave(self) -> None:
        self.lost = True
        silence_stdout()

    def isatty(self) -> bool:
        return sys.stdout is not None and sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", "utf-8")


class _Watched:
    """sys.stdout as it was, remembering the error its last failed write or flush raised."""

    def __init__(self, stream) -> None:
        self.stream, self.failure = stream, None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as err:
            self.failure = err
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as err:
            self.failure = err
            raise

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def watched_stdout() -> Iterator[Optional[_Watched]]:
    """sys.stdout, watched while a command runs: an OSError that is its own failure
    (``> /dev/full``) can be told from one of a file the command reads or writes."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() writes nothing
        yield None
        return
    watched = _Watched(sys.stdout)
    sys.stdout = watched
    try:
        yield watched
    finally:
        if sys.stdout is watched:
            sys.stdout = watched.stream


def failed_on_stdout(err: BaseException, watched: Optional[_Watched]) -> bool:
    """Whether ``err`` is the error sys.stdout raised while watched."""
    return watched is not None and watched.failure is not None and watched.failure is err
