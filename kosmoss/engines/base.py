"""What a distributed engine is to kosmoss: the Lightning strategy it trains with, the
backend it reduces over, who must launch its ranks, and what it checks first.

An engine is chosen by name (``--strategy``) once, in :func:`kosmoss.engines.get`; from
then on the run asks the object, never compares the name.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

from ..devices.policy import Sharing


class Engine:
    name: str = ""
    # The launcher that must start this engine's ranks when there are several (None: any).
    required_launcher: Optional[str] = None
    # Collectives go through torch.distributed's process group (monitored_barrier works).
    uses_process_group: bool = False
    # One process of it may make several optimizer steps per batch (kosmoss.run.chunks):
    # Horovod's optimizer synchronises once per step of Lightning's loop.
    steps_in_chunks: bool = False

    def check_available(self) -> None:
        """Raise a one-line error when the engine cannot run here (e.g. not installed)."""

    def check_launch(self, launcher: str, ranks: int) -> None:
        """Raise a one-line error when ``launcher`` cannot start ``ranks`` of this engine."""

    def strategy(self, share: Sharing, world_size: int, timeout: Optional[timedelta],
                 devices: Optional[list] = None):
        """The Lightning strategy (or Lightning's name for one) for this run; ``devices``:
        each local rank's device where they share GPUs (DevicePolicy.rank_devices)."""
        raise NotImplementedError

    def strategy_name(self, world_size: int) -> str:
        return self.name if world_size > 1 else "single"

    def backend(self, share: Sharing, world_size: int) -> str:
        """What carries the collectives: ``gloo``, ``nccl``, ``horovod``, or ``none``."""
        raise NotImplementedError

    def backend_reason(self, share: Sharing, on_gpu: bool, ranks_on_host: int) -> str:
        return share.reason

    def shared_run_id(self, candidate: str) -> str:
        """Rank 0's run id on every rank, where the launcher gives the ranks no common id."""
        return candidate

    def shutdown(self) -> None:
        """End what the engine keeps up between fit and test, once the run is over."""
