"""Who holds GPU memory, through nvitop's API (NVML), and how much ending some freed."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List



@dataclass
class GpuUse:
    memory: int = 0
    gpus: List[int] = field(default_factory=list)


def gpu_processes() -> Dict[int, GpuUse]:
    """pid -> GPU memory it holds, through nvitop's API; empty without NVML (no GPU)."""
    try:
        from nvitop import Device

        from ..devices.environment import quiet_nvml

        uses: Dict[int, GpuUse] = {}
        with quiet_nvml():
            for device in Device.all():
                for pid, proc in device.processes().items():
                    use = uses.setdefault(pid, GpuUse())
                    memory = proc.gpu_memory()
                    use.memory += memory if isinstance(memory, int) else 0
                    use.gpus.append(device.index)
        return uses
    except Exception:  # NVML missing or broken: there is no GPU memory to hold
        return {}


def gpu_freed(before: Dict[int, GpuUse], ended: List[int], wait_s: float) -> int:
    """GPU memory the ended processes held, once NVML no longer lists them (up to
    ``wait_s``)."""
    held = {pid: before[pid].memory for pid in ended if pid in before}
    deadline = time.monotonic() + wait_s
    while held and time.monotonic() < deadline and set(held) & set(gpu_processes()):
        time.sleep(0.2)
    still = gpu_processes()
    return sum(memory for pid, memory in held.items() if pid not in still)
