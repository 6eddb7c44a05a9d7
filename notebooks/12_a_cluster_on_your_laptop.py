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
# # Lesson 12 — A cluster on your laptop: hosts, links, and what fails between them
#
# **What you will learn**
#
# - how Linux gives each simulated node a network of its own (a *network namespace* with
#   its own interface and address, joined to the others by a bridge) and how `tc` sets
#   the rate of every link;
# - how fast such a link really is, measured with `kosmoss comm`, against the rate set;
# - the same DDP run at three link rates, measured against what the α–β model predicts;
# - the most common multi-node mistake — the wrong network interface — and its fix;
# - what elastic `torchrun` does when a host is lost, and what it cannot keep.
#
# Everything here needs root (namespaces are made with `ip netns`). Without it, the
# lesson shows a recorded result and says so.
#
# Time: ~30 min; the cells run in ~2 min on 2 CPU cores

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

from kosmoss.launch import hosts
from kosmoss.lessons import quick, scratch_folder, script, sh
from kosmoss.scaling import allreduce

scratch = scratch_folder("lesson12-")
home = scratch / "home"
env = {**os.environ, "KOSMOSS_HOME": str(home)}
missing = hosts.support_missing()
live = missing is None
print("hosts can be made here" if live else f"no hosts here: {missing}")

# %% [markdown]
# ## Hosts: a namespace, an interface, an address, a link
#
# `kosmoss hosts up` makes a set of hosts for your own commands; a run with
# `--hosts netns` makes its own and removes them at the end. Each host is a network
# namespace `kosmoss-<set>-h<i>` with one interface, `kosmoss0`, and one address on a
# private `/24` that no route of this machine uses; a bridge in a namespace of its own
# joins them. Nothing is made in the machine's own namespace: no traffic leaves.

# %%
RATES = ("none", "1gbit", "100mbit")
if live:
    made = hosts.make_hosts(2, hosts.parse_rate("100mbit", "--link-rate"), purpose="lesson 12",
                            owner=None)
    try:
        print(made.describe())
        for host in made.hosts:
            addresses = hosts.interface_addresses(host.namespace)
            qdisc = subprocess.run(["tc", "-n", host.namespace, "qdisc", "show", "dev",
                                    hosts.INTERFACE], capture_output=True, text=True).stdout
            print(f"host {host.index}: {addresses}; {qdisc.strip()}")
        assert hosts.interface_addresses(made.hosts[1].namespace)["kosmoss0"] == \
            [made.hosts[1].address]
    finally:
        hosts.remove_hosts(made)
    print("removed:", not any(n.startswith(f"kosmoss-{made.set_id}")
                              for n in hosts.existing_namespaces()))

# %% [markdown]
# ## How fast is a link? `kosmoss comm` across two hosts
#
# A ring all-reduce of two ranks sends each rank's share of the buffer each way, twice: the *bus
# bandwidth* (lesson 9) of a ring on a shaped link should come out at the rate set, less
# the TCP and Ethernet headers. On a small busy machine the fast link's fit can come out
# lower: the ranks' own copies and sums, and the kernel's work for each packet, then take a
# share of each byte's time (the cell allows for it, and prints the share it measured).
# Each size runs several times and the fit takes each size's fastest: other programs on
# the machine can only add time to a transfer, never take it away.

# %%
# Quick: two sizes a rate, each taking tens of milliseconds on its link, so that a
# millisecond of a busy machine's jitter moves the fitted slope by a few percent only.
SIZES = {"1gbit": ["2M", "8M"], "100mbit": ["512K", "2M"]} if quick() else \
    {rate: ["512K", "1M", "2M", "4M", "8M"] for rate in ("1gbit", "100mbit")}
measured_links = {}
if live:
    for rate, sizes in SIZES.items():
        out = scratch / f"comm-{rate}"
        sh([sys.executable, "-m", "kosmoss", "comm", "--ranks", "2", "--nodes", "2", "--hosts",
            "netns", "--link-rate", rate, "--sizes", *sizes, "--repeats", "5", "--out", out],
           env=env)
        rows = json.loads((out / "comm.json").read_text())["groups"]["world"]["rows"]
        # Other work on the machine only ever adds time: the fastest of five repeats of a
        # size is the closest to the link alone (the median of three still moved the fit by
        # a third in a CI run on 2 cores, 2026-11-28).
        fastest = allreduce.fit_alpha_beta([row["bytes"] for row in rows],
                                           [row["min_time_s"] for row in rows], ranks=2)
        measured_links[rate] = allreduce.link_from_fit(fastest)["bandwidth_Bps"]
    # The slow link bounds its transfers; at 1gbit the host's per-byte work (the copies
    # through the veth pair, gloo's) counts too: 81 % of the rate in a CI run on 2 cores of
    # 2026-11-28, 67 % on 2026-12-03 with the machine slower. Above the rate the shaping
    # would be missing; bits taken for bytes would show an eighth of it.
    lowest = {"1gbit": 0.4, "100mbit": 0.85}
    for rate, bandwidth in measured_links.items():
        set_rate = hosts.parse_rate(rate, "--link-rate") / 8
        share = bandwidth / set_rate
        print(f"{rate}: fitted {bandwidth / 1e6:.1f} MB/s, set {set_rate / 1e6:.1f} MB/s "
              f"({share:.0%} of it)" + ("" if share > 0.85 else
                                        ": this host's per-byte work bounds it too"))
        assert lowest[rate] < share < 1.15, f"{rate}: {share:.0%}"

