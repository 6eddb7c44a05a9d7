"""`kosmoss data prepare` where it cannot write: a read-only home (no data folder yet, a
read-only data folder, --force over a dataset there) is one line and exit 2; a disk that
fills up is one line and exit 1; neither leaves anything half-written nor a lock file.
``--force`` over a kosmoss dataset that holds files kosmoss did not write refuses, naming
them. Read-only and full file systems are tmpfs mounts made for the test (root); elsewhere
the read-only ones are folders without write permission."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
from helpers import REPO, RandomSource

from kosmoss.core.errors import DatasetError, RunFailed
from kosmoss.data.store import prepare


def _kosmoss(home, *args):
    env = {**os.environ, "KOSMOSS_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "kosmoss", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _mount(folder, options):
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


@contextlib.contextmanager
def _read_only(folder, fill=None):
    """``folder`` read-only (after ``fill(folder)`` wrote into it)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = _mount(folder, "size=4m")
    if fill:
        fill(folder)
    if mounted:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    else:
        folder.chmod(0o555)
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def _tiny_dataset(data):
    prepare(RandomSource(20, levels=3), data / "mini", 10)


@pytest.mark.parametrize("variant", ["home", "data folder", "force over a dataset"])
def test_a_read_only_home_is_one_line_and_writes_nothing(variant, tmp_path):
    home = tmp_path / "home"
    if variant == "home":
        context, args = _read_only(home), ["prepare", "--columns", "20", "--levels", "3"]
    elif variant == "data folder":
        context, args = _read_only(home / "data"), ["prepare", "--columns", "20", "--levels", "3"]
    else:
        context = _read_only(home / "data", fill=_tiny_dataset)
        args = ["prepare", "--columns", "20", "--levels", "3", "--seed", "2", "--name", "mini",
                "--force"]
    with context as folder:
        before = sorted(p.name for p in folder.rglob("*"))
        done = _kosmoss(home, "data", *args)
        after = sorted(p.name for p in folder.rglob("*"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "cannot be written" in lines[0] and "nothing written" in lines[0], lines[0]
    assert before == after  # not a file more, not a file less


def test_a_dataset_larger_than_the_free_space_is_refused_before_a_byte_is_written(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount(disk, "size=256k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        done = _kosmoss(tmp_path / "home", "data", "prepare", "--columns", "2000", "--out",
                        str(disk / "big"))
        left = sorted(p.name for p in disk.iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert f"{disk / 'big'}: 2,000 columns take 35.7 MiB, and the disk holding {disk} has " \
        "256 KiB free" in lines[0] and "prepare fewer columns" in lines[0]
    assert left == []  # nothing written, no lock file


def test_a_disk_that_fills_while_preparing_is_one_line_and_leaves_nothing_half_written(
        tmp_path):
    """A source whose size is not known before it is read (a download): the disk fills."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount(disk, "size=256k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with pytest.raises(RunFailed) as failed:
            prepare(RandomSource(2000, levels=137), disk / "big", 500)
        left = sorted(p.name for p in disk.iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert f"{disk / 'big'}: the disk filled up while preparing it (No space left on device)" \
        in str(failed.value) and "nothing half-written is left" in str(failed.value)
    assert left == []  # no temporary folder, no lock file


def test_force_keeps_a_dataset_folder_that_holds_a_file_kosmoss_did_not_write(tmp_path):
    folder = tmp_path / "mini"
    prepare(RandomSource(20, levels=3), folder, 10)
    (folder / "my-notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match=r"holds files kosmoss did not write \(my-notes.txt\)"):
        prepare(RandomSource(20, levels=3, seed=5), folder, 10, force=True)
    assert (folder / "my-notes.txt").read_text() == "keep me"
    (folder / "my-notes.txt").unlink()
    assert prepare(RandomSource(20, levels=3, seed=5), folder, 10, force=True).metadata[
        "source"]["seed"] == 5


def test_refused_targets_leave_no_lock_file(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    with pytest.raises(DatasetError):
        prepare(RandomSource(10), foreign, 10)
    done = _kosmoss(tmp_path / "home", "data", "prepare", "--columns", "10", "--out",
                    str(foreign))
    assert done.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]  # no .foreign.lock


def test_the_error_classes_tell_bad_input_from_a_fault(tmp_path, monkeypatch):
    import errno

    from kosmoss.data import store

    for number, kind in ((errno.EROFS, DatasetError), (errno.ENOSPC, RunFailed),
                         (errno.EIO, RunFailed)):
        error = store._write_error(tmp_path / "d", OSError(number, os.strerror(number)))
        assert isinstance(error, kind) and "\n" not in str(error)
