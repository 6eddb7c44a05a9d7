"""Forking ranks from a notebook's kernel after it ran a backward pass: where a GPU is
visible, PyTorch's autograd cannot run in the forked ranks.

The first backward pass in a process starts one autograd thread per device of every
non-CPU type (named ``pt_autograd_<device>``), and once they run, a process forked from
this one fails at its first backward: "Unable to handle autograd's threading in combination
with fork-based multiprocessing" (torch/csrc/autograd/engine.cpp,
``Engine::start_device_threads``; https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork).
On a CPU-only machine those threads never start, so a notebook that trains in its kernel
and then forks ranks (Lightning's ``ddp_notebook``, :func:`kosmoss.lessons.on_ranks`)
works on a laptop and fails on a GPU. :func:`explaining_autograd_forks` turns that failure
into one line that says why and what to do.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional

DEVICE_THREAD_PREFIX = "pt_autograd_"
TORCH_AUTOGRAD_FORK_ERROR = ("Unable to handle autograd's threading in combination with "
                             "fork-based multiprocessing")


def autograd_device_threads(pid: int | str = "self") -> Optional[List[str]]:
    """Names of the autograd engine's device threads in a process; None where /proc cannot
    tell (not Linux: macOS names them too, but does not list them)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return None
    names = []
    for comm in tasks.glob("*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:  # the thread ended while we listed them
            continue
        if name.startswith(DEVICE_THREAD_PREFIX):
            names.append(name)
    return sorted(names)


@contextlib.contextmanager
def explaining_autograd_forks(what: str) -> Iterator[None]:
    """Around code that forks ranks from this process: if a rank's backward fails because
    autograd's device threads ran here before the fork, one line that says so and what to
    do, in place of every rank's traceback. Ranks that run no backward (collectives only,
    a validation) are left to run: forking is not what fails."""
    threads = autograd_device_threads()
    try:
        yield
    except Exception as err:
        if not threads or TORCH_AUTOGRAD_FORK_ERROR not in str(err):
            raise
        raise RuntimeError(
            f"{what}: a rank could not run a backward pass, because this kernel had run one "
            f"with a GPU visible before forking it (autograd threads {', '.join(threads)}; "
            "https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork); restart the kernel "
            "and run the cells in order, training in the kernel only after the forks") from None


# Run in a fresh interpreter: a backward, then a fork whose child runs a backward too;
# each process prints one JSON line.
_PROBE = """
import json, os, torch
from kosmoss.lessons.forks import autograd_device_threads
torch.ones(2, requires_grad=True).sum().backward()
threads = autograd_device_threads()
pid = os.fork()
if pid == 0:
    try:
        torch.ones(2, requires_grad=True).sum().backward()
        error = None
    except RuntimeError as err:
        error = str(err).splitlines()[0]
    print(json.dumps({"child_error": error}), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"threads": threads}), flush=True)
"""


def backward_after_fork() -> dict:
    """What this machine does, measured in a fresh process: the autograd device threads its
    first backward started (``threads``), and the error of a backward in a process forked
    after it (``child_error``, None when it ran)."""
    import json

    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != 2:
        raise RuntimeError(f"the autograd fork probe failed: {done.stderr.strip()[-300:]}")
    return {**json.loads(lines[0]), **json.loads(lines[1])}
