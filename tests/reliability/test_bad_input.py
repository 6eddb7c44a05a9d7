"""Bad input is one line and exit 2, found before anything heavy or anything written: flag
errors before torch is imported (under a second), a KOSMOSS_HOME that cannot be written
before the run starts."""
import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, run_script, small_tmpfs


def _imported_modules(args, env_extra=None):
    """Run a launcher with ``-X importtime``: the modules it imported, and its result."""
    env = {**os.environ, "KOSMOSS_HOME": "/nonexistent-kosmoss-home", **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")}
    return proc, modules, [line for line in proc.stderr.splitlines()
                           if not line.startswith("import time:")]


@pytest.mark.parametrize("args, names", [
    (["trainup_cpu.py", "--batch-size", "x"], "argument --batch-size: invalid int value"),
    (["trainup_cpu.py", "--lr", "0"], "--lr 0.0: the learning rate must be a number > 0"),
    (["trainup_gpu.py", "--gpus", "0"], "--gpus 0: must be >= 1"),
    (["trainup_cpu.py", "--resume", "nope"], "--resume nope: no such run"),
    (["-m", "kosmoss", "train", "--max-epochs", "0"], "--max-epochs 0: must be >= 1"),
    (["trainup_gpu.py", "--val-every-n-epochs", "0"], "--val-every-n-epochs 0: must be >= 1"),
    (["trainup_cpu.py", "--val-every-n-epochs", "-3"], "--val-every-n-epochs -3: must be >= 1"),
    (["trainup_cpu.py", "--val-every-n-epochs", "2.5"],
     "argument --val-every-n-epochs: invalid int value"),
    (["trainup_cpu.py", "--batch-size", "255", "--num-processes", "2"],
     "--batch-size 255 is not divisible by the world size 2: use a multiple of 2"),
    (["-m", "kosmoss", "train", "--num-nodes", "2", "--num-processes", "2", "--batch-size", "3"],
     "--batch-size 3 is smaller than the world size 4"),
    # Lightning seeds numpy's legacy generator: a uint32 (both were a ValueError traceback).
    (["trainup_cpu.py", "--seed", "-1"], "--seed -1: give a seed from 0 to 4294967295"),
    (["trainup_cpu.py", "--seed", str(2**32)], f"--seed {2**32}: give a seed from 0 to"),
    (["-m", "kosmoss", "data", "prepare", "--columns", "10", "--seed", "-1"],
     "--seed -1: must be >= 0"),
    # NaN passed "<= 0" and reached int() (a traceback); inf too.
    (["-m", "kosmoss", "project", "--bucket-mb", "nan"], "--bucket-mb nan: must be a positive"),
    (["-m", "kosmoss", "project", "--bucket-mb", "inf"], "--bucket-mb inf: must be a positive"),
    (["-m", "kosmoss", "project", "--cores", "nan"], "--cores nan: must be a positive number"),
    # inf reached timedelta's int conversion (an OverflowError traceback); 8e13 s wraps round
    # in torch's microseconds.
    (["trainup_cpu.py", "--collective-timeout", "inf"],
     "--collective-timeout inf: give a number of seconds > 0, at most 31536000 (a year)"),
    (["trainup_gpu.py", "--collective-timeout", "8e13"], "--collective-timeout 80000000000000.0: give a"),
    # Typed empty (an unset shell variable): a new run instead of the resume, the lessons
    # copied into the current folder, the runs folder taken for a run.
    (["trainup_cpu.py", "--resume", ""], "argument --resume: an empty value"),
    (["-m", "kosmoss", "lessons", "--dest", ""], "argument --dest: an empty value"),
    (["-m", "kosmoss", "stacks", ""], "argument RUN: an empty value"),
    (["-m", "kosmoss", "data", "prepare", "--name", ""], "argument --name: an empty value"),
    # A dataset that is none: a typo, a file, a folder with no metadata.json.
    (["trainup_cpu.py", "--dataset", "smal"], "--dataset smal: unknown preset 'smal'"),
    (["trainup_gpu.py", "--dataset", "/dev/null"], "--dataset /dev/null: not a folder; give"),
    (["-m", "kosmoss", "train", "--dataset", "/"], "--dataset /: no metadata.json"),
    # /proc and /sys have no blocks: root passes os.access there, and "0 B free" read as a
    # full disk (or the result could not be written once the run had trained).
    (["trainup_cpu.py", "--result-json", "/proc/kosmoss-x.json"],
     "--result-json /proc/kosmoss-x.json: /proc cannot be written"),
    (["-m", "kosmoss", "lessons", "--dest", "/sys/kosmoss-x"],
     "--dest /sys/kosmoss-x: /sys is on a kernel file system (like /proc or /sys) that holds"),
])
def test_usage_errors_come_before_torch_is_imported(args, names):
    proc, modules, errors = _imported_modules(args)
    assert proc.returncode == 2 and len(errors) == 1 and names in errors[0], errors
    assert not {"torch", "pytorch_lightning", "lightning_fabric"} & modules


@pytest.mark.parametrize("launcher, extra", [
    ("trainup_cpu.py", []), ("trainup_gpu.py", ["--gpus", "2"]),
    ("trainup_cpu.py", ["--num-processes", "2", "--num-nodes", "2"])])
def test_a_batch_larger_than_the_training_rows_is_refused_before_torch(shared_home, launcher,
                                                                     extra):
    """Read from the dataset's metadata.json and the split's sizes (kosmoss.data.splits):
    0.3 s where the plan's own check came after Lightning's import (5 to 8 s)."""
    tiny = shared_home / "data" / "tiny"
    batch = 1640 + 4  # tiny's 2,048 rows hold 1,639 training rows; the batch divides by 4
    proc, modules, errors = _imported_modules([launcher, "--dataset", str(tiny),
                                               "--batch-size", str(batch), *extra])
    assert proc.returncode == 2 and len(errors) == 1, errors
    assert f"--batch-size {batch} is larger than the 1639 training samples of the dataset " \
        f"{tiny}" in errors[0]
    assert not {"torch", "pytorch_lightning", "lightning_fabric"} & modules


@pytest.mark.parametrize("field, value", [("n_samples", "2048"), ("n_x", None),
                                          ("dtype", "01"), ("shards", {})])
def test_an_edited_metadata_json_is_one_line_before_torch(shared_home, tmp_path, field, value):
    """Each was a ValueError, TypeError or SyntaxError traceback from reading the folder."""
    edited = tmp_path / "tiny"
    shutil.copytree(shared_home / "data" / "tiny", edited)
    metadata = json.loads((edited / "metadata.json").read_text())
    metadata[field] = value
    (edited / "metadata.json").write_text(json.dumps(metadata))
    for launcher in (["trainup_cpu.py", "--dataset"], ["-m", "kosmoss", "data", "info"]):
        proc, modules, errors = _imported_modules([*launcher, str(edited)])
        assert proc.returncode == 2 and len(errors) == 1, errors
        assert f"{edited / 'metadata.json'}: {field} " in errors[0] or \
            f"{edited / 'metadata.json'}: its shards" in errors[0], errors
        assert not {"torch", "pytorch_lightning", "lightning_fabric"} & modules


LONG_NAME = "a" * 300  # over NAME_MAX (255 bytes) of Linux's file systems
LONG_PATH = "/".join(["a"] * 2100)  # short names, over PATH_MAX (4096) in all


@pytest.mark.parametrize("args, flag", [
    (["trainup_cpu.py", "--dataset", LONG_NAME], "--dataset: "),
    (["trainup_gpu.py", "--dataset", LONG_PATH], "--dataset: "),
    (["trainup_cpu.py", "--resume", LONG_NAME], ""),
    (["-m", "kosmoss", "data", "info", LONG_NAME], "dataset: "),
    (["-m", "kosmoss", "data", "info", LONG_PATH], ""),
    (["-m", "kosmoss", "data", "prepare", "tiny", "--name", LONG_NAME], ""),
    (["-m", "kosmoss", "data", "prepare", "tiny", "--out", f"{LONG_NAME}/tiny"], ""),
    (["-m", "kosmoss", "stacks", LONG_NAME], ""),
    (["-m", "kosmoss", "watch", LONG_PATH], ""),
    (["-m", "kosmoss", "lessons", "--dest", LONG_NAME], ""),
])
def test_a_name_too_long_for_the_file_system_is_one_line_and_writes_nothing(args, flag,
                                                                              tmp_path):
    """Each was an OSError traceback (ENAMETOOLONG) from the first lookup of the path."""
    home = tmp_path / "home"
    for folder in ("data", "runs"):  # looked in, not only found missing
        (home / folder).mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, *[REPO / a if a.endswith(".py") else a for a in args]],
                          cwd=tmp_path, env={**os.environ, "KOSMOSS_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"error: {flag}'" in lines[0] and "characters): File name too long; give a " \
        "shorter name or path" in lines[0] and len(lines[0]) < 250, lines[0]
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("variables", [{"LOCAL_RANK": "x", "WORLD_SIZE": "2"},
                                       {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "two"},
                                       {"RANK": ""}, {"NODE_RANK": "-1"}])
def test_a_launcher_variable_that_is_no_number_is_one_line_before_torch(variables):
    """LOCAL_RANK=x was a ValueError traceback from torchmetrics' import (its prints.py)."""
    name, value = next((n, v) for n, v in variables.items() if not v.isdecimal())
    proc, modules, errors = _imported_modules(["trainup_cpu.py", "--max-steps", "2"], variables)
    assert proc.returncode == 2 and len(errors) == 1, errors
    assert f"{name}={value!r} is not a whole number >= 0: unset it" in errors[0]
    assert not {"torch", "pytorch_lightning", "lightning_fabric"} & modules


@contextlib.contextmanager
def _read_only_folder(path):
    """A read-only file system (root ignores permission bits), else a folder without write
    permission."""
    path.mkdir()
    if os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)]).returncode == 0:
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=True)
        return
    path.chmod(0o555)
    try:
        yield path
    finally:
        path.chmod(0o755)


