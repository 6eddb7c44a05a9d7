"""--strategy horovod without Horovod, outside horovodrun, and flags that contradict it.

These need no Horovod build: a missing one is simulated, and horovodrun's variables are set
by hand (the ones its gloo mode sets, horovod/runner/gloo_run.py).
"""
import subprocess
import sys

import pytest
from helpers import REPO
from hvdrun import clean_env

from kosmoss import engines, launch
from kosmoss.core.errors import UsageError
from kosmoss.devices.environment import detect_launcher
from kosmoss.run.flags import in_flag_terms

TINY = ["--dataset", "tiny", "--no-progress", "--max-steps", "2"]
# sys.modules["horovod"] = None: find_spec says "not installed" and every import fails.
WITHOUT_HOROVOD = ("import runpy, sys; sys.modules['horovod'] = None; sys.argv = sys.argv[1:]; "
                   "runpy.run_path(sys.argv[0], run_name='__main__')")


def horovodrun_variables(monkeypatch, rank=0, size=2, local_size=2, cross_size=1):
    values = {"HOROVOD_RANK": rank, "HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": rank % local_size,
              "HOROVOD_LOCAL_SIZE": local_size, "HOROVOD_CROSS_RANK": rank // local_size,
              "HOROVOD_CROSS_SIZE": cross_size, "HOROVOD_HOSTNAME": "localhost"}
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME", "LOCAL_RANK",
                 launch.SIMULATED_NODE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))


def test_missing_horovod_is_one_line_naming_the_install_command(tmp_path):
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-c", WITHOUT_HOROVOD, "trainup_gpu.py",
                           "--strategy", "horovod", *TINY], cwd=REPO, env=clean_env(home),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "--strategy horovod" in lines[0] and "bash scripts/install_horovod.sh" in lines[0]
    assert not (home / "runs").exists()  # nothing written


def test_horovodrun_topology_comes_from_its_variables(monkeypatch):
    horovodrun_variables(monkeypatch, rank=3, size=4, local_size=2, cross_size=2)
    assert detect_launcher() == "horovodrun"
    topology = launch.resolve(None, None, engines.get("horovod"))
    assert (topology.launcher, topology.num_nodes, topology.devices_per_node) == ("horovodrun", 2, 2)
    assert (topology.world_size, topology.node_rank, topology.global_rank) == (4, 1, 3)


def test_horovodrun_wins_over_slurm_variables(monkeypatch):
    horovodrun_variables(monkeypatch)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "job")
    assert detect_launcher() == "horovodrun"


@pytest.mark.parametrize("processes, nodes, strategy, needle", [
    (4, None, "horovod", "--gpus 4 contradicts horovodrun's 2"),
    (None, 3, "horovod", "--num-nodes 3 contradicts horovodrun's 1"),
    (None, None, "ddp", "run `trainup_gpu.py --strategy horovod`"),
])
def test_flags_that_contradict_horovodrun(monkeypatch, processes, nodes, strategy, needle):
    horovodrun_variables(monkeypatch)
    with pytest.raises(UsageError) as caught:
        launch.resolve(processes, nodes, engines.get(strategy))
    assert needle in in_flag_terms(caught.value, "--gpus")


def test_uneven_slots_are_refused(monkeypatch):
    horovodrun_variables(monkeypatch, size=3, local_size=2, cross_size=1)
    with pytest.raises(UsageError, match="same slots"):
        launch.resolve(None, None, engines.get("horovod"))


@pytest.mark.parametrize("processes, nodes", [(2, None), (1, 2)])
def test_horovod_with_many_processes_outside_horovodrun_names_the_command(
        monkeypatch, processes, nodes):
    for name in ("HOROVOD_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", launch.SIMULATED_NODE_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError, match=r"`horovodrun -np 2 --gloo python trainup_gpu.py"):
        launch.resolve(processes, nodes, engines.get("horovod"))


def test_horovod_alone_is_one_process(monkeypatch):
    for name in ("HOROVOD_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", launch.SIMULATED_NODE_ENV):
        monkeypatch.delenv(name, raising=False)
    topology = launch.resolve(None, None, engines.get("horovod"))
    assert (topology.launcher, topology.world_size) == ("single", 1)
