"""A healthy run looks healthy: Lightning's start-up banners and adverts are info-level log
records, and some warnings repeat once per call. Real warnings still reach the user, once.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

# Lightning's loggers whose INFO records are banners ("GPU available: False ...", "💡 Tip").
CHATTY_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero",
                  "lightning_fabric.utilities.rank_zero", "pytorch_lightning.accelerators.cuda",
                  "lightning.pytorch.accelerators.cuda")
# Warnings that are decisions of kosmoss, not problems a user can act on.
EXPECTED_WARNINGS = (
    ".*does not have many workers.*",  # workers are sized per process on purpose (kosmoss.devices.cpus)
    ".*LeafSpec.*is deprecated.*",  # Lightning 2.6 on torch 2.13: nothing a user can act on
    ".*all_gather is deprecated.*",
    ".*The `srun` command is available on your system but is not used.*",  # asking isn't using
    ".*is an invalid version and will not be supported.*",
    ".*Checkpoint directory .* exists and is not empty.*",  # a resume writes where it stopped
    # Lightning compares log_every_n_steps with its loop's steps per epoch; a run with several
    # optimizer steps per loop step logs at optimizer steps (kosmoss.run.chunks).
    ".*is smaller than the logging interval.*",
)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("once")  # a real warning: one line, not one per step
            for pattern in EXPECTED_WARNINGS:  # inserted in front: they win over "once"
                warnings.filterwarnings("ignore", pattern)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
