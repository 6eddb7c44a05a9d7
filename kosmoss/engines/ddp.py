"""DDP through torch.distributed, as Lightning's DDPStrategy runs it: gloo on CPU and for
ranks that share a GPU, NCCL for one rank per GPU (:func:`kosmoss.devices.policy.sharing`)."""
from __future__ import annotations

import gc
from datetime import timedelta
from typing import Optional

import torch

from ..core.errors import ConfigError
from ..devices.policy import Sharing
from .base import Engine


def no_buffer_sync_per_step() -> dict:
    """DDP's option that stops it from broadcasting the module's buffers from rank 0 before
    every forward: one collective per step, and LitMLP's buffers are the dataset's
    statistics, equal on every rank and never trained. torch 2.13 renamed it
    (``forward_sync_buffers``; ``broadcast_buffers`` now warns in every rank); torch 2.11,
    the GPU machine's, has only the old name."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers"
    return {name: False}


class DDPEngine(Engine):
    name = "ddp"
    uses_process_group = True
    steps_in_chunks = True  # with one process there is no DDP wrapper to keep in step

    def check_launch(self, launcher: str, ranks: int) -> None:
        if launcher == "horovodrun":
            raise ConfigError("strategy", "horovodrun started this process but {field} is ddp: "
                              "run `trainup_gpu.py --strategy horovod` (DDP would train each "
                              "rank alone)")

    def strategy(self, share: Sharing, world_size: int, timeout: Optional[timedelta],
                 devices: Optional[list] = None):
        if world_size == 1:
            return "auto"
        from pytorch_lightning.strategies import DDPStrategy

        options = {"timeout": timeout} if timeout else {}
        if devices:  # ranks sharing a GPU: Lightning takes them as given, duplicates and all
            options["parallel_devices"] = devices
        # Gradients live in DDP's all-reduce buckets: no copy of every gradient into them
        # and back each step (~2 MB a step for the course model), and no second copy in RAM.
        # Bucket size and static_graph stay torch's: on 2 CPU ranks neither changed the
        # step beyond the noise (python -m kosmoss.bench.ddp_anatomy, docs/bench/2026-11-24.md).
        return DDPStrategy(process_group_backend=share.backend, gradient_as_bucket_view=True,
                           **no_buffer_sync_per_step(), **options)

    def backend(self, share: Sharing, world_size: int) -> str:
        return share.backend if world_size > 1 else "none"

    def shutdown(self) -> None:
        if torch.distributed.is_initialized():
            # Lightning leaves the group up; a rank exiting with gloo's threads alive was seen
            # to abort ("terminate called without an active exception", 1 torchrun run in 12).
            # Lightning's teardown has dropped its DDP wrapper; collected now, its Reducer is
            # not the group's last owner (as that, it destroys the group holding the GIL while
            # gloo's thread waits for the GIL: a deadlock).
            gc.collect()
            torch.distributed.destroy_process_group()