def test_a_read_only_kosmoss_home_is_one_line(shared_home, tmp_path):
    with _read_only_folder(tmp_path / "home") as home:
        proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                           "--max-steps", "2"], home, timeout=120)
        assert not any(home.iterdir())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"KOSMOSS_HOME {home}: {home} cannot be written" in lines[0]
    assert "set KOSMOSS_HOME to a folder you can write" in lines[0]


def test_a_kosmoss_home_on_a_full_disk_is_one_line_before_anything_starts(shared_home, tmp_path):
    with small_tmpfs(tmp_path / "disk", full=True) as disk:
        home = disk / "home"
        home.mkdir()  # a folder takes no blocks on tmpfs
        proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                           "--max-steps", "2"], home, timeout=120)
        assert not any(home.iterdir())  # no run folder, no process record
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"KOSMOSS_HOME {home}: the disk holding {home} is full" in lines[0]
    assert "free some space or set KOSMOSS_HOME to a folder on another disk" in lines[0]


@pytest.mark.parametrize("args, says", [
    (["trainup_cpu.py", "--max-steps", "2"], "KOSMOSS_HOME /proc/kosmoss-home: /proc cannot be"),
    (["-m", "kosmoss", "data", "prepare", "tiny"],
     "/proc/kosmoss-home/data/tiny: /proc is on a kernel file system"),
    (["-m", "kosmoss", "comm"], "/proc is on a kernel file system"),
])
def test_a_kosmoss_home_on_a_kernel_file_system_is_one_line(args, says):
    proc = run_script(args, "/proc/kosmoss-home", timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("value", ["", "http", "70000"])
def test_a_master_port_that_is_no_port_is_one_line(shared_home, value):
    proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--num-processes", "2", "--max-steps", "2"], shared_home, timeout=120,
                      env_extra={"MASTER_PORT": value})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"MASTER_PORT {value!r} is not a TCP port: unset it" in lines[0]


