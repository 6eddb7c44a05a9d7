"""A real one-node Slurm on localhost (Debian's slurm-wlm and munge), started once."""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kosmoss.launch.host_slurm import start_munge
from kosmoss.launch.ports import free_port

CONF = """ClusterName=kosmoss-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ReturnToService=2
# A loaded CI machine can take more than the default 60 s to end a requeued job's ranks:
# Slurm would then drain the node and fail the job instead of requeueing it.
UnkillableStepTimeout=300
MpiDefault=none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """SLURM_CONF of a running one-node cluster; skipped where Slurm is not installed."""
    if not shutil.which("slurmctld") or os.geteuid() != 0:
        pytest.skip("needs Debian's slurm-wlm and munge, as root (.ci/run installs them)")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(CONF.format(host=socket.gethostname(), dir=folder, cpus=os.cpu_count(),
                                ctld_port=free_port(), d_port=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    # The daemons outlive every test: none may look like a run of a test's KOSMOSS_HOME.
    daemon_env = {k: v for k, v in env.items() if not k.startswith("KOSMOSS_")}
    start_munge()  # kosmoss's own: munged as Debian's service starts it, without our marks
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=daemon_env)
    subprocess.run(["slurmd", "-f", str(conf)], check=True, env=daemon_env)
    try:
        _wait_idle(env, folder)
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            _kill_from(folder / pid_file)


def _wait_idle(env, folder, timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if state.stdout.strip() == "idle":
            return
        time.sleep(1)
    raise RuntimeError(f"Slurm did not come up: {(folder / 'slurmctld.log').read_text()[-2000:]}")


def _kill_from(pid_file: Path) -> None:
    try:
        os.kill(int(pid_file.read_text()), 9)
    except (OSError, ValueError):
        pass
