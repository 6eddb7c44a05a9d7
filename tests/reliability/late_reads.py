"""Host reads that come late, as on a GPU, in a CPU run (kosmoss.run.host_reads): every
LaterRead waits until its reader must have it (a train_loss row until a validation, a
checkpoint or the fit's end; a divergence check until the next batch's end). The scripts
``corrupt_at.py`` and ``signal_at.py`` read them late in every rank when LATE_READS_ENV is set."""
from __future__ import annotations

import os

from kosmoss.run.host_reads import LaterRead

LATE_READS_ENV = "KOSMOSS_TEST_LATE_READS"


def read_late(monkeypatch=None) -> None:
    """``monkeypatch``: for one test; None: for this process (a rank's script)."""
    patches = {"on_host": property(lambda self: False), "ready": lambda self: False}
    for name, value in patches.items():
        if monkeypatch is None:
            setattr(LaterRead, name, value)
        else:
            monkeypatch.setattr(LaterRead, name, value)


def from_environment() -> None:
    if os.environ.get(LATE_READS_ENV):
        read_late()
