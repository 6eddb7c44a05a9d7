"""Ranks forked from a kernel that ran a backward pass, where a GPU makes their backward
fail: one line that says why (kosmoss.lessons.forks), checked on this CPU machine with the
GPU's rule emulated (autograd_as_on_a_gpu.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

import autograd_as_on_a_gpu as rule
from kosmoss.lessons.forks import autograd_device_threads, backward_after_fork

HERE = Path(__file__).resolve().parent

_FORKS_AFTER_A_BACKWARD = """
import json, os, sys, torch
import torch.multiprocessing as mp
sys.path.insert(0, {here!r})
import autograd_as_on_a_gpu as rule
rule.install()
from kosmoss.lessons import forked, on_ranks, one_thread_per_forked_rank
from kosmoss.lessons.forks import autograd_device_threads

folder, out = {folder!r}, {{}}

def backward_value():
    x = torch.ones(2, requires_grad=True)
    x.sum().backward()
    return x.grad.tolist()

def backward_on_rank(rank, world_size, port):
    torch.ones(3, requires_grad=True).sum().backward()
    open(os.path.join(folder, f"backward{{rank}}"), "w").close()

def no_backward_on_rank(rank, world_size, port, tag="plain"):
    open(os.path.join(folder, f"{{tag}}{{rank}}"), "w").close()

on_ranks(backward_on_rank, 3)  # no backward in this process yet: the ranks may run one
out["forked_before"] = forked(backward_value)
out["threads_before"] = autograd_device_threads()
torch.ones(2, requires_grad=True).sum().backward()
out["threads_after"] = autograd_device_threads()
child = os.fork()
if child == 0:
    try:
        torch.ones(2, requires_grad=True).sum().backward()
        os._exit(0)
    except RuntimeError as err:
        os._exit(3 if str(err) == rule.MESSAGE else 4)
out["raw_fork_child_exit"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
on_ranks(no_backward_on_rank, 4)  # ranks that run no backward still run
try:
    on_ranks(backward_on_rank, 2)
except RuntimeError as err:
    out["on_ranks_error"] = str(err)
try:
    forked(backward_value)
except RuntimeError as err:
    out["forked_error"] = str(err)
omp, threads = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
try:
    with one_thread_per_forked_rank():  # forking as Lightning's notebook launcher does
        mp.start_processes(backward_on_rank, args=(2, 0), nprocs=2, start_method="fork")
except RuntimeError as err:
    out["launcher_error"] = str(err)
out["settings_kept"] = (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()) == (omp, threads)
with one_thread_per_forked_rank():
    mp.start_processes(no_backward_on_rank, args=(2, 0, "launched"), nprocs=2,
                       start_method="fork")
try:
    with one_thread_per_forked_rank():
        raise ValueError("a cell's own error")
except ValueError as err:
    out["other_error"] = str(err)
out["ran"] = sorted(os.listdir(folder))
print(json.dumps(out))
"""


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


def test_ranks_forked_after_a_backward_with_a_gpu_fail_in_one_line(tmp_path):
    done = _run(_FORKS_AFTER_A_BACKWARD.format(here=str(HERE), folder=str(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # The emulated engine does what PyTorch's does on a GPU: a named device thread, and a
    # forked child whose backward fails with PyTorch's own message.
    assert out["threads_before"] == [] and out["threads_after"] == [rule.DEVICE_THREAD]
    assert out["raw_fork_child_exit"] == 3
    # Before any backward here three ranks ran theirs; after it, ranks that run none still
    # run (four with on_ranks, two with the launcher), and no rank with a backward finished.
    assert out["ran"] == ["backward0", "backward1", "backward2", "launched0", "launched1",
                          "plain0", "plain1", "plain2", "plain3"], out
    assert out["forked_before"] == [1.0, 1.0]
    for key, what in (("on_ranks_error", "on_ranks(backward_on_rank, 2)"),
                      ("forked_error", "forked(backward_value)"),
                      ("launcher_error", "the notebook launcher (ddp_notebook)")):
        assert out[key].startswith(f"{what}: a rank could not run a backward pass"), out
        assert "pt_autograd_0" in out[key] and "Autograd-and-Fork" in out[key]
        assert "restart the kernel" in out[key] and "\n" not in out[key]
    assert out["settings_kept"] and out["other_error"] == "a cell's own error"


def test_the_probe_measures_this_machines_rule(tmp_path):
    plain = backward_after_fork()
    assert plain["threads"] is not None  # Linux lists its threads
    assert bool(plain["threads"]) == (plain["child_error"] is not None), plain
    import torch

    if not torch.cuda.is_available():
        assert plain == {"threads": [], "child_error": None}
    # A machine that behaves as a GPU one (sitecustomize installs the rule in the probe).
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import autograd_as_on_a_gpu\nautograd_as_on_a_gpu.install()\n")
    done = _run("import json\nfrom kosmoss.lessons.forks import backward_after_fork\n"
                "print(json.dumps(backward_after_fork()))",
                PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "threads": [rule.DEVICE_THREAD], "child_error": rule.MESSAGE}


def test_device_threads_are_read_by_name_from_proc():
    assert autograd_device_threads() == []  # this process: CPU-only torch, or none started
    assert autograd_device_threads(pid=2**22 + 1) is None  # no such process: cannot tell
    code = ("import sys\nsys.path.insert(0, %r)\nimport autograd_as_on_a_gpu as r\n"
            "r.start_device_thread()\n"
            "from kosmoss.lessons.forks import autograd_device_threads as t\nprint(t())" % str(HERE))
    done = _run(code)
    assert done.stdout.split() == ["['pt_autograd_0']"], done.stderr[-2000:]
