"""A small GPU tensor read on the host later, so that the host does not wait for the GPU now.

``float(loss)`` on a CUDA tensor copies it and blocks until every kernel queued before the
copy has run. With CUDA graphs (:mod:`.graphs`) the host has just queued a chunk's replay
when it logs that chunk's losses, so the GPU drains its queue and then idles while the host
sets up the next chunk (on the H200 of 2026-11-28, 8.6 ms of host time between replays of
5.8 ms: docs/gpu/2026-11-28-h200.md). :class:`LaterRead` starts the copy into pinned host
memory behind the kernels that make the value, records a CUDA event after it, and reads the
value when the event has passed: by then the next chunk is queued. On the CPU the value is
there at once. A non-blocking copy into pinned memory and an event is PyTorch's own recipe
for it (https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html); torch has no
call that bundles the two.
"""
from __future__ import annotations

from typing import Optional

import torch


class LaterRead:
    """``tensor``'s value as it is now (its producer's kernels queued so far), for later."""

    def __init__(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        self._event: Optional[torch.cuda.Event] = None
        if tensor.is_cuda:
            # A pinned buffer: a copy into pageable memory would wait for the GPU at once.
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:  # a copy: a replay's outputs (and a loss the caller changes) are overwritten
            self._host = tensor.clone()

    @property
    def on_host(self) -> bool:
        """Whether the value was on the host from the start (a CPU tensor's)."""
        return self._event is None

    def ready(self) -> bool:
        """Whether :meth:`value` returns without waiting."""
        return self._event is None or self._event.query()

    def value(self) -> torch.Tensor:
        """The value on the host, waiting for the GPU up to the copy only."""
        if self._event is not None:
            self._event.synchronize()
        return self._host