# %% [markdown]
# ## The same DDP run at three link rates
#
# Two hosts, one rank each, the same seed. On a CPU the all-reduce is not hidden behind
# backward (every core computes), so the α–β model says: step = step without a link +
# `2(n-1)/n × gradient bytes ÷ bytes per second`. The unshaped run gives the first term.

# %%
STEPS = "30" if quick() else "120"
runs = {}
if live:
    for rate in RATES:
        out = scratch / f"run-{rate}.json"
        sh([sys.executable, script("trainup_cpu.py"), "--num-nodes", "2", "--hosts", "netns",
            "--link-rate", rate, "--dataset", "tiny", "--max-steps", STEPS, "--max-epochs",
            "1000", "--no-progress", "--result-json", out], env=env)
        runs[rate] = json.loads(out.read_text())
    same = {r["replica_checksums"][0] for r in runs.values()}
    print(f"the three runs end on {len(same)} set(s) of weights: the link changes the time, "
          "not the numbers")
    assert len(same) == 1

# %%
import matplotlib.pyplot as plt  # noqa: E402

if live:
    batch = runs["none"]["global_batch_size"]
    base_step = batch / runs["none"]["train_samples_per_s"]
    gradient_bytes = 4 * runs["none"]["params"]  # float32 gradients, one per parameter
    predicted, measured = {}, {}
    for rate in RATES:
        bps = hosts.parse_rate(rate, "--link-rate")
        comm = 0.0 if bps is None else 2 * (2 - 1) / 2 * gradient_bytes / (bps / 8)
        predicted[rate] = batch / (base_step + comm)
        measured[rate] = runs[rate]["train_samples_per_s"]
        print(f"{rate:>8}: measured {measured[rate]:8,.0f} samples/s, predicted "
              f"{predicted[rate]:8,.0f} ({measured[rate] / predicted[rate]:.2f} of it)")
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(RATES, [measured[r] for r in RATES], "o-", label="measured")
    axes.plot(RATES, [predicted[r] for r in RATES], "s--", label="predicted (α–β)")
    axes.set(ylabel="samples/s", xlabel="link rate", title="2 hosts x 1 rank, DDP on CPU")
    axes.legend()
    plt.show()
    assert 0.7 < measured["100mbit"] / predicted["100mbit"] < 1.3

# %% [markdown]
# At the slowest rate the all-reduce of the gradients takes most of the step; unshaped, the
# two hosts share this machine's cores and the link costs little. `kosmoss project --comm`
# with the comm measurement above predicts where adding hosts stops paying (the bench's
# `hosts-cpu-2x1-*` rows put its prediction beside the measured run).

# %% [markdown]
# ## The wrong interface
#
# On a real cluster every node has several interfaces (loopback, management Ethernet, the
# fast network). gloo and NCCL take the one `GLOO_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME`
# names; naming the loopback makes every rank listen where no other host can reach it.

# %%
if live:
    wrong = subprocess.run([sys.executable, script("trainup_cpu.py"), "--num-nodes", "2",
                            "--hosts", "netns", "--dataset", "tiny", "--max-steps", "2"],
                           env={**env, "GLOO_SOCKET_IFNAME": "lo"}, capture_output=True,
                           text=True)
    print(f"exit code {wrong.returncode}:\n{wrong.stderr.strip()}")
    assert wrong.returncode == 2 and "set GLOO_SOCKET_IFNAME=kosmoss0" in wrong.stderr
    print("the fix: unset it (kosmoss sets it per host), as the runs above did")

# %% [markdown]
# ## A host lost, under elastic torchrun, and back
#
# Two hosts run `torchrun --nnodes 1:2 --max-restarts 2` with the c10d rendezvous on the
# first host. Once the run has saved a checkpoint, every process of the second host is
# killed. The survivor's worker fails in its next all-reduce; its agent restarts it alone,
# and kosmoss continues from the run's newest checkpoint — the global batch is kept, the
# steps since the checkpoint are trained again. Then the second host's agent is started
# again with the same `--rdzv-id`: the survivor's agent sees it waiting, stops its worker,
# and both agents start workers together. A membership change does not use up one of
# `--max-restarts`.
#
# Two details make the return work (docs/hosts.md quotes torch's source): every agent runs
# with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` — with torch's default, an agent that joins a
# later round waits, until the store's timeout, for a `MASTER_ADDR` the first agent no
# longer publishes — and, because the remaining steps take seconds here, the survivor's
# worker is paused until the returning host has joined (on a cluster the run outlasts a
# reboot). The scenario takes a few minutes, so a quick run of the course shows the record
# of a run instead.

