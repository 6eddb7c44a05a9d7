"""What PyTorch's autograd does to forks where a GPU is visible, on a machine without one.

Where a GPU is visible, the first backward pass starts one autograd thread per device,
named ``pt_autograd_<device>``, and from then on every process forked from this one fails
at its first backward with "Unable to handle autograd's threading in combination with
fork-based multiprocessing" (torch/csrc/autograd/engine.cpp, ``Engine::start_device_threads``
and ``initialize_device_threads_pool``; https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork).
Without a GPU the engine starts no such thread and forks stay free: a lesson that trains in
its kernel and then forks ranks passes on a laptop and fails on a GPU machine.

Loaded into a lesson's kernel (tests/lessons/test_lessons.py does it with an IPython startup
file), :func:`install` makes this CPU machine behave as the GPU one: the same thread name
after the first backward, and the same error in a forked child's backward.
"""
import ctypes
import os
import threading

import torch.autograd
import torch.autograd.graph

MESSAGE = ("Unable to handle autograd's threading in combination with fork-based "
           "multiprocessing. See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")
DEVICE_THREAD = "pt_autograd_0"
PR_SET_NAME = 15  # prctl(2): names the calling thread, as c10::setThreadName does

_state = {"started": False, "forked_after_start": False}
_engine_run_backward = torch.autograd.graph._engine_run_backward


def _device_thread(named: threading.Event) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, DEVICE_THREAD.encode(), 0, 0, 0)
    named.set()
    threading.Event().wait()  # the engine's device threads wait for work for good


def start_device_thread() -> None:
    """As the engine does: the backward goes on once its thread has started and named itself."""
    named = threading.Event()
    threading.Thread(target=_device_thread, args=(named,), name=DEVICE_THREAD, daemon=True).start()
    named.wait()


def _run_backward(*args, **kwargs):
    if _state["forked_after_start"]:
        raise RuntimeError(MESSAGE)
    if not _state["started"]:
        _state["started"] = True
        start_device_thread()
    return _engine_run_backward(*args, **kwargs)


def _in_forked_child() -> None:
    _state["forked_after_start"] = _state["forked_after_start"] or _state["started"]


def install() -> None:
    """From now on, in this process and those forked from it (``torch.autograd`` and
    ``Tensor.backward`` call the engine through these two names)."""
    torch.autograd.graph._engine_run_backward = _run_backward
    torch.autograd._engine_run_backward = _run_backward
    os.register_at_fork(after_in_child=_in_forked_child)


def startup_folder(root) -> "os.PathLike":
    """An IPYTHONDIR whose kernels install this at start (IPython runs
    ``profile_default/startup/*.py`` before the first cell)."""
    from pathlib import Path

    startup = Path(root) / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-autograd-as-on-a-gpu.py").write_text(
        f"import runpy\nrunpy.run_path({str(Path(__file__).resolve())!r})['install']()\n")
    return Path(root)
