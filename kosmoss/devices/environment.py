"""What this machine offers for training: versions, cores, GPUs, distributed backends,
and which launcher (if any) started this process. Read when asked, never at import.

GPU facts come from nvitop's API (NVML), not from parsing ``nvidia-smi`` text.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
import warnings
from typing import Dict, Iterator, List, Optional

import psutil

from .. import __version__
from ..core import paths
from .cpus import available_cores

# Launchers Lightning has no cluster environment for: a variable each sets in every rank.
OTHER_LAUNCHERS = (("horovodrun", "HOROVOD_RANK"), ("mpirun", "OMPI_COMM_WORLD_RANK"))


@contextlib.contextmanager
def quiet_nvml() -> Iterator[None]:
    # nvitop logs a "FATAL ERROR" banner when NVML is missing; no GPU is a normal answer here.
    logger = logging.getLogger("nvitop.api.libnvml")
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def gpus() -> List[Dict]:
    """Every NVIDIA GPU NVML can see (empty without a driver), with its memory in MiB."""
    try:
        from nvitop import Device

        with quiet_nvml():
            devices = Device.all()
            return [{
                "index": device.index,
                "name": device.name(),
                "memory_total_mib": _mib(device.memory_total()),
                "memory_used_mib": _mib(device.memory_used()),
                "uuid": device.uuid(),
                "driver": Device.driver_version(),
            } for device in devices]
    except Exception:  # NVML missing or broken: no usable GPU for us either
        return []


def _mib(value) -> Optional[int]:
    return int(value) // 2**20 if isinstance(value, int) else None


def detect_launcher() -> Optional[str]:
    """The launcher that started this process (torchrun, slurm, horovodrun, mpirun), or None.
    torchrun and srun are recognised the way Lightning recognises them."""
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return "torchrun"
    if "HOROVOD_RANK" in os.environ:  # horovodrun inside a Slurm job: horovodrun's ranks
        return "horovodrun"
    with warnings.catch_warnings():
        # detect() also warns wherever srun is installed but unused: asking is not launching.
        warnings.simplefilter("ignore")
        if SLURMEnvironment.detect():
            return "slurm"
    return next((name for name, variable in OTHER_LAUNCHERS if variable in os.environ), None)


def backends() -> Dict[str, bool]:
    import torch.distributed as dist

    from ..engines import horovod

    return {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "mpi": dist.is_available() and dist.is_mpi_available(),
        "horovod": horovod.available(),  # imports it: a build for another torch fails there
    }


def describe() -> Dict:
    import pytorch_lightning as pl
    import torch

    cuda = torch.cuda.is_available()
    return {
        "kosmoss": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": pl.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cpu": {
            "cores_available": available_cores(),
            "cores_logical": psutil.cpu_count(logical=True),
            "cores_physical": psutil.cpu_count(logical=False),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        },
        "gpus": gpus(),
        "backends": backends(),
        "launcher": detect_launcher(),
        "kosmoss_home": str(paths.home()),
    }
