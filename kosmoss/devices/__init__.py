"""Layer 4, devices: who computes where. The device policy (:mod:`.policy`: offer, force
or pick a GPU, GPU ids per local rank, ranks sharing a GPU, CPU fallback), the cores each
process may use (:mod:`.cpus`), what this machine has (:mod:`.environment`, read when
asked) and handing GPU memory back from a notebook (:mod:`.memory`)."""
from .policy import (INDEX_ENV, MACHINE_ENV, MACHINE_SETTINGS, DevicePolicy, MachineGpu,
                     Sharing, apply_sharing, decide, gpu_for_local_rank, sharing, to_numpy)

__all__ = ["INDEX_ENV", "MACHINE_ENV", "MACHINE_SETTINGS", "DevicePolicy", "MachineGpu",
           "Sharing", "apply_sharing", "decide", "gpu_for_local_rank", "sharing", "to_numpy"]
