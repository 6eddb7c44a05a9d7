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
# # Lesson 6 — Ghost jobs
#
# **What you will learn**
#
# - what a *ghost* is: a process of a run that has no run left to serve, still holding
#   memory, cores and the rendezvous port;
# - why a launcher kosmoss starts leaves none, and how to make one on purpose (kill
#   torchrun's agent), then find it with `kosmoss ghosts`;
# - how to end it with `kosmoss ghosts --kill`, and see the port and the memory come back;
# - the in-process case: a notebook kernel that keeps GPU memory, and
#   `kosmoss.release_memory()`;
# - nvitop, to see who holds a GPU.
#
# Time: ~15 min; the cells run in ~1 min on 2 CPU cores

# %% [markdown]
# ## Why ghosts happen
#
# A distributed run is several processes. If the one that started the others dies
# without ending them — `kill -9`, the out-of-memory killer, a closed terminal, a
# notebook kernel restarted mid-run — the others may live on. They hold GPU memory, the
# cores, and `MASTER_PORT`: the next run fails with EADDRINUSE ("address already in use"), or finds no
# GPU memory left. The original course's advice was to find the pid in nvitop and
# `kill` it by hand (and its notebook shipped a `kill 99999999` that failed).
#
# kosmoss marks every process of a run (in its environment and in a record under the
# run folder) so that `kosmoss ghosts` can tell a ghost from a healthy run, and from a
# process that merely looks like one.

# %%
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

import kosmoss
from kosmoss.ghosts import KOSMOSS_GHOSTS, find_ghosts, port_is_free
from kosmoss.launch import free_port, port_holders
from kosmoss.lessons import quiet_lightning, recorded_gpu, script, sh, scratch_folder

quiet_lightning()

scratch = scratch_folder("lesson06-")


