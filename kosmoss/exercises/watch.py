"""Collectives as a checker sees them: each launch of one torch.distributed collective,
whether it was asynchronous, and when the learner waited on its handle (09b.overlap,
11.zero1_step). torch has no hook on a collective's call, so the function is swapped in
both namespaces a cell can reach it through."""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator, List, Optional


class Handle:
    """A work handle as the learner's code sees it, that tells the checker it was waited
    on (gloo's Work cannot take an attribute)."""

    def __init__(self, work, launch: int, events: list, phase: List[str]):
        self._work, self._launch, self._events, self._phase = work, launch, events, phase

    def wait(self, *args, **kwargs):
        self._events.append(("wait", self._launch, self._phase[0]))
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        # A future waited on is a wait too (torch.futures.wait_all, .then): when, unknown.
        self._events.append(("wait", self._launch, "finish"))
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextmanager
def watched(name: str, events: list, phase: List[str], handles: Optional[list] = None
            ) -> Iterator[None]:
    """Record every call of the collective ``name`` (all_reduce, broadcast: the tensor
    first, async_op third after it) — ("launch", elements, async_op, the phase of the step
    it was launched in) — in both namespaces a cell reaches it through; restore it
    afterwards. ``handles`` gets (launch number, a weak reference to the handle the
    learner got)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = getattr(distributed_c10d, name)

    def collective(tensor, *args, **kwargs):
        asynchronous = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        launch = sum(1 for event in events if event[0] == "launch")
        events.append(("launch", int(tensor.numel()), asynchronous, phase[0]))
        work = original(tensor, *args, **kwargs)
        if not asynchronous or work is None:
            return work
        handle = Handle(work, launch, events, phase)
        if handles is not None:
            handles.append((launch, weakref.ref(handle)))
        return handle

    saved = [(module, getattr(module, name)) for module in (dist, distributed_c10d)]
    for module, _ in saved:
        setattr(module, name, collective)
    try:
        yield
    finally:
        for module, function in saved:
            setattr(module, name, function)


@contextmanager
def called(names, seen: List[tuple], size=None) -> Iterator[None]:
    """Record every call of the collectives ``names`` (its name, and ``size(name,
    arguments)``, the arguments by parameter name: by default the elements of the first,
    -1 for a list or when they do not bind), in both namespaces a cell reaches them
    through; restore them afterwards."""
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    saved, inside = [], []  # inside: the call being recorded (all_gather_object calls
    # all_gather on its pickled bytes; the learner called the one, not the other)
    for name in names:
        original = getattr(distributed_c10d, name)

        def recorded(*args, _name=name, _original=original,
                     _signature=inspect.signature(original), **kwargs):
            if inside:
                return _original(*args, **kwargs)
            try:  # the learner's call, wrong or not, is torch's to refuse, not the recorder's
                arguments = _signature.bind(*args, **kwargs).arguments
                elements = (size or _first_elements)(_name, arguments)
            except Exception:  # arguments that do not bind, or that no size can be read of
                elements = -1
            seen.append((_name, elements))
            inside.append(_name)
            try:
                return _original(*args, **kwargs)
            finally:
                inside.pop()

        for module in (dist, distributed_c10d):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, recorded)
    try:
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


def _first_elements(name: str, arguments: dict) -> int:
    tensor = next(iter(arguments.values()), None)
    return int(tensor.numel()) if hasattr(tensor, "numel") else -1
