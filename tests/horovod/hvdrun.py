"""Start kosmoss entry points under horovodrun (or torchrun) the way a user would."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

HOROVODRUN = Path(sys.executable).with_name("horovodrun")  # installed next to this python
LEAKED = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "NODE_RANK", "HOROVOD_RANK")


def clean_env(home: Path, **extra: str) -> dict:
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}
    for name in LEAKED:
        env.pop(name, None)
    return env


def horovodrun(args, home: Path, np: int = 2, timeout: float = 400) -> subprocess.CompletedProcess:
    command = [str(HOROVODRUN), "-np", str(np), "--gloo", sys.executable, *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=clean_env(home), capture_output=True,
                          text=True, timeout=timeout)


def torchrun(args, home: Path, np: int = 2, timeout: float = 400) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(np), *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=clean_env(home), capture_output=True,
                          text=True, timeout=timeout)