@pytest.mark.parametrize("value, why", [
    ("no.such.host.invalid", "does not resolve"),
    ("", "does not resolve"),
    ("192.0.2.1", "is not an address of this machine"),  # TEST-NET-1: never this machine's
])
def test_a_master_addr_the_local_ranks_cannot_meet_at_is_one_line(shared_home, value, why):
    """A MASTER_ADDR left in the shell by a cluster job: Lightning's local ranks retried it
    for minutes (the store's timeout) before a traceback. 192.0.2.1 is only bound to, never
    sent to."""
    proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--num-processes", "2", "--max-steps", "2"], shared_home, timeout=120,
                      env_extra={"MASTER_ADDR": value})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"MASTER_ADDR {value!r} {why}" in lines[0], lines[0]
    assert "every rank of this run starts on this machine: unset it" in lines[0]


def test_a_master_addr_of_this_machine_is_where_the_local_ranks_meet(shared_home):
    proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--num-processes", "2", "--max-steps", "2", "--no-progress"], shared_home,
                      timeout=300, env_extra={"MASTER_ADDR": "localhost"})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("flags, expected", [
    (["--num-processes", "3"], "--num-processes 3 contradicts torchrun's --nproc_per_node 2"),
    (["--max-epochs", "0"], "--max-epochs 0: must be >= 1"),
])
def test_a_bad_flag_under_torchrun_is_said_once(shared_home, tmp_path, flags, expected):
    """Every rank finds it; local rank 0 says it. (torchrun's agent then prints its own
    ChildFailedError traceback: torch/distributed/run.py, not kosmoss's to silence.)"""
    proc = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       "trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--no-progress", *flags], tmp_path / "home", timeout=300)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("trainup_cpu.py:")]
    assert proc.returncode != 0 and len(ours) == 1 and expected in ours[0], proc.stderr[-3000:]


def test_data_workers_that_cannot_fit_are_one_line_and_none_is_started(shared_home, tmp_path):
    """--num-workers 100000 forked until the OOM killer came (it took other processes of
    the machine with it); now the workers are counted with the memory check."""
    home = tmp_path / "home"
    proc = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--max-steps", "2", "--num-workers", "100000"], home, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "--num-workers 100000: 2 loaders x 100000 data workers need about" in lines[0]
    assert "give fewer" in lines[0]
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
