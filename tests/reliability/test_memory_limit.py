"""The memory check against real runs under a memory limit (a cgroup made for the test and
removed after): a model it accepts trains to the end inside the limit; one it refuses is one
line and exit 2 before anything runs, and trained without the limit it peaks above it (it
would have been killed). The estimate is never below a run's measured peak."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from kosmoss.core import memory as host_memory

LIMIT = 1280 * 2**20
FITS, TOO_BIG = ("2000", "2000"), ("6000", "6000")


def _memory_cgroup() -> Path:
    """A new cgroup (v2, or v1's memory controller) under this process's own."""
    for mount, path in host_memory._memory_groups():
        parent = mount / path.lstrip("/")
        limit = "memory.max" if (parent / "memory.current").exists() or \
            (mount / "cgroup.controllers").exists() else "memory.limit_in_bytes"
        folder = parent / f"kosmoss-test-{os.getpid()}"
        try:
            folder.mkdir()
            (folder / limit).write_text(str(LIMIT))
            return folder
        except OSError:
            if folder.exists():
                folder.rmdir()
    pytest.skip("no memory cgroup this user may create (root with cgroup v1 or v2 needed)")


@pytest.fixture
def limited():
    folder = _memory_cgroup()
    yield folder
    folder.rmdir()


def _train(home: Path, hidden, result: Path, cgroup: Path = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "trainup_cpu.py", "--dataset", "tiny", "--no-progress",
               "--batch-size", "256", "--max-steps", "3", "--hidden", *hidden,
               "--result-json", str(result)]
    if cgroup is not None:  # the shell joins the cgroup, then becomes the run
        command = ["sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"', "sh",
                   *command]
    env = {**os.environ, "KOSMOSS_HOME": str(home)}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_what_the_check_accepts_fits_under_the_limit_and_what_it_refuses_does_not(
        shared_home, limited, tmp_path):
    fits = _train(shared_home, FITS, tmp_path / "fits.json", limited)
    assert fits.returncode == 0, fits.stderr[-3000:]  # trained inside LIMIT, not killed

    refused = _train(shared_home, TOO_BIG, tmp_path / "refused.json", limited)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
    assert "--hidden 6000 6000: 64,092,552 parameters need about" in lines[0]
    assert "(its cgroup's limit)" in lines[0] and not (tmp_path / "refused.json").exists()

    unlimited = _train(shared_home, TOO_BIG, tmp_path / "big.json")
    assert unlimited.returncode == 0, unlimited.stderr[-3000:]
    big = json.loads((tmp_path / "big.json").read_text())
    assert big["peak_host_rss_mib"][0] * 2**20 > LIMIT, big  # it would have been killed
    for result in (json.loads((tmp_path / "fits.json").read_text()), big):
        # The check's count, made before training, is not below what the run then took.
        assert result["memory_estimate_mib"] >= result["peak_host_rss_mib"][0], result


def test_a_cgroups_room_is_its_limit_less_what_it_holds_but_cannot_drop(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir(), v2.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{300 << 20}\n")
    (v1 / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {100 << 20}\n")
    assert host_memory._room(v1) == (1 << 30) - (200 << 20)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("5\n")
    assert host_memory._room(v2) is None  # no limit
    (v2 / "memory.max").write_text(f"{512 << 20}\n")
    assert host_memory._room(v2) == (512 << 20) - 5
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert host_memory._room(v1) is None


def test_the_memory_cgroup_mounts_are_found_in_mountinfo():
    mountinfo = [
        "35 24 0:30 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw",
        "40 24 0:35 / /sys/fs/cgroup/cpu rw,relatime shared:15 - cgroup cgroup rw,cpu",
        "44 24 0:39 / /sys/fs/cgroup/memory rw,relatime shared:19 - cgroup cgroup rw,memory",
    ]
    assert host_memory._mount_of(mountinfo, v2=True) == Path("/sys/fs/cgroup/unified")
    assert host_memory._mount_of(mountinfo, v2=False) == Path("/sys/fs/cgroup/memory")
    assert host_memory._mount_of(mountinfo[1:2], v2=False) is None
