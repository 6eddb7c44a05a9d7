"""A learner stops a cell with Jupyter's interrupt, which sends SIGINT to the kernel's whole
process group (jupyter_client's LocalProvisioner.send_signal). The ranks a lesson forks
(``on_ranks``, ``forked``) and the command ``sh`` runs end with the cell, nothing is left
in the kernel's process table, and the kernel obeys the next interrupt. That holds after an
interrupted Lightning fit too: Lightning ignores SIGINT for its shutdown and never gives it
back (pytorch_lightning/trainer/call.py), but ipykernel sets Python's handler again for
every cell it runs (ipykernel/kernelbase.py, ``pre_handler_hook``)."""
from __future__ import annotations

import queue
import time

import psutil
import pytest
from jupyter_client import KernelManager

SETUP = r"""
import os, signal, sys, time
from pathlib import Path
from kosmoss.lessons import forked, on_ranks, one_thread_per_forked_rank, sh

def wait_as_a_rank(rank, world_size, port):
    time.sleep(600)

def wait_forked():
    time.sleep(600)

# A command that, as kosmoss's runs do, saves what it has on Ctrl-C, then says how it stopped.
SAYS_HOW = ("import sys, time\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n"
            "    time.sleep(1)\n"
            "    print('stopped by SIGINT; --resume RUN goes on', flush=True)\n    sys.exit(130)")
DEAF = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
"""
A_FIT = """
import pytorch_lightning as pl, torch

class Slow(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        Path({started!r}).touch()  # the fit is under way: the test interrupts now
        time.sleep(0.05)
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4096, 8)))
pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
           enable_checkpointing=False, enable_model_summary=False).fit(Slow(), data)
"""
CELL_TIMEOUT_S = 120


class Kernel:
    """A python3 kernel as Jupyter runs it, and the learner's interrupt button."""

    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.process = psutil.Process(self.manager.provisioner.process.pid)

    def run(self, code: str, interrupt_when=None) -> str:
        """The cell's output and its error's name ("ERROR KeyboardInterrupt"); interrupted
        once ``interrupt_when()`` is true."""
        msg_id = self.client.execute(code)
        deadline, interrupted, out = time.monotonic() + CELL_TIMEOUT_S, False, []
        while True:
            if interrupt_when is not None and not interrupted and interrupt_when():
                self.manager.interrupt_kernel()
                interrupted = True
            try:
                msg = self.client.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                assert time.monotonic() < deadline, f"the cell did not end: {''.join(out)}"
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                out.append(f"ERROR {content['ename']}")
            elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
                return "".join(out)

    def descendants(self) -> list:
        return self.process.children(recursive=True)

    def running(self, count: int):
        """A condition: ``count`` processes under the kernel, and a moment for them to start."""
        def ready() -> bool:
            live = [p for p in self.descendants() if _alive(p)]
            if len(live) < count:
                return False
            time.sleep(0.5)  # past their start-up, into what the cell runs
            return True
        return ready

    def close(self) -> None:
        for process in self.descendants():  # a failed test's: not left running
            process.kill()
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # ended between the listing and the look
        return False


@pytest.fixture(scope="module")
def kernel():
    kernel = Kernel()
    assert "ERROR" not in kernel.run(SETUP)
    yield kernel
    kernel.close()


def _interrupt_obeyed(kernel: Kernel, scratch) -> float:
    """Seconds a sleeping cell took to stop once interrupted. It is interrupted once it runs:
    an interrupt that comes before is lost (an idle kernel ignores SIGINT,
    ipykernel/kernelapp.py)."""
    asleep = scratch / "asleep"
    started = time.monotonic()
    output = kernel.run(f"Path({str(asleep)!r}).touch(); time.sleep(600)",
                        interrupt_when=asleep.exists)
    assert output.endswith("ERROR KeyboardInterrupt"), output[-2000:]
    return time.monotonic() - started


@pytest.mark.parametrize("cell, processes", [
    ("on_ranks(wait_as_a_rank, 3)", 3),
    ("forked(wait_forked)", 1),
    ("sh([sys.executable, '-c', 'import time; time.sleep(600)'])", 1),
])
def test_an_interrupted_cell_leaves_no_process_in_the_kernel(kernel, cell, processes,
                                                              tmp_path):
    output = kernel.run(cell, interrupt_when=kernel.running(processes))
    assert output.endswith("ERROR KeyboardInterrupt"), output[-2000:]
    deadline = time.monotonic() + 10
    while kernel.descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kernel.descendants() == []  # none running, and none a zombie: all were reaped
    assert _interrupt_obeyed(kernel, tmp_path) < 10


def test_an_interrupted_command_says_how_it_stopped(kernel, tmp_path):
    """``sh`` shows what the command says as it stops (a run: how to resume it), as a
    terminal does after Ctrl-C."""
    output = kernel.run("sh([sys.executable, '-c', SAYS_HOW])", interrupt_when=kernel.running(1))
    assert "stopped by SIGINT; --resume RUN goes on" in output.splitlines(), output[-2000:]
    assert output.endswith("ERROR KeyboardInterrupt") and kernel.descendants() == []


def test_an_interrupted_command_that_ignores_it_is_ended_after_the_grace(kernel, tmp_path):
    kernel.run("import kosmoss.lessons.course as course; course.SH_STOP_GRACE_S = 2")
    try:
        started = time.monotonic()
        output = kernel.run("sh([sys.executable, '-c', DEAF])", interrupt_when=kernel.running(1))
        assert output.endswith("ERROR KeyboardInterrupt") and kernel.descendants() == []
        assert 2 <= time.monotonic() - started < 2 + 10
    finally:
        kernel.run("course.SH_STOP_GRACE_S = 20.0")


def test_an_interrupted_notebook_launcher_fit_leaves_no_rank_in_the_kernel(kernel, tmp_path):
    """Lightning's ``ddp_notebook`` ranks are forked from the kernel and get the interrupt
    too; Lightning's launcher does not reap them (they stayed zombies): the lessons' guard
    around that fit does."""
    started = tmp_path / "fit-started"
    cell = A_FIT.format(started=str(started)).replace(
        'devices=1,', 'devices=2, strategy="ddp_notebook",').replace(
        "pl.Trainer(", "with one_thread_per_forked_rank():\n    pl.Trainer(")
    output = kernel.run(cell, interrupt_when=started.exists)
    assert "ERROR SystemExit" in output, output[-2000:]
    assert kernel.descendants() == []
    assert _interrupt_obeyed(kernel, tmp_path) < 10


def test_the_kernel_obeys_the_interrupt_after_an_interrupted_lightning_fit(kernel, tmp_path):
    started = tmp_path / "fit-started"
    output = kernel.run(A_FIT.format(started=str(started)), interrupt_when=started.exists)
    assert "Detected KeyboardInterrupt" in output, output[-2000:]  # Lightning's shutdown ran
    assert "ERROR SystemExit" in output, output[-2000:]  # its sys.exit(1)
    assert kernel.run("print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
                      ).strip() == "True"
    assert _interrupt_obeyed(kernel, tmp_path) < 10
