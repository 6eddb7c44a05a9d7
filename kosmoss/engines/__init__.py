"""Distributed engines, as objects (:class:`kosmoss.engines.base.Engine`):

- ``ddp`` (:mod:`kosmoss.engines.ddp`): torch.distributed through Lightning's DDPStrategy;
- ``horovod`` (:mod:`kosmoss.engines.horovod`): kosmoss's own Lightning 2 strategy, since
  Lightning 2.0 removed its own.

Add one by writing an Engine subclass and naming it here.
"""
from __future__ import annotations

import importlib

ENGINES = {"ddp": ("kosmoss.engines.ddp", "DDPEngine"),
           "horovod": ("kosmoss.engines.horovod", "HorovodEngine")}
ENGINE_NAMES = tuple(ENGINES)


def get(name: str):
    """The engine called ``name`` (imported only when asked: Horovod and Lightning are slow)."""
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(module), cls)()
