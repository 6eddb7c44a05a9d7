"""Slurm across hosts in network namespaces: one slurmd per host, each in its own UTS and
mount namespace too, so that its hostname is its node name (``h0``, ``h1``, ...) and its
``/etc/hosts`` names every node; slurmctld on host 0. ``sbatch -N 2`` then starts its tasks
on two "nodes" whose network is the hosts' link (docs/hosts.md).

    with host_set(2, None, purpose="run R") as made, slurm_cluster(made) as cluster:
        subprocess.run(cluster.sbatch_command(["--wait", "slurm/submit.sbatch"]))

Debian's slurm-wlm and munge, as root. The daemons run inside the hosts' namespaces, so
removing the hosts ends them (:func:`kosmoss.launch.hosts.remove_hosts`); their
configuration, state and logs live in ``<hosts state>/<set>.slurm/``, removed with the set.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from . import hosts

DAEMONS = ("slurmctld", "slurmd", "sbatch", "munged", "unshare", "nsenter")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")
START_TIMEOUT_S = 60.0
MAX_FIRST_JOB = 60_000_000  # under Slurm's MaxJobId (67,043,328) with room to run

# Every host runs its slurmd in its own namespaces, so the standard ports serve every host.
CONF = """ClusterName=kosmoss-{set_id}
SlurmctldHost=h0({master})
FirstJobId={first_job}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
{nodes}
PartitionName=hosts Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def slurm_missing() -> Optional[str]:
    """Why Slurm cannot run across hosts here (for skips and the CLI), or None."""
    missing = hosts.support_missing()
    if missing:
        return missing
    absent = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found; install Debian's slurm-wlm, munge and util-linux"
    return None


def slurm_folder(set_id: str) -> Path:
    return hosts.STATE_DIR / f"{set_id}.slurm"


