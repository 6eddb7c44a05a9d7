"""What the host tests share: the skip where namespaces cannot be made, and clean-up that
removes every host set a test made (by its id), whatever the test did."""
from __future__ import annotations

import subprocess
from typing import List

import pytest

from kosmoss.launch import hosts

MISSING = hosts.support_missing()
needs_hosts = pytest.mark.skipif(MISSING is not None, reason=f"hosts: {MISSING}")


def kosmoss_namespaces() -> List[str]:
    return [name for name in hosts.existing_namespaces() if name.startswith(hosts.PREFIX)]


def namespaces_of(set_id: str) -> List[str]:
    return [name for name in kosmoss_namespaces() if hosts.set_id_of(name) == set_id]


def remove_set(set_id: str) -> None:
    """Clean-up by id: this test's host set only, never another's."""
    names = namespaces_of(set_id)
    hosts.remove_namespaces(names, hosts.STATE_DIR / f"{set_id}.json")


def in_host(namespace: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True,
                          text=True, check=True).stdout