# %%
from kosmoss.launch.host_faults import AGENT_ENV, lost_host  # noqa: E402

RECORD = Path(script("docs")) / "hosts" / "lost-host.json"
if live and not quick():
    scenario = lost_host(home, script("trainup_cpu.py"), "tiny", 40)
    print("live run")
else:
    scenario = json.loads(RECORD.read_text())
    print(f"recorded on {scenario['date']} on {scenario['machine']} "
          f"({'no hosts here' if not live else 'quick run of the course'})")
print("every agent's environment adds", AGENT_ENV)
events = {k: v - scenario["events"]["start"] for k, v in scenario["events"].items()}
for name, seconds in events.items():
    print(f"{seconds:6.1f} s  {name}")
for phase, size in scenario["world_sizes"].items():
    print(f"world size {phase}: {size}")
result = scenario["result"]
print(f"global step {result['global_step']} of {result['config']['max_steps']}, restarted "
      f"from step {result['trained_from_step']}, agents' exit codes {scenario['codes']}")
assert result["trained_from_step"] and result["trained_from_step"] > 0
assert scenario["world_sizes"]["survivor alone"] == 1
assert result["world_size"] == scenario["world_sizes"]["before"]  # the host is back
assert result["global_step"] == result["config"]["max_steps"]

# %% [markdown]
# With a GPU: the same hosts work for NCCL (`NCCL_SOCKET_IFNAME` is set alongside
# `GLOO_SOCKET_IFNAME`), but every host then shares the one GPU, and NCCL refuses two ranks
# on one GPU: use gloo for ranks that share it (lesson 5).
#
# ## Exercises
#
# 1. Make two hosts with `kosmoss hosts up --link-rate 10mbit` and run the printed
#    `torchrun` commands. How long is a step, and what does the α–β model say?
# 2. Cut the second host's link during a run (`ip -n <host 1> link set kosmoss0 down`). How long
#    until the run ends, and which setting decides it?
#
# <details><summary>Solution</summary>
#
# ```python
# # 1. the all-reduce of the gradients dominates: 2(n-1)/n x bytes / (rate / 8) per step
# # 2. the collective timeout (--collective-timeout, 120 s on CPU by default)
# ```
#
# </details>
#
# ### Exercises checked by code
#
# Write each answer in the cell that starts with `# exercise:` (keep that first line), run it, then run the checker cell under it: it prints `correct` or what differs. From a terminal, `kosmoss check 12` checks every exercise of this lesson in your saved notebook.

# %% [markdown]
# **Predict a DDP step across hosts from the link's rate.**
#
# Write `predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s)`: the
# seconds of one training step of DDP with one rank per host, when the gradients'
# all-reduce is not hidden behind backward (CPU ranks that fill the cores): the compute,
# plus a ring all-reduce of `gradient_bytes` over `hosts` hosts whose links carry
# `rate_bits` bits per second each way, each of the ring's steps paying the hop latency
# `latency_s`. One host has nothing to reduce. The checker compares with the α–β model at
# 1 to 8 hosts, from 10 Mbit/s to 100 Gbit/s, with and without latency.
# %%
# exercise: 12.step_time
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    """Seconds of one DDP step: compute + the ring all-reduce of the gradients."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("12.step_time", globals())

# %% [markdown]
# **Pick the interface that reaches MASTER_ADDR, as GLOO_SOCKET_IFNAME must name it.**
#
# Write `pick_interface(interfaces, master_addr)`: `interfaces` maps each interface's name
# to its addresses as `"address/prefix"` strings (what `ip addr` shows, e.g.
# `{"lo": ["127.0.0.1/8"], "kosmoss0": ["10.213.0.2/24"]}`); return the name of the
# interface whose network holds `master_addr`, the most specific one (longest prefix) when
# several do, as a routing table decides, and the first of them in `interfaces`' order when
# their prefixes tie; `None` when none does. A master on this host (`127.0.0.1`) is reached
# over the loopback. The checker tries hosts with several interfaces, overlapping networks,
# equally specific ones, a master on no network, interfaces without address, IPv6
# addresses beside the IPv4 ones and an IPv6 `master_addr`.
# %%
# exercise: 12.pick_interface
import ipaddress


def pick_interface(interfaces, master_addr):
    """The interface whose network holds master_addr (longest prefix), or None."""
    raise NotImplementedError("your code here")

# %%
from kosmoss.exercises import check; check("12.pick_interface", globals())