@dataclass(frozen=True)
class SlurmCluster:
    made: hosts.HostSet
    folder: Path

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self) -> Dict[str, str]:
        """What an sbatch in host 0 needs: the cluster's configuration, the hosts' link for
        gloo and NCCL, and each rank's share of the machine's cores (Lightning would give
        every rank all of them: the hosts share one machine)."""
        return {"SLURM_CONF": str(self.conf), **self.made.hosts[0].socket_env,
                **self.made.threads_env}

    def sbatch_command(self, args: Sequence[str]) -> List[str]:
        """``sbatch -N <hosts> --ntasks-per-node 1 ARGS`` as typed in host 0."""
        nodes = str(len(self.made.hosts))
        return self.made.hosts[0].command(["sbatch", "-N", nodes, "--ntasks-per-node", "1",
                                           *args], self.env())

    def client(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        """A Slurm client command (sinfo, scontrol, squeue) in host 0."""
        return subprocess.run(self.made.hosts[0].command(argv, {"SLURM_CONF": str(self.conf)}),
                              capture_output=True, text=True)

    def node_states(self) -> Dict[str, str]:
        shown = self.client(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split()
        return dict(zip(shown[0::2], shown[1::2]))

    def log_tails(self, chars: int = 1500) -> str:
        return "\n".join(f"{path.name}: ...{path.read_text(errors='replace')[-chars:]}"
                         for path in sorted(self.folder.glob("*.log")))


def start_slurm(made: hosts.HostSet) -> SlurmCluster:
    """Write slurm.conf, start munged if it is not running, slurmctld and a slurmd on host 0,
    a slurmd on every other host; returns once every node is idle."""
    from ..devices.cpus import available_cores

    folder = slurm_folder(made.set_id)
    (folder / "state").mkdir(parents=True, exist_ok=True)
    cluster = SlurmCluster(made, folder)
    cluster.conf.write_text(conf_text(made, folder, available_cores()))
    start_munge()
    for host in made.hosts:
        for daemon in (["slurmctld"] if host.index == 0 else []) + ["slurmd"]:
            done = subprocess.run(node_command(host, [daemon, "-f", str(cluster.conf)]),
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise hosts.HostError(f"{daemon} on h{host.index}: {done.stderr.strip()}\n"
                                      f"{cluster.log_tails()}")
    _wait_idle(cluster)
    return cluster


def conf_text(made: hosts.HostSet, folder: Path, cores: int) -> str:
    # Every node declares the machine's cores (what slurmd finds; fewer is logged as a
    # mismatch): the hosts share them, and sbatch_command's OMP_NUM_THREADS splits them.
    nodes = "\n".join(f"NodeName=h{h.index} NodeAddr={h.address} CPUs={cores} State=UNKNOWN"
                      for h in made.hosts)
    names = ",".join(f"h{h.index}" for h in made.hosts)
    return CONF.format(set_id=made.set_id, master=made.master_addr, folder=folder,
                       nodes=nodes, names=names, first_job=first_job_id(made.set_id))


def first_job_id(set_id: str) -> int:
    """Job ids that start where no other cluster's do: kosmoss names a Slurm run's folder
    ``slurm-<job id>``, and a new cluster's job 1 would land in the last one's."""
    return 1000 + zlib.crc32(set_id.encode()) % MAX_FIRST_JOB


def node_command(host: hosts.Host, argv: Sequence[str]) -> List[str]:
    """``argv`` as host ``h<i>``'s node: its network namespace, and namespaces of its own
    for the hostname (slurmd finds its node name in it) and /etc/hosts. Not ``ip netns exec``:
    it mounts a new /sys without /sys/fs/cgroup, and slurmd then refuses to start ("No
    filesystem mounted on /sys/fs/cgroup")."""
    names = hosts.NETNS_ETC / host.namespace / "hosts"
    script = (f"mount --bind {shlex.quote(str(names))} /etc/hosts && hostname h{host.index} "
              '&& exec "$@"')
    return ["unshare", "--mount", "--uts", "--propagation", "private", "nsenter",
            f"--net={hosts.NETNS_DIR / host.namespace}", "sh", "-c", script, "sh", *argv]


def start_munge() -> None:
    """munged, as Debian's service starts it, where no service manager did: the daemons of
    every host share its socket under /run/munge (one mount namespace's files)."""
    # `munge -n` asks the daemon for a credential: pgrep would also find one that has
    # exited and is not yet reaped, and leave Slurm without one.
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    if not MUNGE_KEY.exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_RUN.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_RUN, "munge", "munge")
    # munged outlives the run: without the run's marks, kosmoss ghosts never counts it.
    daemon_env = {k: v for k, v in os.environ.items() if not k.startswith("KOSMOSS_")}
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, capture_output=True,
                   env=daemon_env)


def _wait_idle(cluster: SlurmCluster, timeout_s: float = START_TIMEOUT_S) -> None:
    wanted = {f"h{host.index}" for host in cluster.made.hosts}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = cluster.node_states()
        if set(states) == wanted and set(states.values()) == {"idle"}:
            return
        time.sleep(0.5)
    raise hosts.HostError(f"Slurm's nodes did not come up within {timeout_s:.0f} s "
                          f"({cluster.node_states() or 'no answer'}):\n{cluster.log_tails()}")


@contextlib.contextmanager
def slurm_cluster(made: hosts.HostSet) -> Iterator[SlurmCluster]:
    """Slurm on ``made`` for the block; its daemons end and its folder goes with the hosts
    (or here, when the hosts outlive the block)."""
    cluster = start_slurm(made)
    try:
        yield cluster
    finally:
        stop_slurm(cluster)


def stop_slurm(cluster: SlurmCluster) -> None:
    """Every process in the hosts (the daemons, their job steps), then the folder."""
    hosts.end_processes_in([host.namespace for host in cluster.made.hosts])
    shutil.rmtree(cluster.folder, ignore_errors=True)
