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
# # Lesson 10 — When it hangs or crashes
#
# **What you will learn**
#
# - what each common failure of a data-parallel run looks like from the outside, by making
#   it happen for real on two CPU ranks: a slow rank, a rank stuck in its `training_step`,
#   a rank killed with `SIGKILL`, a rank that never joins, collectives called in a
#   different order on different ranks, and EADDRINUSE ("address already in use");
# - which tool answers which question: `kosmoss watch` (which rank is slow?), `kosmoss
#   stacks` (where is each rank now?), the start-up check and the collective timeout (the
#   run names the missing rank itself), `TORCH_DISTRIBUTED_DEBUG=DETAIL` (which collectives
#   disagree?), `kosmoss ghosts` (what is left, and who holds the port?);
# - on a GPU, PyTorch's flight recorder (dumped by its NCCL process group): each rank's
#   last collectives, dumped on demand.
#
# Time: ~45 min; the cells run in ~1 min on 2 CPU cores

# %%
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from kosmoss.launch import free_port, port_is_free
from kosmoss.lessons import quick, script, sh, scratch_folder

scratch = scratch_folder("lesson10-")
FAULTY = [sys.executable, "-m", "kosmoss.exercises.faulty_run"]


def kosmoss(*args, check=True):
    return sh([sys.executable, "-m", "kosmoss", *map(str, args)], check=check)


