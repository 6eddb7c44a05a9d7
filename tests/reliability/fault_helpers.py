"""Start a training run as a user would, wait for what it writes (never a fixed sleep), and
find every process of it: the tools of the fault tests (docs/reliability.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import psutil
from helpers import REPO, STARTUP_TIMEOUT_S, wait_until

MARKER_TIMEOUT_S = STARTUP_TIMEOUT_S  # a loaded 2-core machine imports torch slowly
LEAKED = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "KOSMOSS_RUN_ID", "KOSMOSS_RUN_LAUNCHER",
          "NODE_RANK", "MASTER_PORT", "MASTER_ADDR")


def start(home: Path, dataset: Path, *args: str, script: str = "trainup_cpu.py",
          new_session: bool = False) -> subprocess.Popen:
    """trainup_cpu.py on ``dataset`` with its own KOSMOSS_HOME, training until stopped;
    stdout and stderr go to files beside the home (a pipe nobody reads could block it)."""
    env = {**os.environ, "KOSMOSS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for name in LEAKED:
        env.pop(name, None)
    home.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, script, "--dataset", str(dataset), "--no-progress",
               "--batch-size", "64", "--max-epochs", "100000", *args]
    return subprocess.Popen(command, cwd=REPO, env=env, start_new_session=new_session,
                            stdout=open(home.parent / f"{home.name}.out", "w"),
                            stderr=open(home.parent / f"{home.name}.err", "w"))


def stderr_of(home: Path) -> str:
    return (home.parent / f"{home.name}.err").read_text()


def wait_for(condition: Callable[[], object], what: str, timeout: float = MARKER_TIMEOUT_S):
    return wait_until(condition, timeout, what)


def run_dir(home: Path) -> Optional[Path]:
    runs = sorted((home / "runs").glob("*/")) if (home / "runs").is_dir() else []
    return runs[-1] if runs else None


def records(home: Path) -> List[dict]:
    folder = run_dir(home)
    found = []
    for path in sorted(folder.glob("processes/*.json")) if folder else []:
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return found


def heartbeat_steps(home: Path) -> Dict[int, int]:
    """Global rank -> the step its heartbeat last said (kosmoss.diagnose.heartbeat)."""
    folder = run_dir(home)
    steps = {}
    for path in sorted(folder.glob("heartbeats/rank-*.json")) if folder else []:
        try:
            beat = json.loads(path.read_text())
        except ValueError:
            continue
        steps[beat["rank"]] = beat["step"]
    return steps


def trained(home: Path, ranks: int, step: int) -> bool:
    steps = heartbeat_steps(home)
    return len(steps) == ranks and min(steps.values()) >= step


def processes_of(home: Path) -> List[psutil.Process]:
    """Every live process whose environment points at this KOSMOSS_HOME: ranks, nodes,
    data workers (forked: they keep their rank's environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KOSMOSS_HOME") == str(home) and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def exit_code(home: Path, launcher: subprocess.Popen, timeout: float = 120) -> int:
    """The launcher's exit code; if it does not end in time, fail with the Python stacks
    of every process of the run (py-spy, as ``kosmoss stacks`` takes them) and its stderr,
    so that a rare hang explains itself the first time it is seen."""
    try:
        return launcher.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    from kosmoss.diagnose.stacks import stacks_text

    pids = [launcher.pid] + [proc.pid for proc in processes_of(home)]
    raise AssertionError(f"the launcher did not end within {timeout:g} s\n" + stacks_text(pids)
                         + "\n--- stderr ---\n" + stderr_of(home)[-3000:])


def rank_1_started(launcher: subprocess.Popen) -> Optional[psutil.Process]:
    """Lightning's rank 1, as soon as it exists: still importing torch, long before the
    process group forms."""
    try:
        children = psutil.Process(launcher.pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if child.environ().get("LOCAL_RANK") == "1":
                return child
        except psutil.Error:
            continue
    return None


def end_all(home: Path, launcher: subprocess.Popen) -> None:
    """Clean-up after a test: this test's processes only, by pid."""
    for proc in processes_of(home):
        try:
            proc.kill()
        except psutil.Error:
            pass
    if launcher.poll() is None:
        launcher.kill()
    launcher.wait()


def measuring_rank(rank: int, result: str, abort_after: bool) -> None:
    """A rank of a measurement (kosmoss.launch.spawn.spawn_for_result): rank 0 writes the figures;
    rank 1 aborts (SIGABRT, as a C++ std::terminate does) after they exist or before."""
    from kosmoss.launch.spawn import write_result

    if rank == 0:
        write_result(result, {"samples_per_s": 123.0})
    elif abort_after:
        wait_until(lambda: os.path.exists(result), 60, "rank 0's figures")
        os.abort()
    else:
        os.abort()


def sleeping_rank(rank: int, seconds: float) -> None:
    """A rank of a measurement that is still working when it is stopped."""
    time.sleep(seconds)
