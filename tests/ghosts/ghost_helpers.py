"""What the ghost tests share: starting processes in a test's KOSMOSS_HOME, waiting for
them, and ending every one of them afterwards whatever happened."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import psutil

from helpers import REPO, wait_until  # noqa: F401 (the tests import it from here)

MARKED = Path(__file__).with_name("marked_process.py")
CLEAN_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "MASTER_ADDR",
             "KOSMOSS_RUN_ID", "KOSMOSS_RUN_LAUNCHER", "KOSMOSS_SIMULATED_NODES")


def start(args: List[str], home: Path, log: Path, **env) -> subprocess.Popen:
    """A process as a user would start it, niced: these tests share two cores with others."""
    environ = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1", **env}
    for name in CLEAN_ENV:
        environ.pop(name, None)
    return subprocess.Popen(args, cwd=REPO, env=environ, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(10))


def start_marked(run_dir: Path, home: Path, log: Path, *flags: str) -> subprocess.Popen:
    return start([sys.executable, str(MARKED), str(run_dir), *flags], home, log)




def processes_of(home: Path) -> List[psutil.Process]:
    """Every live process started for this test's KOSMOSS_HOME (their environment says so)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KOSMOSS_HOME") == str(home) and proc.pid != os.getpid():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def end_all(home: Path, started: List[subprocess.Popen]) -> None:
    """SIGKILL what the test started and everything running with its KOSMOSS_HOME."""
    for proc in processes_of(home):
        try:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        except psutil.Error:
            pass
    for popen in started:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


