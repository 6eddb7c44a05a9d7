"""A full disk while a checkpoint is written leaves no truncated checkpoint: the file is
written beside its name and renamed (kosmoss.run.train.AtomicCheckpointIO), and every run's
Trainer writes its checkpoints that way."""
import contextlib
import errno
import os
import subprocess

import pytest
import torch

from kosmoss.core.errors import RunFailed
from kosmoss.run import RunConfig
from kosmoss.run.faults import AtomicCheckpointIO
from kosmoss.run.train import build_trainer


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

    class Full:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, data):
            self.written += len(data)
            if self.written > size_kib * 1024:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def small_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return Full(handle) if str(file).startswith(str(path)) and "w" in mode else handle

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
