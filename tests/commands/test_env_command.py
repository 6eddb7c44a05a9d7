"""``kosmoss env`` as a user runs it."""
import json

import pytest
from helpers import run_script

from kosmoss.devices.environment import detect_launcher


def test_env_json_describes_this_machine(tmp_path):
    proc = run_script(["-m", "kosmoss", "env", "--json"], tmp_path / "home")
    assert proc.returncode == 0 and "FATAL" not in proc.stderr, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["cpu"]["cores_available"] >= 1 and facts["backends"]["gloo"] is True
    assert facts["torch"].startswith("2.") and facts["lightning"].startswith("2.")
    assert isinstance(facts["gpus"], list) and facts["launcher"] is None
    assert facts["kosmoss_home"] == str(tmp_path / "home")
    if not facts["cuda_available"]:
        assert facts["nccl"] is None


def test_env_table_for_people(tmp_path):
    proc = run_script(["-m", "kosmoss", "env"], tmp_path / "home")
    assert proc.returncode == 0 and "backends" in proc.stdout and "CPU cores" in proc.stdout


@pytest.mark.parametrize("variables, launcher", [
    ({}, None),
    ({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2",
      "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "torchrun"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "train",
      "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, "slurm"),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, "horovodrun"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "mpirun"),
])
def test_launcher_detection(monkeypatch, variables, launcher):
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME", "HOROVOD_RANK",
                 "OMPI_COMM_WORLD_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert detect_launcher() == launcher


def test_a_relative_home_is_made_absolute_where_it_was_given(tmp_path, monkeypatch):
    """A run's paths (printed, and kept in run.json) named another folder once read from
    another working folder when KOSMOSS_HOME was relative."""
    from kosmoss.core import paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KOSMOSS_HOME", "course/home")
    assert paths.home() == tmp_path / "course" / "home"
    assert paths.runs_root().is_absolute()