def wait_for(condition, limit_s, what):
    """Poll until condition() is true; fail the cell, saying what, after limit_s."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {limit_s} s")
        time.sleep(0.2)


def heartbeats(run_dir):
    return {int(f.stem.split("-")[1]): json.loads(f.read_text())
            for f in (run_dir / "heartbeats").glob("rank-*.json")}


# %% [markdown]
# ## The patient
#
# Every fault below is made on purpose by `kosmoss.exercises.faulty_run`: a Lightning DDP
# run of two CPU ranks over gloo, with kosmoss's `Heartbeat` callback (each rank writes
# its step, its own work per step and its wait, once a second) and `StartupCheck`, and
# recorded the way kosmoss records its runs, so that the tools find it. Its
# `training_step` and its data set-up hold the faults:

# %%
import inspect

from kosmoss.exercises import faulty_run

source = inspect.getsource(faulty_run.patient)
print(source[source.index("        def training_step"):source.index("        def configure")])
print(source[source.index("    class Data"):source.index("            x = torch.randn")])

# %% [markdown]
# ## A slow rank: `kosmoss watch`
#
# Here rank 1 sleeps a little in every step — a straggler, as a rank on a slower or busier
# device would be. Under DDP the other rank cannot go faster: it waits in the all-reduce
# of every step, so both make the same number of steps per second, and the step rate
# alone cannot say who is slow. `kosmoss watch` reads the heartbeats and compares each
# rank's **own work** per step (`busy`) with the others'. (The cell also starts a second
# patient, for the start-up check further down; it mostly waits.)

# %%
def start(name, *flags):
    """Start a patient in the background; its output goes to a log file."""
    log = scratch / f"{name}.log"
    return subprocess.Popen(FAULTY + ["patient", scratch / name, *map(str, flags)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT), log


# The run of the section on start-up checks, started now: it waits mostly.
startup_s = 3 if quick() else 10
absent, absent_log = start("absent", "--absent-rank", 1, "--startup-timeout", startup_s)

patient_dir, sleep_flag = scratch / "patient", scratch / "sleep-now"
patient_timeout_s = 300  # the run's own collective timeout (faulty_run's --collective-timeout)
patient, patient_log = start("patient", "--slow-rank", 1, "--slow-ms", 40,
                             "--sleep-when", sleep_flag,
                             "--collective-timeout", patient_timeout_s)
wait_for(lambda: len(heartbeats(patient_dir)) == 2 if (patient_dir / "heartbeats").exists()
         else False, 120, "both ranks' first heartbeat")
wait_for(lambda: all((b["busy_ms"] is not None and b["step"] >= 40)
                     for b in heartbeats(patient_dir).values()), 60, "40 steps on both ranks")
kosmoss("watch", "--once", patient_dir)

# %%
from kosmoss.diagnose.watch import Sampler, snapshot

seen = snapshot(patient_dir, Sampler())
for view in seen.ranks:
    print(f"rank {view.rank}: {view.steps_per_s:.1f} steps/s, own work {view.busy_ms:.1f} ms, "
          f"waits {view.wait_ms:.1f} ms per step")
print(f"stragglers flagged: {seen.stragglers}")
assert seen.stragglers == [1]

# %% [markdown]
# Same steps per second; rank 0's time goes into *waiting*, rank 1's into its own work.
# The rank that waits longest is the fast one.
#
# ## A rank stuck in `training_step`: `kosmoss stacks`
#
# Now rank 1 stops for good inside its `training_step` — a deadlock in your code, a read
# from a file system that never answers, an `input()` left in. Nothing crashes and nothing
# is printed: rank 0 waits in the all-reduce until the run's collective timeout, which
# the cell prints beside PyTorch's default. `kosmoss stacks` reads the Python stack of
# every process of the run with py-spy, groups identical stacks, and names the odd one out.

# %%
from torch.distributed.constants import default_pg_timeout

print(f"this run's collective timeout: {patient_timeout_s} s (PyTorch's default for gloo: "
      f"{default_pg_timeout})")
sleep_flag.touch()
wait_for((patient_dir / "sleeping-rank-1").exists, 60, "rank 1 asleep in training_step")
kosmoss("stacks", patient_dir, "--out", scratch / "stacks.txt")
summary, _, threads = (scratch / "stacks.txt").read_text().partition("\n== ")
print(summary)
print(f"(then every thread of every process: {threads.count(chr(10))} more lines in "
      f"{scratch / 'stacks.txt'})")

# %%
from kosmoss.diagnose.runs import live_run_at
from kosmoss.diagnose.stacks import collect

groups = collect(live_run_at(patient_dir)).groups
for group in groups:
    print(f"{', '.join(m.process.label for m in group.members)}: in a collective "
          f"{group.waits}, odd one out {group.odd}")
odd = [group for group in groups if group.odd]
assert len(odd) == 1 and [m.process.rank for m in odd[0].members] == [1]
assert "training_step" in odd[0].summary

# %% [markdown]
# The stacks say what no log says: rank 0 is inside DDP's all-reduce (called from
# backward), rank 1 is in its own code, at the line that sleeps. `kosmoss stacks --native`
# adds the C++ frames (the wait itself, in `c10d::Reducer`). On a run of many nodes, run
# it on each node (or through `srun`).
#
# ## A rank killed: `SIGKILL`
#
# A rank can die without a word: the kernel's out-of-memory killer, a node that reboots,
# `kill -9`. What do the others do, and how fast does the job end? Here rank 1 gets `SIGKILL`
# while rank 0 waits for it in the all-reduce.

# %%
rank1_pid = heartbeats(patient_dir)[1]["pid"]
killed_at = time.monotonic()
os.kill(rank1_pid, signal.SIGKILL)
patient.wait(timeout=120)
ended_s = time.monotonic() - killed_at
said = [line for line in patient_log.read_text().splitlines() if line.startswith("rank 0")]
print(f"rank 0 (the launcher, pid {patient.pid}) ended {ended_s:.1f} s after rank 1's SIGKILL, "
      f"exit code {patient.returncode}")
print("\n".join(said) or "rank 0 printed nothing: it was killed before it could")
if patient.returncode == -signal.SIGKILL:
    print("rank 0 was killed: Lightning's launcher watches its child ranks (every few "
          "seconds) and, when one fails, kills them all and itself, so that none is left behind")
else:
    print("rank 0 left with an error: gloo saw its peer's connection close while it waited "
          "in the all-reduce")

# %%
from kosmoss.ghosts import find_ghosts

left = [g for g in find_ghosts() if g.run_id == patient_dir.name]
print(f"ghosts of this run: {[(g.pid, g.kind) for g in left]}")
assert ended_s < 60 and not left

# %% [markdown]
# Here the job ended by itself, and nothing was left for `kosmoss ghosts`. That holds when
# the rank that dies is one Lightning started: its launcher, rank 0, watches them. When
# the launcher itself dies (lesson 6), nobody watches the others: a rank waiting in a
# collective fails when gloo's connection closes, but a rank busy in its own code — as
# rank 1 was here — lives on, holding memory, cores and, on a GPU, its CUDA memory; that
# is what `kosmoss ghosts` is for.
#
# ## A rank that never joins: the start-up check
#
# A rank stuck before training — its data on a slow file system, an import that hangs, a
# node that never started — keeps the others waiting in their first collective, and when
# the timeout comes the error says "timed out", never *who*. kosmoss runs meet once before
# training at `torch.distributed.monitored_barrier` (`StartupCheck`): rank 0 names the
# ranks that did not arrive, writes the stacks of the run into its folder, and the run
# exits. The second patient, started at the top of this lesson, has a rank 1 that never
# leaves its data set-up; its start-up check waits a few seconds:

# %%
absent.wait(timeout=300)
said = absent_log.read_text()
print("\n".join(line for line in said.splitlines() if line.startswith(("rank 0", "[rank0]"))))
named = re.search(r"rank (\d+) did not reach the start-up check", said)
stacks_file = Path(re.search(r"stacks of the run in (\S+)", said).group(1))
named_after_s = stacks_file.stat().st_mtime - (scratch / "absent" / "absent-rank-1").stat().st_mtime
print(f"\nexit code {absent.returncode}; rank {named.group(1) if named else None} named "
      f"{named_after_s:.1f} s after it got stuck (start-up check {startup_s} s); the stacks:")
print(stacks_file.read_text().split("\n\n==")[0])
assert absent.returncode == 1 and named and named.group(1) == "1"
assert named_after_s < startup_s + 60

# %% [markdown]
# In a kosmoss run the same two guards are flags: `--collective-timeout SECONDS` (the
# timeout every collective gets; its defaults on CPU and GPU are in docs/cli.md and
# `python trainup_cpu.py --help`) and the start-up check
# before training; on a timeout the rank that catches it writes the stacks of every live
# process into the run's folder (docs/debugging.md).
#
# ## Collectives that do not match: `TORCH_DISTRIBUTED_DEBUG=DETAIL`
#
# Every collective matches the call at the same position on the other ranks, whatever it
# is. A code path that depends on the rank — a metric logged on rank 0 only, a loop over a
# set, an early `return` — makes the ranks call different collectives. Here rank 0 calls
# `all_reduce` then `broadcast`, rank 1 the other way round, with a short timeout:

# %%
def mismatched_pair(debug):
    port = str(free_port())
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": debug}
    return [subprocess.Popen(FAULTY + ["mismatch", str(rank), port, "--timeout", "3"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)]


pairs = {debug: mismatched_pair(debug) for debug in ("OFF", "DETAIL")}  # both at once
said = {debug: [rank.communicate(timeout=120)[0] for rank in ranks]
        for debug, ranks in pairs.items()}
for debug, outputs in said.items():
    print(f"TORCH_DISTRIBUTED_DEBUG={debug}:")
    for output in outputs:
        line = next(l for l in output.splitlines() if l.startswith("rank "))
        ops = re.findall(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                         r"SequenceNumber=\d+, OpType=(\w+)", line)
        print("   " + (line.split(": Detected")[0] + ": mismatch detected, "
                       + ", ".join(f"rank {r} in {op}" for r, op in ops) if ops else line[:160]))
waited = {debug: [float(re.search(r"rank \d after ([\d.]+) s", out).group(1)) for out in outputs]
          for debug, outputs in said.items()}
# Without the check both ranks wait the whole 3 s: the first to give up says its receive
# timed out, and the other may first see that peer hang up ("Connection closed by peer").
assert min(waited["OFF"]) >= 2.9 and any("Timed out" in out for out in said["OFF"])
assert not any("Detected mismatch" in out for out in said["OFF"])
assert max(waited["DETAIL"]) < min(waited["OFF"])
assert all("Detected mismatch between collectives" in out for out in said["DETAIL"])

# %% [markdown]
# Without the setting, both ranks wait for the whole timeout and say only that a receive
# timed out (or, for the one that gives up second, that its peer closed the connection).
# With `DETAIL`, PyTorch wraps the process group in a checker that first
# compares every rank's next collective (its type, shapes and dtypes) over a gloo side
# channel: the error comes at once and names both calls. The check adds communication of
# its own before every collective, so set it while you hunt, not in production.
#
# ## EADDRINUSE ("address already in use")
#
# A run's rank 0 listens on `MASTER_PORT` for the others (PyTorch's TCPStore). If any
# process holds that port — often the ghost of an earlier run — the new run cannot start.
# A process listening on a port stands in for the ghost:

# %%
from datetime import timedelta

import torch.distributed as dist

port = free_port()
holder = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                           f"s.bind(('127.0.0.1', {port})); s.listen(); print('listening'); "
                           "sys.stdout.flush(); time.sleep(600)"],
                          stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "listening"
try:  # what PyTorch says
    dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=5))
except Exception as err:
    print(f"PyTorch: {type(err).__name__}: {str(err).splitlines()[0]}")
else:
    raise AssertionError(f"PyTorch's store started on port {port}, which another process holds")
taken = sh([sys.executable, script("trainup_cpu.py"), "--num-processes", "2", "--dataset", "tiny"],
           env={**os.environ, "MASTER_PORT": str(port)}, check=False)
kosmoss("ghosts", "--port", port)
assert taken.returncode == 2 and f"held by pid {holder.pid}" in taken.stdout
assert [g.pid for g in find_ghosts(port=port)] == [holder.pid]
holder.kill()
holder.wait()
print(f"holder ended; port {port} free again: {port_is_free(port)}")

# %% [markdown]
# kosmoss checks a `MASTER_PORT` you set before it starts any rank, and says who holds
# it; without `MASTER_PORT` it picks a free port itself. `kosmoss ghosts --port N` names
# the holder, and `kosmoss ghosts --kill --pid PID` ends it if it is yours.
#
# | symptom | question | tool |
# |---|---|---|
# | the run crawls | which rank is slow? | `kosmoss watch` |
# | the run stops moving | where is each rank? | `kosmoss stacks` (`--native`) |
# | it stops before the first step | who never arrived? | the start-up check |
# | a "timed out" error | which collectives disagree? | `TORCH_DISTRIBUTED_DEBUG=DETAIL` |
# | a rank died | what is left? | `kosmoss ghosts` |
# | the run cannot start | who holds the port? | `kosmoss ghosts --port` |
#
# ## With a GPU
#
# NCCL runs collectives asynchronously on the GPU, so a Python stack shows where a rank
# *queued* its last collective, not where the GPU is. PyTorch's **flight recorder** keeps
# each rank's last collectives (type, sizes, state) in a ring buffer. Gloo's records too
# (they stay `scheduled`); NCCL's process group, `ProcessGroupNCCL`, follows each one to
# `started` and `completed` and its watchdog dumps the buffer on a timeout or on demand;
# `torch.distributed.flight_recorder` reads the dumps. kosmoss sets
# it up on GPU runs
# (`kosmoss.diagnose.hang.flight_recorder_env`: the dumps go into the run's folder, and a
# named pipe per rank dumps at once). The cell below makes one rank run three all-reduces
# on NCCL, dumps its recorder through the pipe, and lists the entries; read real dumps
# with `python -m torch.distributed.flight_recorder.fr_trace DIR -p rank-`. It runs only
# on a machine with a GPU, and this course has no recorded result of it yet.

# %%
import pickle
import textwrap

import torch

from kosmoss.diagnose.hang import flight_recorder_env

if torch.cuda.is_available():
    recorder_dir = scratch / "nccl"
    one_rank = textwrap.dedent("""
        import datetime, sys, time, torch, torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))
        x = torch.ones(4, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        print("reduced", flush=True)
        time.sleep(120)
    """)
    rank = subprocess.Popen([sys.executable, "-c", one_rank, str(free_port())],
                            env={**os.environ, **flight_recorder_env(recorder_dir)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "reduced"
        pipe = recorder_dir / "flight-recorder" / "dump-now-0.pipe"
        wait_for(pipe.exists, 30, "the recorder's pipe")
        pipe.write_text("1")  # what you do to a hanging run: echo 1 > that pipe
        dump = recorder_dir / "flight-recorder" / "rank-0"
        wait_for(lambda: dump.exists() and dump.stat().st_size > 0, 60, "the dump")
        for entry in pickle.loads(dump.read_bytes())["entries"]:
            print(entry["profiling_name"], entry["state"])
    finally:
        rank.kill()
        rank.wait()
else:
    print(f"no GPU here: NCCL's process group dumps the flight recorder; on a GPU run "
          f"kosmoss sets "
          f"{sorted(flight_recorder_env(scratch / 'example'))}")

# %% [markdown]
# ## Exercises
#
# 1. Start the patient with `--slow-ms 1`. Does `kosmoss watch` flag rank 1, and why?
# 2. Run the mismatched pair with both ranks calling `all_reduce` on tensors of different
#    lengths, without `DETAIL`. What does gloo do this time?
# 3. Kill rank 0 (the launcher) of the patient instead of rank 1, while rank 1 sleeps. What
#    does `kosmoss ghosts` show, and how do you end what is left?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. No: the gap per step is about 1 ms, under the 2 ms floor below which kosmoss watch
# #    calls a difference timer noise (--threshold sets the relative part).
# # 2. Rank 0 receives more bytes than its buffer holds; gloo aborts it ("Received data
# #    size doesn't match expected size. Is there a distributed collective mismatch in
# #    your code?"), and rank 1 then fails with "Connection reset by peer". With DETAIL the
# #    shapes are named before anything is sent.
# # 3. Rank 1 lives on asleep, its launcher gone: kosmoss ghosts lists it as launcher-gone
# #    (an orphaned rank); `kosmoss ghosts --kill` ends it.
# os.kill(patient.pid, signal.SIGKILL)
# kosmoss("ghosts")
# kosmoss("ghosts", "--kill", "--grace", "2")
# ```
#
# </details>

# %% [markdown]
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 10` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **All-reduce a dict of statistics whose keys the ranks hold in different orders.**
#
# Write `sum_stats(stats)`. On every rank, `stats` is a dict from a name to a float
# (`"loss_sum"`, `"samples"`, ...): the same names on every rank, but not inserted in the
# same order (each rank built its dict as its batches came). Return a new dict with the
# same names, each value a Python float summed over all ranks, the same on every rank
# (`stats` left as it was). Use `torch.distributed.all_reduce`. Every collective matches
# the call with the same position on the other ranks, whatever tensor it was given: the
# ranks must call them in an order they all agree on. The checker runs your cell at 2, 3
# and 4 gloo processes, each rank's dict in another order; the values are multiples of
# `1/8`, so every sum is exact in float32 and float64, and the checker compares exactly.

# %%
# exercise: 10.sum_stats
import torch
import torch.distributed as dist


def sum_stats(stats):
    """{name: value summed over all ranks}, the same on every rank."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("10.sum_stats", globals())

# %% [markdown]
# **Name the straggler from the ranks' heartbeats.**
#
# Write `stragglers(busy_ms, wait_ms)`: two lists, one number per rank, of what each rank's
# heartbeat says about its last steps — `busy_ms`, its own work per step (loading,
# forward, optimizer), and `wait_ms`, the time it spent in backward, where DDP's all-reduce
# waits for the slowest rank. Return the sorted list of the ranks that hold the others
# back, by `kosmoss watch`'s rule: a rank is a straggler when its own work per step is
# larger than the median of the *other* ranks' by more than `30` percent *and* by at least
# `2` ms (smaller gaps are timer noise); a rank alone, with no others, is none. Under DDP
# every rank makes the same number of steps per second, so step rates cannot tell. The
# checker compares with `kosmoss watch`'s own code on several sets of ranks, two
# stragglers, both thresholds met exactly and a world of one among them.

# %%
# exercise: 10.stragglers
def stragglers(busy_ms, wait_ms):
    """Sorted ranks whose own work per step holds the others back."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("10.stragglers", globals())