def running(pid):
    """Alive and not a zombie (a dead child nobody has reaped yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree_rss(pids):
    """Resident memory of these processes and their descendants, in MB."""
    total = 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            total += sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
    return total / 1e6

# %% [markdown]
# ## A launcher kosmoss starts takes its ranks along
#
# We start a long two-node run, simulated on this machine (lesson 7): a parent process
# starts one process per node, and node 0 listens on `MASTER_PORT`. We choose the port
# ourselves so that we can watch it. Once training runs, we kill the **parent** with
# `SIGKILL`, as the out-of-memory killer would: it gets no chance to end its nodes.
# Every process kosmoss starts asks the kernel, before it runs any Python, to be sent
# `SIGKILL` when its parent dies (`prctl(PR_SET_PDEATHSIG)`, `kosmoss.launch.die_with`;
# the local ranks Lightning starts arm it themselves, with kosmoss's `die_with_spawner`).
# The cell prints what became of the nodes and of the port.

# %%
port = free_port()
log = open(scratch / "run.log", "w")
launcher = subprocess.Popen(
    [sys.executable, str(script("trainup_gpu.py")), "--gpus", "1", "--num-nodes", "2",
     "--dataset", "tiny", "--batch-size", "64", "--max-epochs", "100000",
     "--max-steps", "10000", "--no-progress"],  # a step limit, in case a cell below fails
    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MASTER_PORT": str(port)})
deadline = time.monotonic() + 240
while port_is_free(port):  # node 0 listens on the port once the process group is up
    if launcher.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(f"the run did not start: {(scratch / 'run.log').read_text()[-3000:]}")
    time.sleep(0.5)
nodes = [child.pid for child in psutil.Process(launcher.pid).children()]
holders = port_holders(port)
print(f"launcher pid {launcher.pid}, node processes {nodes}; MASTER_PORT {port} is held by "
      f"pid(s) {holders}: node 0's rank 0, whose TCPStore serves the rendezvous")
assert set(holders) <= set(nodes) and holders, "the store lives in a node process"
launcher.kill()  # SIGKILL: the launcher cannot clean up
launcher.wait()
deadline = time.monotonic() + 10
# The kernel closes a dead process's sockets as it exits, and a process the nodes started
# exits on its own parent-death signal a moment later: wait for the port too.
while (any(running(pid) for pid in nodes) or not port_is_free(port)) and \
        time.monotonic() < deadline:
    time.sleep(0.2)
print(f"launcher killed; node processes still alive: {[p for p in nodes if running(p)]}; "
      f"port {port} free: {port_is_free(port)}")
assert not any(running(pid) for pid in nodes), "a node process outlived its launcher"
assert port_is_free(port), \
    f"MASTER_PORT {port} still held after the launcher died, by pid(s) {port_holders(port)}"

# %% [markdown]
# Who holds `MASTER_PORT` is worth knowing exactly. It is not "the run": it is the
# **TCPStore**, the small key-value server through which the ranks found each other,
# and it lives in global rank 0's process (under torchrun, in the agent of node 0). It
# keeps the port for as long as the store lives — after the other ranks have finished,
# and after rank 0 has stopped training — until that process exits or destroys its
# process group (`torch.distributed.destroy_process_group()`: kosmoss does as a run ends;
# Lightning does at exit, and on NCCL only). So a rank that finished does not
# give the port back unless it was the one hosting the store, and checking "is any rank
# of my run still alive" is not the same as "is the port free": ask who listens on it
# (`kosmoss ghosts --port`, `kosmoss.launch.port_holders`).
#
# ## Make a ghost on purpose: torchrun
#
# Other launchers decide for themselves what outlives them. torchrun's agent starts each
# worker in a session of its own and arms no parent-death signal
# (`torch/distributed/elastic/multiprocessing/subprocess_handler`), so a worker whose
# agent is killed goes on training — for nobody, since the agent that would have collected
# its result is dead. We start one worker under torchrun, wait for its process record
# (kosmoss writes one for every rank of a run, under the run's folder), and `SIGKILL` the
# agent.

# %%
from kosmoss.core.paths import runs_root
from kosmoss.launch.records import read_processes


def recorded_pids():
    """The pids of every process kosmoss has a record of, in any run folder."""
    return {record["pid"] for run in runs_root().glob("*") for record in read_processes(run)}


log = open(scratch / "torchrun.log", "w")
agent = subprocess.Popen(
    [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
     str(script("trainup_gpu.py")), "--dataset", "tiny", "--batch-size", "64",
     "--max-epochs", "100000", "--max-steps", "10000", "--no-progress"],
    stdout=log, stderr=subprocess.STDOUT)
deadline, workers = time.monotonic() + 240, []
while not workers:
    if agent.poll() is not None or time.monotonic() > deadline:
        tail = (scratch / "torchrun.log").read_text()[-3000:]
        raise RuntimeError(f"torchrun did not start: {tail}")
    time.sleep(0.5)
    children = {c.pid for c in psutil.Process(agent.pid).children(recursive=True)}
    workers = sorted(children & recorded_pids())
time.sleep(3)  # a few steps: the worker is training, not starting
memory_before = psutil.virtual_memory().available
agent.kill()  # SIGKILL, as before
agent.wait()
time.sleep(2)
alive = [pid for pid in workers if running(pid)]
port = int(psutil.Process(alive[0]).environ()["MASTER_PORT"]) if alive else port
print(f"torchrun's agent (pid {agent.pid}) killed; its workers still alive: {alive}, holding "
      f"{tree_rss(alive):.0f} MB; their MASTER_PORT {port} free: {port_is_free(port)}")
assert alive == workers, "torchrun's workers outlive their agent"

# %% [markdown]
# ## Find it: `kosmoss ghosts`
#
# Without options, `kosmoss ghosts` is a dry run: it lists what is a ghost and why, and
# who holds GPU memory. `--port` narrows the list to who listens on a port.

# %%
sh([sys.executable, "-m", "kosmoss", "ghosts"])
sh([sys.executable, "-m", "kosmoss", "ghosts", "--port", str(port)]);

# %% [markdown]
# For scripts, `--json` gives one object per process; in Python,
# `kosmoss.ghosts.find_ghosts()` returns the same as objects.

# %%
listed = json.loads(subprocess.run([sys.executable, "-m", "kosmoss", "ghosts", "--json"],
                                   capture_output=True, text=True, check=True).stdout)
for ghost in listed:
    print(f"pid {ghost['pid']}: run {ghost['run_id']}, kind {ghost['kind']}, "
          f"killable {ghost['killable']}\n    {ghost['reason']}")
# This course's runs (runs of another KOSMOSS_HOME say which home they belong to).
ghost_pids = sorted(g["pid"] for g in listed if g["kind"] in KOSMOSS_GHOSTS and not g["home"])
print(f"\nthe ghosts are the workers the agent left: {ghost_pids == sorted(alive)}")
assert ghost_pids == sorted(alive), f"ghosts {ghost_pids}, workers left {alive}"

# %% [markdown]
# ## End it: `kosmoss ghosts --kill`
#
# `--kill` ends the ghosts of your own kosmoss runs, each with its process tree: `SIGTERM`
# first — a kosmoss rank then stops at the end of its step and saves a checkpoint, so
# `--resume` could continue it — then, after `--grace` seconds, `SIGKILL` for what is
# left. It never touches another user's process, nor a process without kosmoss's marks
# unless you name it with `--pid`.

# %%
sh([sys.executable, "-m", "kosmoss", "ghosts", "--kill", "--grace", "5"])
time.sleep(1)
memory_after = psutil.virtual_memory().available
print(f"workers alive: {[pid for pid in workers if running(pid)]}")
print(f"port {port} free again: {port_is_free(port)}")
print(f"available memory: {memory_before / 1e6:,.0f} MB with the ghosts, "
      f"{memory_after / 1e6:,.0f} MB after (other programs move this number too)")
left = [g.pid for g in find_ghosts() if g.kind in KOSMOSS_GHOSTS and not g.home]
print(f"ghosts left: {left}")
assert not any(running(pid) for pid in workers), "--kill left a worker running"
assert port_is_free(port), f"port {port} still held after --kill"
assert not left, "a ghost of this course's runs is left"

# %% [markdown]
# ## The in-process case: a kernel that keeps GPU memory
#
# A notebook that trained on a GPU keeps its tensors while anything refers to them —
# a `model` or `trainer` variable, IPython's output history — and PyTorch's caching
# allocator keeps freed blocks reserved for reuse, so nvitop shows the memory as used
# either way. There is no ghost process to end: the kernel itself holds it.
# `kosmoss.release_memory()` runs the garbage collector, hands PyTorch's cached blocks
# back to the driver, and says how much is still allocated (then `del` what refers to
# it). What it cannot free is the **CUDA context** itself — the memory every process
# that initialised CUDA keeps on each GPU it touched, outside PyTorch's cache (the
# recorded GPU run below shows what a ghost worker held) —
# nor what other libraries allocated: nvitop still shows the kernel on the GPU after
# `release_memory()`. Only ending the process (restarting the kernel) frees those.

# %%
import torch

if torch.cuda.is_available():
    big = torch.empty(256 * 2**20, dtype=torch.float32, device="cuda")  # 1 GiB
    del big  # unreferenced, but still reserved by PyTorch's cache
    print(f"reserved after del: {torch.cuda.memory_reserved() / 2**20:.0f} MiB")
freed = kosmoss.release_memory()
print(freed)
if freed["cuda"]:
    print(f"handed back {freed['cuda_freed'] / 2**20:.0f} MiB of PyTorch's cache; "
          f"{freed['cuda_still_allocated'] / 2**20:.0f} MiB still allocated (referenced)")
else:
    print("no CUDA in this kernel, so no GPU memory to hand back "
          "(GPU only; no recorded result yet)")

# %% [markdown]
# ## nvitop: who holds the GPU
#
# `nvitop` is a live monitor of the GPUs and their processes (like `nvidia-smi`, with
# each process's user, command line and memory); `nvitop --once` prints one snapshot.
# kosmoss uses its Python API (`nvitop.Device`) for `kosmoss env` and for the GPU side of
# `kosmoss ghosts`.

# %%
from kosmoss.devices.environment import gpus

if gpus():
    sh(["nvitop", "--once"])
    from nvitop import Device

    for device in Device.all():
        for pid, process in device.processes().items():
            print(f"GPU {device.index}: pid {pid} {process.username()} "
                  f"{process.gpu_memory_human()} {' '.join(process.command().split()[:3])}")
else:
    print("no NVIDIA GPU (NVML finds none): `nvitop --once` would print each GPU's use and "
          "the processes holding its memory; `kosmoss ghosts` would list those as gpu-memory.")

# %% [markdown]
# ## With a GPU
#
# The same steps, and more to see: the ghost worker holds GPU memory (its CUDA context and
# PyTorch's cache), listed by `kosmoss ghosts` with the bytes; `--kill` reports the GPU
# memory freed; nvitop shows the process disappear; `release_memory()` hands back the
# block the cell above allocated. Without a GPU here, the cell below shows the same experiment as
# kosmoss's GPU check recorded it on one (its device and date are printed).

# %%
record = None if gpus() else recorded_gpu("ghost")
if record:
    ghost = record["figures"]["listed"]
    print(f"recorded on an {record['device']}, {record['date']}: torchrun's agent SIGKILLed; "
          f"its worker (pid {ghost['pid']}) listed as {ghost['kind']}, holding "
          f"{ghost['gpu_memory_bytes'] / 2**20:,.0f} MiB on GPU {ghost['gpus']}")
    for cause in ghost["causes"]:
        print(f"  - {cause}")
    figures = record["figures"]
    print(f"kosmoss ghosts --kill: {figures['kill_summary']}; GPU memory in use (nvitop): "
          f"{figures['gpu_used_mib_before']:,.0f} MiB before, "
          f"{figures['gpu_used_mib_after']:,.0f} MiB after")
elif gpus():
    print("a GPU is here: the cells above ran on it")

# %% [markdown]
#
# ## Exercises
#
# 1. Start `trainup_cpu.py --num-processes 2` (Lightning starts rank 1 from rank 0) and
#    kill rank 0 with `SIGKILL`. What happens to rank 1, and what does `kosmoss ghosts`
#    say? What would happen under torchrun with `--nproc_per_node 2`?
# 2. Start a process that listens on a port (for example
#    `python -m http.server 8765`) and run `kosmoss ghosts --port 8765` then
#    `kosmoss ghosts --kill --port 8765`. Why is it not ended? How do you end it?
# 3. Why does `kosmoss ghosts --kill` send `SIGTERM` first instead of `SIGKILL` straight away?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. rank 1 ends at once: it armed PR_SET_PDEATHSIG against rank 0 when it started
# #    (kosmoss.launch.die_with_spawner), so the kernel sends it SIGKILL; kosmoss ghosts
# #    lists nothing. Under torchrun the agent is the parent of both workers and watches
# #    them: when worker 0 fails it stops the others itself (and starts them again if
# #    --max-restarts allows). Ghosts come when the agent itself dies, as above.
# # 2. It is not a kosmoss process (no marks), so it is listed as a port holder and not
# #    killable; name it: kosmoss ghosts --kill --port 8765 --pid <its pid>.
# server = subprocess.Popen([sys.executable, "-m", "http.server", "8765"])
# time.sleep(2)
# sh([sys.executable, "-m", "kosmoss", "ghosts", "--kill", "--port", "8765", "--pid", str(server.pid)])
# # 3. A kosmoss rank that gets SIGTERM stops at the end of its step and writes
# #    checkpoints/preempted.ckpt: the work is kept and --resume continues it.
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 06` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Find which process holds a port.**
#
# A ghost rank keeps `MASTER_PORT`: the next run fails with EADDRINUSE ("address already in use").
# Write `port_holder(port)`: the pid (an integer) of the process *listening* on TCP port
# `port` on this machine, or `None` when nobody listens there. Use `psutil` (its
# `net_connections` lists every socket with its local address, status and pid). The
# checker starts a process that listens on a free port and asks your function; then that
# process ends while another one holds the same port number for UDP (which is no TCP
# listener), and it asks again; then nobody holds it. A connection's local end, in any state
# (ESTABLISHED, CLOSE_WAIT, ...), is no listener.

# %%
# exercise: 06.port_holder
import psutil


def port_holder(port):
    """The pid listening on TCP `port`, or None."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("06.port_holder", globals())
