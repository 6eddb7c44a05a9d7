"""Errors a user can fix: reported as one line, exit code 2, nothing written.

The core speaks in its own words: a :class:`ConfigError` names the *field* of the run
configuration (``batch_size``); the command line that took the value renders it in its
own words (``--batch-size``) with :meth:`ConfigError.in_terms_of`.
"""
from __future__ import annotations

import errno
import os
import signal
from typing import Mapping, Optional

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input: the message names the flag or file and what to do."""


class ConfigError(UsageError):
    """A bad value of one configuration field. ``template`` holds ``{field}`` where the
    field's name goes: ``ConfigError("lr", "{field} -1: must be > 0")``."""

    def __init__(self, field: str, template: str):
        self.field, self.template = field, template
        super().__init__(template.replace("{field}", field))

    def in_terms_of(self, names: Mapping[str, str]) -> str:
        """The message with the field named as the caller names it (a flag, a keyword)."""
        return self.template.replace("{field}", names.get(self.field, self.field))


class DatasetError(UsageError):
    """A dataset that is missing, incomplete or corrupted."""


def name_too_long(err: OSError) -> Optional[UsageError]:
    """The one line for a path the file system refused as too long (a name over 255 bytes,
    a path over 4096): always the input's doing, found on lookup, before anything is
    written. None for any other OSError."""
    if err.errno != errno.ENAMETOOLONG:
        return None
    given = os.fsdecode(err.filename) if err.filename is not None else ""
    shown = given if len(given) <= 80 else f"{given[:40]}...{given[-20:]}"
    return UsageError(f"{shown!r} ({len(given)} characters): {err.strerror}; give a shorter "
                      "name or path")


class RunFailed(Exception):
    """The run started but did not finish (a rank or node died): exit code 1, one line."""


class Interrupted(KeyboardInterrupt):
    """A stop signal (Ctrl-C's SIGINT, SIGTERM) raised where the command is, so that its
    ``with`` blocks end what it started; ``kept`` says what it leaves the user. The command
    exits 128 + the signal's number, as a shell reports a process the signal killed."""

    def __init__(self, signal_number: int = signal.SIGINT, kept: str = ""):
        self.signal_number, self.kept = int(signal_number), kept
        super().__init__(signal.Signals(signal_number).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number
