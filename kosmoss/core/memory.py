"""How much memory this process may still take: the host's available memory (psutil), within
the limit of its control group (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the
nearest limiting ancestor's), as a container, a Slurm job or systemd may set one. Past it
the kernel's OOM killer ends the process, whatever the host has free.

psutil reads the host's /proc/meminfo only; the cgroup files are read here. Page cache the
group holds but can drop (``inactive_file``) counts as room, as the kernel reclaims it first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import psutil

UNLIMITED = 1 << 62  # v1's "no limit" is 2**63 rounded down to a page: anything this large


def available_bytes() -> int:
    """Bytes this process may still allocate before the host or its cgroup runs out."""
    host = psutil.virtual_memory().available
    room = cgroup_room()
    return host if room is None else min(host, room)


def cgroup_room() -> Optional[int]:
    """Room left under the tightest memory limit of this process's cgroups; None without
    a limit (or on a system without cgroups)."""
    rooms = [room for folder in _limiting_groups() for room in [_room(folder)] if room is not None]
    return min(rooms) if rooms else None


def _limiting_groups() -> Iterator[Path]:
    """This process's memory cgroup folder and its ancestors, v2 and v1."""
    for mount, path in _memory_groups():
        folder = mount / path.lstrip("/")
        while True:
            yield folder
            if folder == mount or mount not in folder.parents:
                break
            folder = folder.parent


def _memory_groups() -> List[Tuple[Path, str]]:
    """(mount point, the process's path under it) for the v2 hierarchy and v1's memory."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = hierarchy == "0" and controllers == ""
        if v2 or "memory" in controllers.split(","):
            mount = _mount_of(mounts, v2)
            if mount is not None:
                found.append((mount, path))
    return found


def _mount_of(mountinfo: List[str], v2: bool) -> Optional[Path]:
    for line in mountinfo:
        fields = line.split(" - ")
        if len(fields) != 2:
            continue
        fstype, _, options = (fields[1].split() + ["", "", ""])[:3]
        point = Path(fields[0].split()[4])
        if v2 and fstype == "cgroup2" or not v2 and fstype == "cgroup" and \
                "memory" in options.split(","):
            return point
    return None


def _room(folder: Path) -> Optional[int]:
    """limit - usage + reclaimable page cache, for one cgroup folder; None: no limit."""
    limit = _number(folder / "memory.max") or _number(folder / "memory.limit_in_bytes")
    usage = _number(folder / "memory.current") or _number(folder / "memory.usage_in_bytes")
    if limit is None or limit >= UNLIMITED or usage is None:
        return None
    cache = _stat(folder / "memory.stat", ("inactive_file", "total_inactive_file"))
    return max(0, limit - usage + cache)


def _number(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def _stat(path: Path, names: Tuple[str, ...]) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in names and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0
