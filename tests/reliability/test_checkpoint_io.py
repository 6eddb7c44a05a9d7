"""A full disk while a checkpoint is written leaves no truncated checkpoint: the file is
written beside its name and renamed (kosmoss.run.train.AtomicCheckpointIO), and every run's
Trainer writes its checkpoints that way. A Ctrl-C that lands while one is written stops the
run as anywhere else (torch.save would turn it into a RuntimeError: a failed run, exit 1)."""
import contextlib
import errno
import os
import signal
import subprocess

import pytest
import torch

from kosmoss.core.errors import RunFailed
from kosmoss.launch.records import Stopped
from kosmoss.run import RunConfig, faults
from kosmoss.run.faults import AtomicCheckpointIO
from kosmoss.run.pipeline import signals_stop_the_run
from kosmoss.run.train import build_trainer


class _Watched:
    """A file whose every write first goes through ``before_write(self, data)``, which may
    raise what the test needs (a full disk) or send a signal."""

    def __init__(self, handle, before_write):
        self.handle, self.before_write = handle, before_write

    def write(self, data):
        self.before_write(self, data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


@contextlib.contextmanager
def _small_disk(path, monkeypatch, size_kib=256):
    """A 256 KiB tmpfs where root may mount one; elsewhere, writes there fail with ENOSPC
    once that much is written (the same error, raised by Python instead of the kernel)."""
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)]
    if os.geteuid() == 0 and subprocess.run(mount).returncode == 0:
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=True)
        return
    real_open = open

    def fill_up(file, data):
        file.written = getattr(file, "written", 0) + len(data)
        if file.written > size_kib * 1024:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def small_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return (_Watched(handle, fill_up) if str(file).startswith(str(path)) and "w" in mode
                else handle)

    monkeypatch.setattr("builtins.open", small_open)
    yield path


def test_a_full_disk_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    with _small_disk(tmp_path / "disk", monkeypatch) as disk:
        target = disk / "checkpoints" / "last.ckpt"
        io = AtomicCheckpointIO()
        io.save_checkpoint({"global_step": 1, "weights": torch.zeros(1000)}, target)
        before = target.read_bytes()
        with pytest.raises(RunFailed) as full:
            io.save_checkpoint({"global_step": 2, "weights": torch.zeros(200_000)}, target)
        assert full.value.__cause__.errno == errno.ENOSPC
        assert f"checkpoint {target} could not be written (No space left on device)" in \
            str(full.value)
        assert target.read_bytes() == before  # the old one, whole
        assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no leftover
        assert io.load_checkpoint(target)["global_step"] == 1


def test_every_run_writes_its_checkpoints_aside(shared_home, monkeypatch):
    from kosmoss.run.plan import prepare

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    trainer = build_trainer(prepare(RunConfig(dataset="tiny", progress=False)), [])
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def interrupting_open(monkeypatch, at_write: int, after: int = 0):
    """``open`` in kosmoss.run.faults, whose files get a real SIGINT sent to this process
    during their ``at_write``-th write, from the ``after``-th file opened on: Python runs the
    handler there, inside torch.save's call back into Python."""
    opened = []

    def interrupt(file, data):
        file.writes = getattr(file, "writes", 0) + 1
        if file.writes == at_write and len(opened) > after:
            os.kill(os.getpid(), signal.SIGINT)

    def interrupting(file, mode="r", *args, **kwargs):
        opened.append(file)
        return _Watched(open(file, mode, *args, **kwargs), interrupt)

    monkeypatch.setattr(faults, "open", interrupting, raising=False)
    return opened


@contextlib.contextmanager
def _pythons_own_ctrl_c():
    """Python's KeyboardInterrupt handler, which a pytest-xdist worker replaces by SIG_IGN."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("at_write", [1, 2, 5])
@pytest.mark.parametrize("handler", ["kosmoss", "python"])
def test_ctrl_c_inside_a_checkpoint_write_stops_and_keeps_the_previous_one(
        tmp_path, monkeypatch, at_write, handler):
    target = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "weights": torch.zeros(1000)}, target)
    before = target.read_bytes()
    interrupting_open(monkeypatch, at_write)
    expected = Stopped if handler == "kosmoss" else KeyboardInterrupt
    guard = signals_stop_the_run() if handler == "kosmoss" else _pythons_own_ctrl_c()
    with guard, pytest.raises(expected) as stop:  # not torch.save's RuntimeError
        io.save_checkpoint({"global_step": 2, "weights": torch.ones(100_000)}, target)
    if handler == "kosmoss":
        assert stop.value.signum == signal.SIGINT
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no leftover


@pytest.mark.slow
def test_a_run_whose_ctrl_c_lands_in_an_epochs_checkpoint_is_stopped(
        shared_home, tmp_path, monkeypatch):
    from stops import batches_per_epoch, run_in_process

    from kosmoss.launch import records

    tiny = shared_home / "data" / "tiny"
    home = tmp_path / "home"
    opened = interrupting_open(monkeypatch, at_write=2, after=1)  # the second checkpoint
    with pytest.raises(Stopped) as stop:
        run_in_process(home, monkeypatch, dataset=str(tiny), batch_size=64, hidden=(16,),
                       max_epochs=5)
    assert stop.value.signum == signal.SIGINT and len(opened) == 2
    run_dir = next((home / "runs").iterdir())
    assert records.read_run(run_dir)["state"] == records.STOPPED
    assert f"--resume {run_dir.name} goes on from its newest checkpoint" in str(stop.value)
    saved = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert not [name for name in saved if ".tmp-" in name], saved
    first_epoch = batches_per_epoch(tiny, 64)
    steps = {torch.load(run_dir / "checkpoints" / name, weights_only=False)["global_step"]
             for name in saved}
    assert steps == {first_epoch}, (saved, steps)  # the first epoch's, whole
