"""What the diagnose tests share: starting tiny_run.py (a real 2-rank gloo run) in a test's
KOSMOSS_HOME, waiting on markers (never a fixed sleep), and ending every process after."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import psutil

from helpers import REPO, wait_until  # noqa: F401 (the tests import it from here)

TINY_RUN = Path(__file__).with_name("tiny_run.py")
CLEAN_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "MASTER_ADDR",
             "KOSMOSS_RUN_ID", "KOSMOSS_RUN_LAUNCHER", "KOSMOSS_SIMULATED_NODES")


def environment(home: Path) -> dict:
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for name in CLEAN_ENV:
        env.pop(name, None)
    return env


def start_tiny_run(run_dir: Path, home: Path, log: Path, *flags: str) -> subprocess.Popen:
    """Niced: these tests share two cores with others."""
    return subprocess.Popen([sys.executable, str(TINY_RUN), str(run_dir), *flags], cwd=REPO,
                            env=environment(home), stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(10))




def end_all(home: Path, started: List[subprocess.Popen]) -> None:
    """SIGKILL everything running with this KOSMOSS_HOME, and what the test started; return
    once they are gone (a kill is delivered after the call returns: a check right after it
    could still see them alive)."""
    killed = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KOSMOSS_HOME") == str(home) and proc.pid != os.getpid():
                proc.kill()
                killed.append(proc)
        except psutil.Error:
            continue
    for popen in started:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=10)
    wait_until(lambda: not any(_alive(proc) for proc in killed), 10, "the killed processes to end")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
