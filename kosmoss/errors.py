"""Errors a user can fix: reported as one line, exit code 2, nothing written."""
from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input: the message names the flag or file and what to do."""


class DatasetError(UsageError):
    """A dataset that is missing, incomplete or corrupted."""


class RunFailed(Exception):
    """The run started but did not finish (a rank or node died): exit code 1, one line."""
