"""Leftover hosts: network namespaces of a kosmoss host set whose owner is gone (its
launcher was killed with SIGKILL, nothing ran its ``finally``), or that no record accounts
for. Listed by ``kosmoss ghosts`` (no pid: a namespace is not a process) and removed by
``--kill``, with whatever still runs inside them (kosmoss.launch.hosts)."""
from __future__ import annotations

import re
from typing import List, Optional

from ..launch import hosts

LEFTOVER_HOSTS = "hosts-left"


def leftover_host_entries() -> List[dict]:
    """A ghost's fields (:class:`kosmoss.ghosts.find.Ghost`) per leftover host set; none
    where this machine cannot have any."""
    if not hosts.NETNS_DIR.is_dir() and not hosts.STATE_DIR.is_dir():
        return []
    return [_entry(found) for found in hosts.leftovers()]


def _entry(found: hosts.Leftover) -> dict:
    record = found.record
    inside = hosts.processes_in(found.namespaces)
    return {"pid": None, "run_id": _run_id(record), "kind": LEFTOVER_HOSTS,
            "reason": f"host set {found.set_id}: {found.reason}", "killable": True,
            "mine": True, "user": "root",
            "command": "ip netns: " + (", ".join(found.namespaces) or "-"),
            "create_time": record.created_at if record else 0.0, "tree": inside,
            "causes": [f"{len(found.namespaces)} network namespace(s) and their links, "
                       f"{len(inside)} process(es) still inside"]}


def _run_id(record) -> Optional[str]:
    purpose = record.purpose if record else ""
    return purpose.split(" ", 1)[1] if purpose.startswith("run ") else None


def remove_leftover_hosts(ghosts: list) -> List[str]:
    """Remove the host sets these ghosts name (found again: one removed since is skipped);
    returns the set ids removed."""
    wanted = {re.match(r"host set (\S+):", g.reason).group(1) for g in ghosts
              if g.kind == LEFTOVER_HOSTS and g.killable}
    removed = []
    for found in hosts.leftovers():
        if found.set_id in wanted:
            found.remove()
            removed.append(found.set_id)
    return removed
