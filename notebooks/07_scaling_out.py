# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 7 — Scaling out: several nodes, torchrun, Slurm, Horovod
#
# **What you will learn**
#
# - the names of a multi-node job: global rank, local rank, node rank, world size, and
#   the rendezvous that brings the ranks together;
# - how to run a two-node job on one machine (`trainup_gpu.py --num-nodes 2`), and why
#   starting Lightning once with two nodes hangs;
# - torchrun as a launcher, and how kosmoss defers to it;
# - Slurm: the batch script, the signal before the time limit, requeue and resume;
# - Horovod: `horovodrun`, and how it differs from DDP.
#
# Time: ~25 min; the cells run in ~2 min on 2 CPU cores

# %%
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kosmoss.core import paths
from kosmoss.launch import free_port
from kosmoss.lessons import quiet_lightning, script, sh, scratch_folder

quiet_lightning()

scratch = scratch_folder("lesson07-")


def clean_env(**extra):
    """This kernel's environment without the variables of an earlier launch."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "RANK",
                        "WORLD_SIZE", "KOSMOSS_RUN_ID")}
    return {**env, **{k: str(v) for k, v in extra.items()}}


def trained(out):
    return json.loads(Path(out).read_text())

# %% [markdown]
# ## Ranks, nodes and the rendezvous
#
# A job runs `nodes × processes per node` ranks. Each process knows:
#
# - its **global rank** (`RANK`), unique in the job; rank 0 usually prints and writes;
# - its **local rank** (`LOCAL_RANK`), unique on its node: it picks the GPU;
# - its **node rank** (`NODE_RANK`, `GROUP_RANK` under torchrun);
# - the **world size** (`WORLD_SIZE`), the number of ranks.
#
# To find each other, the ranks meet at a **rendezvous**: one address and port
# (`MASTER_ADDR`, `MASTER_PORT`) where rank 0's node keeps a small key-value store.
# Every rank connects there, says who it is, and learns the others' addresses; then the
# process group (gloo or NCCL) is built. Nobody starts until all of the world has
# arrived.
#
# Let us watch it with torchrun, PyTorch's launcher, starting *two nodes on this one
# machine*: two torchrun agents, `--node-rank 0` and `--node-rank 1`, meeting at the same
# address and port, one process each. The probe script prints what each rank is told.

# %%
probe = scratch / "probe.py"
probe.write_text(
    "import os, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "names = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')\n"
    "print(' '.join(f'{n}={os.environ[n]}' for n in names), flush=True)\n"
    "dist.destroy_process_group()\n")
port = free_port()
agents = [subprocess.Popen(
    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
     "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), probe],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    for node in (0, 1)]
for node, agent in enumerate(agents):
    output, _ = agent.communicate(timeout=120)
    lines = [line for line in output.splitlines() if line.startswith("RANK=")]
    print(f"node {node}: {lines[0] if lines else output[-2000:]}")
    if agent.returncode != 0:
        raise RuntimeError(f"torchrun node {node} exited with {agent.returncode}")

# %% [markdown]
# ## Two nodes on one machine with kosmoss
#
# Lightning builds the world from the same variables. Here is the trap the original
# course fell into: starting a script **once** with `num_nodes=2` makes that process node
# 0, and it waits at the rendezvous for node 1, which nobody starts (its log stops at
# `MEMBER 1/2`): not forever, but for the process group's timeout — printed below,
# Lightning's default — and then fails with a timeout error, that long after. Each
# node needs its own process with its own `NODE_RANK`, and the same `MASTER_ADDR` and
# `MASTER_PORT`.
#
# Without a cluster around it, `trainup_gpu.py --num-nodes 2` does exactly that on this
# host: it starts one node process per node and waits for both (and ends the other if
# one fails). Without a GPU it trains on CPU, with a warning.

# %%
from lightning_fabric.plugins.collectives.torch_collective import default_pg_timeout

print(f"Lightning's process-group timeout: {default_pg_timeout} (DDPStrategy(timeout=...) "
      "changes it)")
out = scratch / "two-nodes.json"
sh([sys.executable, script("trainup_gpu.py"), "--strategy", "ddp", "--gpus", "1",
    "--num-nodes", "2", "--dataset", "tiny", "--batch-size", "128", "--max-epochs", "1",
    "--no-progress", "--result-json", out], env=clean_env())
two_nodes = trained(out)
print({k: two_nodes[k] for k in ("num_nodes", "devices_per_node", "world_size", "backend",
                                 "replicas_identical")})
assert (two_nodes["num_nodes"], two_nodes["devices_per_node"], two_nodes["world_size"]) == \
    (2, 1, 2), "two nodes of one process each"
assert two_nodes["replicas_identical"]

# %% [markdown]
# ## torchrun
#
# On a real cluster without Slurm, you start one torchrun agent per node; torchrun
# starts the local ranks, restarts them on failure if asked, and sets the variables.
# `--standalone` is the one-node shortcut (its own rendezvous on a free port). Under
# torchrun, kosmoss never starts processes itself: the world size is torchrun's, and a
# flag that contradicts it is a one-line error.

# %%
out = scratch / "torchrun.json"
sh([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
    script("trainup_cpu.py"), "--dataset", "tiny", "--batch-size", "128", "--max-epochs", "1",
    "--no-progress", "--result-json", out], env=clean_env())
under_torchrun = trained(out)
print({k: under_torchrun[k] for k in ("launcher", "world_size", "backend", "replicas_identical")})
assert under_torchrun["world_size"] == 2, "torchrun's --nproc-per-node, not kosmoss's default"
assert under_torchrun["replicas_identical"]

# %% [markdown]
# ## Slurm: batch script, signals, requeue and resume
#
# On an HPC cluster, Slurm allocates the nodes and `srun` starts one task per rank;
# Lightning reads the `SLURM_*` variables (its `SLURMEnvironment`) and kosmoss takes the
# world size from the allocation. The template below is what you submit with
# `sbatch slurm/submit.sbatch --dataset small`. Note the last `#SBATCH` lines, and what
# each does in Slurm:
#
# - `--signal=SIGUSR1@90` asks Slurm to send `SIGUSR1` to the job's tasks about that
#   many seconds before the time limit (Slurm checks once a minute, so it may come up to
#   a minute earlier; `B:` in front would signal only the batch shell instead).
# - At the time limit itself Slurm sends `SIGTERM`, waits `KillWait` seconds (a
#   cluster setting in `slurm.conf`; `scontrol show config` prints it) and then
#   `SIGKILL`; `scancel` does the
#   same. A job that reaches its time limit ends as `TIMEOUT` and is **not** requeued.
# - `--requeue` only *allows* the job to be requeued: by Slurm when a node fails or a
#   preemption with `PreemptMode=REQUEUE` takes the nodes (the job gets `SIGTERM` first,
#   then `SIGKILL` after the partition's grace time), or by anyone with
#   `scontrol requeue <job id>`. A requeued job keeps its job id and starts the batch
#   script again; `--open-mode=append` keeps its log.

# %%
print(script("slurm/submit.sbatch").read_text())

# %% [markdown]
# kosmoss handles both signals the same way: every rank stops at the **same** step — the
# ranks agree on it through an all-reduce — writes `checkpoints/preempted.ckpt`, and the
# job exits cleanly. On `SIGUSR1` under Slurm, rank 0 also runs `scontrol requeue` on its
# own job, since Slurm would not requeue a job for its time limit; the requeued job keeps
# its job id and so its run folder, and resumes from that checkpoint by itself. After
# `SIGTERM` (scancel, time limit, preemption) it only checkpoints, and Slurm decides
# whether the job comes back. Elsewhere, `--resume <run id>` continues the run. We can try that part on this
# machine: start two ranks, send `SIGUSR1` to the launching process once training has
# started, then resume.

# %%
def training(since):
    """True once rank 0 of a run started after `since` has taken a few steps: it writes
    <run dir>/heartbeats/rank-0.json (what `kosmoss watch` reads) once a second."""
    for beat in paths.runs_root().glob("*/heartbeats/rank-0.json"):
        try:
            if beat.stat().st_mtime >= since and json.loads(beat.read_text())["step"] >= 5:
                return True
        except (OSError, ValueError, KeyError):
            pass  # being written
    return False


command = [sys.executable, str(script("trainup_cpu.py")), "--num-processes", "2",
           "--dataset", "tiny", "--batch-size", "64", "--max-epochs", "100000",
           "--max-steps", "5000",  # a limit, in case the signal never comes
           "--no-progress", "--result-json", str(scratch / "stopped.json")]
print("$ " + " ".join(["python"] + command[1:]))
log_path = scratch / "stopped.log"
with open(log_path, "w") as log:
    launched = time.time()
    run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
    deadline = time.monotonic() + 240
    while not training(since=launched):  # the signal handlers are set once training starts
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run did not start: {log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    print(f"--- sending SIGUSR1 to pid {run.pid}")
    run.send_signal(signal.SIGUSR1)
    run.wait(timeout=180)
print(log_path.read_text())
stopped = trained(scratch / "stopped.json")
print(f"exit code {run.returncode}; stopped by {stopped['stopped_by']} at step "
      f"{stopped['global_step']}; checkpoint: "
      f"{(Path(stopped['run_dir']) / 'checkpoints' / 'preempted.ckpt').is_file()}")
assert run.returncode == 0 and stopped["stopped_by"] == "SIGUSR1"
assert (Path(stopped["run_dir"]) / "checkpoints" / "preempted.ckpt").is_file()

# %%
target = stopped["global_step"] + 20
sh([sys.executable, script("trainup_cpu.py"), "--num-processes", "2", "--dataset", "tiny",
    "--batch-size", "64", "--max-epochs", "100000", "--max-steps", str(target), "--no-progress",
    "--resume", stopped["run_id"], "--result-json", scratch / "resumed.json"], env=clean_env())
resumed = trained(scratch / "resumed.json")
print(f"resumed from step {resumed['resumed_from_step']} in the same folder "
      f"({resumed['run_dir'] == stopped['run_dir']}), finished at step {resumed['global_step']}, "
      f"test loss {resumed['test_loss']:.4f}")
assert resumed["resumed_from_step"] == stopped["global_step"] and resumed["global_step"] == target
assert resumed["run_dir"] == stopped["run_dir"]

# %% [markdown]
# Now the real Slurm, if this machine has one that answers (`sinfo`). Without one, the
# cell says so and what it would show.

# %%
sinfo = shutil.which("sinfo") and subprocess.run(["sinfo", "-h", "-o", "%P %a %D %T"],
                                                 capture_output=True, text=True, timeout=30)
if not sinfo or sinfo.returncode != 0:
    why = "Slurm is not installed" if not sinfo else "sinfo does not answer (no controller)"
    print(f"{why} (Slurm only; no recorded result yet): on a cluster this cell runs "
          "`sbatch --wait slurm/submit.sbatch --dataset tiny --max-epochs 1` and reads the "
          "job's result.json")
else:
    print("partitions:", sinfo.stdout.strip())
    job = subprocess.run(["sbatch", "--parsable", "--wait", "--time=00:10:00",
                          str(script("slurm/submit.sbatch")), "--dataset", "tiny",
                          "--max-epochs", "1", "--no-progress"],
                         capture_output=True, text=True, timeout=600,
                         env=clean_env(KOSMOSS_PYTHON=sys.executable))
    job_id = job.stdout.strip().split(";")[0]
    print(f"sbatch exit code {job.returncode}, job {job_id}")
    slurm_result = Path(os.environ.get("KOSMOSS_HOME", Path.home() / ".kosmoss")) / "runs" / \
        f"slurm-{job_id}" / "result.json"
    if slurm_result.is_file():
        print({k: trained(slurm_result)[k] for k in ("launcher", "world_size", "test_loss")})
    else:
        print(f"no {slurm_result}; the job's log: kosmoss-{job_id}.out")

# %% [markdown]
# ## Horovod
#
# Horovod, from Uber, was the other way to do data parallelism before DDP matured, and
# the original course used it. The idea is the same — one process per device, averaged
# gradients — with three differences:
#
# - **its own runtime and launcher**: `horovodrun` (or `mpirun`) starts the ranks;
#   Horovod's background thread negotiates which tensors are ready on every rank and
#   all-reduces them with MPI, gloo or NCCL;
# - **an optimizer wrapper**, `hvd.DistributedOptimizer`, instead of a model wrapper:
#   gradients are all-reduced as they are produced, and `hvd.broadcast_parameters` makes
#   the replicas identical at the start;
# - **framework-agnostic**: the same runtime serves TensorFlow, PyTorch and MXNet.
#
# Lightning 2 dropped its Horovod strategy, so kosmoss carries its own (the module
# `kosmoss.engines.horovod`, whose file the cell below prints), with the same flags and
# the same `result.json`. Horovod's last release does not build against today's torch out
# of the box; `scripts/install_horovod.sh`, copied beside this notebook with
# `docs/horovod.md`, builds it.

# %%
engine = importlib.util.find_spec("kosmoss.engines.horovod")
print(f"kosmoss's Horovod engine: {engine.origin}")
hvd_problem = None
if importlib.util.find_spec("horovod") is None:
    hvd_problem = "Horovod is not installed (see docs/horovod.md: bash scripts/install_horovod.sh)"
elif not shutil.which("horovodrun"):
    hvd_problem = "horovodrun is not on the PATH"
horovod_command = ["horovodrun", "-np", "2", "--gloo", sys.executable,
                   str(script("trainup_gpu.py")), "--strategy", "horovod", "--dataset", "tiny",
                   "--batch-size", "128", "--max-epochs", "1", "--no-progress",
                   "--result-json", str(scratch / "horovod.json")]
if hvd_problem:
    print(f"{hvd_problem} (Horovod only; no recorded result yet). With it, this cell runs\n  "
          + " ".join(["horovodrun"] + horovod_command[1:4] + ["python"] + horovod_command[5:]))
else:
    sh(horovod_command, env=clean_env())
    hvd_run = trained(scratch / "horovod.json")
    print({k: hvd_run[k] for k in ("strategy", "launcher", "world_size", "replicas_identical",
                                   "test_loss")})
    assert hvd_run["replicas_identical"] and hvd_run["world_size"] == 2

# %% [markdown]
# ## With a GPU
#
# On GPU nodes the same commands use NCCL and one GPU per local rank:
# `trainup_gpu.py --gpus N --num-nodes K` (simulated here, or one command per node with
# `NODE_RANK` set on a cluster), `torchrun --nproc-per-node N trainup_gpu.py`, and in
# the Slurm template uncomment `--gpus-per-node` and make `--ntasks-per-node` match it.
# Horovod built with NCCL (the install script does it when it finds `nvcc`) all-reduces
# on the GPUs. The `trainup_gpu.py` cells above already use the GPUs when this machine
# has any; without one, each printed the warning that it fell back to CPU.
#
# ## Exercises
#
# 1. Start the torchrun probe with `--nproc-per-node 2` on each of the two nodes. Which
#    global ranks does node 1 get, and which local ranks?
# 2. Why does `trainup_gpu.py --num-nodes 2` refuse `--batch-size 130` with `--gpus 2`?
# 3. Send `SIGTERM` instead of `SIGUSR1` in the stop-and-resume cell. What is different
#    in `result.json`, and what would be different under Slurm?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. node 1 gets global ranks 2 and 3 (node_rank * nproc_per_node + local_rank), local
# #    ranks 0 and 1; the world size is 4.
# # 2. the world is 2 nodes x 2 processes = 4 ranks, and 130 is not a multiple of 4:
# sh([sys.executable, script("trainup_gpu.py"), "--gpus", "2", "--num-nodes", "2",
#     "--batch-size", "130", "--dataset", "tiny"], check=False)  # exit code 2, one line
# # 3. stopped_by is "SIGTERM". Under Slurm kosmoss requeues only on SIGUSR1 ("time is
# #    nearly up", scontrol requeue); after SIGTERM it checkpoints and exits, and the job
# #    comes back only if Slurm requeues it (a preemption with PreemptMode=REQUEUE).
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 07` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Convert between global rank and (node rank, local rank).**
#
# A job runs `num_nodes × devices_per_node` ranks; torchrun, Slurm and Lightning number
# them node after node, from `0`. Write two functions: `rank_of(node_rank, local_rank,
# devices_per_node)`, the global rank (`RANK`, an integer) of local rank `local_rank` on
# node `node_rank`; and `place_of(rank, devices_per_node)`, the `(node_rank, local_rank)`
# of global rank `rank` (local rank also picks the GPU on its node). The checker goes
# through every rank of jobs from `1 × 4` and `3 × 1` to `4 × 8`.

# %%
# exercise: 07.rank_arithmetic
def rank_of(node_rank, local_rank, devices_per_node):
    """The global rank."""
    raise NotImplementedError("your code here")


def place_of(rank, devices_per_node):
    """(node_rank, local_rank) of a global rank."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("07.rank_arithmetic", globals())
