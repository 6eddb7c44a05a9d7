"""Standard output whose reader may go away while a run trains: its launcher ended
(horovodrun's middlemen then stop the ranks with SIGTERM), a pipe's reader left. The run
ends as it would, recorded so; its lines go to /dev/null from then on."""
from __future__ import annotations

import os
import sys


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
        if not self.lost:
            try:
                return sys.stdout.write(text)
            except OSError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                sys.stdout.flush()
            except OSError:
                self._leave()

    def _leave(self) -> None:
        self.lost = True
        silence_stdout()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", "utf-8")
