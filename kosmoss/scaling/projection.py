"""Predicted DDP scaling: step time, samples/s and efficiency of N devices per node × M
nodes, from one device's step and the links' latency and bandwidth (α–β).

    kosmoss project --from RUN_DIR --intra nvlink4 --inter ib-ndr --devices 8 --nodes 1 2 4
    kosmoss project --comm comm.json          # links measured by kosmoss comm

The cost model (docs/scaling.md draws it):

- compute of one rank at per-device batch b, with a share s of the resources the
  reference step ran on (cores of a CPU host, or a GPU):
  ``t_compute = fixed + (forward_backward − fixed)·(b / b_ref)·(1/s) + optimizer·(1/s)``;
  on one host the ranks share its cores (s = cores per rank ÷ reference cores), so two
  ranks on two cores each get half: this is why 2 CPU ranks on a 2-core laptop do not
  halve the step;
- all-reduce of S bytes over a ring of n ranks: ``2(n−1)·α + 2(n−1)/n · S/B``;
  hierarchical over N ranks per node × M nodes (reduce-scatter in the node, all-reduce of
  each 1/N shard across nodes by N parallel rings sharing the node's ``nics`` links,
  all-gather in the node):
  ``2(N−1)·α_intra + 2(N−1)/N · S/B_intra + 2(M−1)·α_inter + 2(M−1)/M · S/(nics·B_inter)``;
- DDP's buckets (torch's own assignment, the steady-state one rebuilt after step 1)
  all-reduce as soon as backward has produced their gradients, one after another; the
  part of the last ones still running when backward ends is exposed. With ``overlap``
  off (CPU ranks that fill every core: the gloo thread has no idle core) all of it is;
- step = forward + backward + exposed communication + optimizer; samples/s = global
  batch ÷ step; efficiency = samples/s ÷ (world × one device's samples/s at the same
  global batch), the bench's definition.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..core.errors import UsageError
from ..core.files import read_json_object
from ..run import lightning_private as private

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One hop of a ring: its latency α (seconds per step of the ring) and bandwidth
    (bytes/s per direction)."""

    name: str
    latency_s: float
    bandwidth_Bps: float
    source: str


# Bandwidths: the link's nominal rate per direction, so predicted communication is a lower
# bound (nccl-tests' busbw usually reaches 70-90 % of it). Latencies: NCCL's own tuning
# model (src/graph/tuning.cc, hwLat for Ring/Simple: NVLink 3.4 µs, PCI 5.7 µs, NET 9.6 µs).
PRESETS: Dict[str, Link] = {link.name: link for link in (
    # NVIDIA A100 datasheet: third-generation NVLink, 600 GB/s total (300 GB/s per direction).
    Link("nvlink3", 3.4e-6, 300 * GB, "A100 datasheet: NVLink 600 GB/s bidirectional"),
    # NVIDIA H100 SXM datasheet: fourth-generation NVLink, 900 GB/s total (450 per direction).
    Link("nvlink4", 3.4e-6, 450 * GB, "H100 SXM datasheet: NVLink 900 GB/s bidirectional"),
    # PCI-SIG: PCIe 4.0 x16, 16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s per direction.
    Link("pcie4", 5.7e-6, 31.5 * GB, "PCI-SIG PCIe 4.0 x16: 31.5 GB/s per direction"),
    # PCI-SIG: PCIe 5.0 x16, 32 GT/s: 63 GB/s per direction.
    Link("pcie5", 5.7e-6, 63 * GB, "PCI-SIG PCIe 5.0 x16: 63 GB/s per direction"),
    # InfiniBand HDR (NVIDIA ConnectX-6): 200 Gb/s per port.
    Link("ib-hdr", 9.6e-6, 25 * GB, "InfiniBand HDR, ConnectX-6: 200 Gb/s per port"),
    # InfiniBand NDR (NVIDIA ConnectX-7): 400 Gb/s per port.
    Link("ib-ndr", 9.6e-6, 50 * GB, "InfiniBand NDR, ConnectX-7: 400 Gb/s per port"),
    # IEEE 802.3by 25GBASE; latency: NCCL's NET hop plus ~20 µs of kernel TCP (an estimate).
    Link("25gbe", 30e-6, 3.125 * GB, "IEEE 802.3by 25 Gb/s Ethernet, TCP sockets"),
    # IEEE 802.3ba/bj 100GBASE; the same TCP latency estimate.
    Link("100gbe", 30e-6, 12.5 * GB, "IEEE 802.3ba 100 Gb/s Ethernet, TCP sockets"),
)}


def preset(name: str, flag: str) -> Link:
    if name not in PRESETS:
        raise UsageError(f"{flag} {name}: no such link preset; choose from "
                         f"{', '.join(PRESETS)}, or give --comm FILE (kosmoss comm's JSON)")
    return PRESETS[name]


def ring_allreduce_s(size: float, ranks: int, link: Link) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * link.latency_s + 2 * (ranks - 1) / ranks * size / link.bandwidth_Bps


def hierarchical_allreduce_s(size: float, per_node: int, nodes: int, intra: Link, inter: Link,
                             nics: int = 1) -> float:
    """Reduce-scatter and all-gather inside the node (one ring of ``per_node``), and the
    all-reduce of each 1/N shard across nodes by N rings sharing ``nics`` links per node;
    equal to the plain ring in the node when ``nodes`` is 1."""
    shared_inter = replace(inter, bandwidth_Bps=inter.bandwidth_Bps * nics)
    return ring_allreduce_s(size, per_node, intra) + ring_allreduce_s(size, nodes, shared_inter)


# --- the model's shape -------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What DDP moves and when: the gradient buckets in the order backward fills them,
    each with the fraction of backward done when its last gradient is ready; and the
    share of forward+backward that backward takes (from the layers' FLOPs)."""

    gradient_bytes: int
    buckets: Tuple[Tuple[int, float], ...]  # (bytes, ready at this fraction of backward)
    backward_share: float
    n_x: int = 4128
    n_y: int = 552


def mlp_shape(n_x: int = 4128, hidden: Sequence[int] = (100, 100, 100), n_y: int = 552,
              bucket_bytes: int = 25 * 2**20, first_bucket_bytes: int = 2**20) -> ModelShape:
    """kosmoss's MLP. Backward of a Linear (in, out) costs in·out multiply-adds for the
    weight's gradient, and as many for the input's except in the first layer (the data
    needs none); forward costs in·out. Layer k's gradients are ready when backward has
    gone from the last layer down to k."""
    from ..model import mlp

    linears = [m for m in mlp(n_x, hidden, n_y) if hasattr(m, "weight")]
    forward = [m.in_features * m.out_features for m in linears]
    backward = [f * (1 if k == 0 else 2) for k, f in enumerate(forward)]
    ready_at, done = {}, 0
    for k in reversed(range(len(linears))):
        done += backward[k]
        ready_at[k] = done / sum(backward)
    # Steady state: after step 1 DDP rebuilds its buckets in the order gradients became
    # ready, a first bucket of first_bucket_bytes then bucket_bytes each (torch's function).
    ready_order = [(k, p) for k in reversed(range(len(linears)))
                   for p in (linears[k].bias, linears[k].weight)]
    indices, _ = private.bucket_assignment(
        [p for _, p in ready_order], [first_bucket_bytes, bucket_bytes])
    buckets = tuple((sum(4 * ready_order[i][1].numel() for i in bucket),
                     max(ready_at[ready_order[i][0]] for i in bucket)) for bucket in indices)
    return ModelShape(gradient_bytes=sum(b for b, _ in buckets), buckets=buckets,
                      backward_share=sum(backward) / (sum(backward) + sum(forward)),
                      n_x=n_x, n_y=n_y)


# --- one device's step -------------------------------------------------------------------

@dataclass(frozen=True)
class StepProfile:
    """One device's training step at per-device batch ``batch``: forward+backward (with
    data and framework overhead, of which ``fixed_s`` does not shrink with the batch) and
    the optimizer step, on ``share`` resources (CPU cores, or 1 GPU)."""

    batch: int
    forward_backward_s: float
    optimizer_s: float
    share: float
    device: str  # cpu | cuda
    source: str
    fixed_s: float = 0.0
    step_cv: float = 0.0  # std ÷ mean of the reference's step times (its jitter)

    def compute_s(self, batch: float, share: float) -> float:
        slower = self.share / share
        variable = (self.forward_backward_s - self.fixed_s) * batch / self.batch
        return self.fixed_s + (variable + self.optimizer_s) * slower

    def backward_s(self, batch: float, share: float, backward_share: float) -> float:
        return (self.compute_s(batch, share) - self.optimizer_s * self.share / share) * \
            backward_share


@dataclass(frozen=True)
class Cluster:
    """N devices per node × M nodes, their links, and how the ranks share resources."""

    per_node: int
    nodes: int
    intra: Link
    inter: Link
    nics: int = 1
    share: float = 1.0  # resources per rank, in the reference step's units
    overlap: bool = True
    single_share: float = 1.0  # what one device alone has (a CPU node's cores; 1 GPU)
    # The ranks' wait for the slowest at each all-reduce, measured (kosmoss comm
    # --compute-s); None: modelled from the reference's jitter (straggler_s).
    wait_s: Optional[float] = None
    ddp_s: float = 0.0  # DDP's own cost a step on each rank, besides the transfer (measured)
    # A rank's compute with every rank computing ÷ with it alone (memory and caches they
    # share; kosmoss comm --compute-s measures it): scales all of the step but the fixed cost.
    contention: float = 1.0
    # Ranks sharing one GPU, measured in the raw loop (kosmoss.bench.ddp_anatomy): a rank's
    # step ÷ one process's step at the whole batch, in place of the batch and share scaling
    # and the contention (time-slicing of the GPU is neither); and what the all-reduce adds
    # to a training step ("+ one flat all-reduce" − "no communication": a host-staged gloo
    # all-reduce of CUDA tensors waits for the GPU), the ranks' wait included. None: modelled.
    measured_compute_ratio: Optional[float] = None
    measured_exposed_s: Optional[float] = None

    @property
    def world(self) -> int:
        return self.per_node * self.nodes

    def allreduce_s(self, size: float) -> float:
        return hierarchical_allreduce_s(size, self.per_node, self.nodes, self.intra, self.inter,
                                        self.nics)


def exposed_comm_s(shape: ModelShape, cluster: Cluster, backward_s: float) -> Tuple[float, float]:
    """(all-reduce time of every bucket, the part of it left after backward ends)."""
    total, end = 0.0, 0.0
    for size, ready in shape.buckets:
        duration = cluster.allreduce_s(size)
        total += duration
        end = max(end, ready * backward_s if cluster.overlap else backward_s) + duration
    return total, max(0.0, end - backward_s)


@functools.lru_cache(maxsize=None)  # a projection grid asks for the same few n many times
def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normal draws] (0 for one, 0.564 for two, 1.029 for
    four, 1.424 for eight): ∫ x·n·φ(x)·Φ(x)^(n−1) dx, on a grid fine enough for 3 digits."""
    if n <= 1:
        return 0.0
    import numpy as np

    x = np.linspace(-8.0, 8.0, 16001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return float(np.sum(x * n * pdf * cdf ** (n - 1)) * (x[1] - x[0]))


def straggler_s(profile: StepProfile, compute_s: float, world: int) -> float:
    """Ranks meet at every step's all-reduce, so a step lasts as long as the slowest rank's
    compute: with each rank's step jittering by ``step_cv`` (the reference's, measured),
    the wait is E[max of ``world`` draws] − the mean."""
    return profile.step_cv * compute_s * expected_max_of_normals(world) if profile.step_cv else 0.0


def predict(profile: StepProfile, shape: ModelShape, cluster: Cluster, global_batch: int) -> dict:
    """Predicted step of each rank, samples/s of the world, efficiency, comm share."""
    batch = global_batch / cluster.world
    compute = profile.compute_s(batch, cluster.share)
    if cluster.world > 1 and cluster.measured_compute_ratio is not None:
        whole = profile.compute_s(global_batch, profile.share)
        compute = profile.fixed_s + (whole - profile.fixed_s) * cluster.measured_compute_ratio + \
            cluster.ddp_s
    elif cluster.world > 1:
        compute = profile.fixed_s + (compute - profile.fixed_s) * cluster.contention + \
            cluster.ddp_s
    backward = profile.backward_s(batch, cluster.share, shape.backward_share)
    comm, exposed = exposed_comm_s(shape, cluster, backward) if cluster.world > 1 else (0.0, 0.0)
    wait = straggler_s(profile, compute, cluster.world) if cluster.wait_s is None or \
        cluster.world < 2 else cluster.wait_s
    if cluster.world > 1 and cluster.measured_exposed_s is not None:
        exposed, wait = cluster.measured_exposed_s, 0.0  # the measured figure holds the wait
    step = compute + wait + exposed
    single = global_batch / profile.compute_s(global_batch, cluster.single_share)
    samples_per_s = global_batch / step
    return {"devices_per_node": cluster.per_node, "nodes": cluster.nodes, "world": cluster.world,
            "per_device_batch": batch, "compute_s": compute,
            "ddp_s": cluster.ddp_s if cluster.world > 1 else 0.0,
            "contention": cluster.contention if cluster.world > 1 else 1.0,
            "measured_compute_ratio": cluster.measured_compute_ratio if cluster.world > 1
            else None,
            "straggler_s": wait, "comm_s": comm,
            "exposed_comm_s": exposed, "step_s": step, "samples_per_s": samples_per_s,
            "speedup": samples_per_s / single,
            "efficiency": samples_per_s / (cluster.world * single),
            "comm_share": exposed / step}


# "Which assumption dominates": each input made twice as good, one at a time.
KNOBS = ("compute", "intra bandwidth", "inter bandwidth", "latency", "overlap")


def _improved(profile: StepProfile, cluster: Cluster, knob: str):
    intra, inter = cluster.intra, cluster.inter
    if knob == "compute":
        return replace(profile, forward_backward_s=profile.forward_backward_s / 2,
                       optimizer_s=profile.optimizer_s / 2, fixed_s=profile.fixed_s / 2), cluster
    if knob == "intra bandwidth":
        return profile, replace(cluster,
                                intra=replace(intra, bandwidth_Bps=2 * intra.bandwidth_Bps))
    if knob == "inter bandwidth":
        return profile, replace(cluster,
                                inter=replace(inter, bandwidth_Bps=2 * inter.bandwidth_Bps))
    if knob == "latency":
        return profile, replace(cluster, intra=replace(intra, latency_s=intra.latency_s / 2),
                                inter=replace(inter, latency_s=inter.latency_s / 2))
    return profile, replace(cluster, overlap=not cluster.overlap)


def sensitivity(profile: StepProfile, shape: ModelShape, cluster: Cluster,
                global_batch: int) -> Dict[str, float]:
    """Relative change of predicted samples/s when each input is made twice as good
    (overlap: switched), largest first."""
    base = predict(profile, shape, cluster, global_batch)["samples_per_s"]
    changes = {}
    for knob in KNOBS:
        better_profile, better_cluster = _improved(profile, cluster, knob)
        changes[knob] = predict(better_profile, shape, better_cluster,
                                global_batch)["samples_per_s"] / base - 1
    return dict(sorted(changes.items(), key=lambda item: -abs(item[1])))


def grid(profile: StepProfile, shape: ModelShape, base: Cluster, per_node: Sequence[int],
         nodes: Sequence[int], global_batch: int, cores_per_node: Optional[float] = None,
         weak: bool = False, one_machine: bool = False) -> List[dict]:
    """One prediction per N × M (sorted by world size), with its dominant assumption.
    ``cores_per_node``: CPU ranks share them (the share of each is cores ÷ N); ``weak``:
    the per-device batch stays the reference's instead of the global batch;
    ``one_machine``: every node runs on the same machine (hosts in network namespaces,
    simulated nodes), so all N × M ranks share its cores."""
    rows = []
    for m in nodes:
        for n in per_node:
            sharing = n * m if one_machine else n
            share = cores_per_node / sharing if cores_per_node else base.share
            cluster = replace(base, per_node=n, nodes=m, share=share,
                              single_share=cores_per_node or base.single_share)
            batch = profile.batch * n * m if weak else global_batch
            if batch < n * m:
                continue  # less than one sample per device
            row = predict(profile, shape, cluster, batch)
            row["global_batch"] = batch
            row["sensitivity"] = sensitivity(profile, shape, cluster, batch) if n * m > 1 else {}
            row["dominant"] = next(iter(row["sensitivity"]), None)
            rows.append(row)
    return sorted(rows, key=lambda r: (r["world"], r["nodes"]))


def verdict(rows: Sequence[dict]) -> dict:
    """Where adding devices stops paying: the peak of samples/s, and the first world size
    whose efficiency falls below 50 % (each device buys less than half its worth)."""
    peak = max(rows, key=lambda r: r["samples_per_s"])
    below = next((r for r in rows if r["efficiency"] < 0.5), None)
    return {"peak": _config(peak), "peak_samples_per_s": peak["samples_per_s"],
            "peak_is_largest": peak["world"] == max(r["world"] for r in rows),
            "break_even": _config(below) if below else None,
            "break_even_efficiency": below["efficiency"] if below else None}


def _config(row: dict) -> str:
    return f"{row['devices_per_node']}x{row['nodes']}"


# --- where the reference step comes from -------------------------------------------------

def comm_on_one_machine(comm: dict) -> bool:
    """A kosmoss comm measured across hosts in network namespaces: one machine's cores."""
    plan = comm.get("plan")
    return isinstance(plan, dict) and bool(plan.get("host_namespaces"))


def links_from_comm(comm: dict, flag: str = "--comm") -> Tuple[Link, Optional[Link]]:
    """(intra-node link, inter-node link or None) from ``kosmoss comm``'s JSON."""
    try:
        return _links_from_comm(comm, flag)
    except (KeyError, TypeError, AttributeError) as err:  # a file kosmoss did not write
        raise UsageError(f"{flag}: not a kosmoss comm JSON ({err!r} in it); write one with "
                         "kosmoss comm --out DIR") from None


def _links_from_comm(comm: dict, flag: str) -> Tuple[Link, Optional[Link]]:
    plan, groups = comm.get("plan"), comm.get("groups")
    if not isinstance(plan, dict) or not isinstance(groups, dict) or not groups or \
            plan.get("ranks_per_node") is None or plan.get("nodes") is None:
        raise UsageError(f"{flag}: not a kosmoss comm JSON (no plan or groups); write one with "
                         "kosmoss comm --out DIR")
    named = dict(groups)
    if "intra" not in named:
        named["intra" if plan["nodes"] == 1 else "inter"] = named["world"]
    source = f"kosmoss comm, {plan.get('backend')}, {comm.get('date', '?')}"
    intra, inter = (_link(named[name], name, source, flag) if name in named else None
                    for name in ("intra", "inter"))
    return intra, inter


def _link(group: dict, name: str, source: str, flag: str) -> Link:
    # The fit of the mean times where the JSON has one: a step pays the mean all-reduce,
    # and on a shared host its slow tail is a quarter more than the median (docs/scaling.md).
    fit = group.get("fit_mean") or group.get("fit")
    if not fit:
        raise UsageError(f"{flag}: its {name} group has no α–β fit (measure at least two sizes)")
    if not fit.get("link_bandwidth_Bps"):
        raise UsageError(f"{flag}: in its {name} group time did not grow with size (noise in "
                         "the latency regime?); measure larger sizes or more --repeats")
    latency, bandwidth = fit["link_latency_s"], fit["link_bandwidth_Bps"]
    if not (_finite(latency) and latency >= 0 and _finite(bandwidth) and bandwidth > 0):
        raise UsageError(f"{flag}: its {name} group's fit is not a latency >= 0 and a bandwidth "
                         f"> 0 ({latency!r}, {bandwidth!r}); measure it again with kosmoss comm")
    return Link("measured", float(latency), float(bandwidth), source)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def read_reference(path: Path, row: Optional[str] = None) -> dict:
    """The single-device figures of a kosmoss run (its folder or result.json) or of a
    bench row (bench.json, ``row``): samples/s, per-device batch, accelerator."""
    path = path.expanduser()
    file = path / "result.json" if path.is_dir() else path
    if path.is_dir() and not file.is_file() and (path / "bench.json").is_file():
        file = path / "bench.json"
    if not file.is_file():
        raise UsageError(f"--from {path}: no result.json or bench.json there; give a kosmoss "
                         "run folder, its result.json, or a bench.json")
    try:
        data = read_json_object(file)
    except (OSError, ValueError) as err:
        raise UsageError(f"--from {file}: not readable JSON ({err})") from None
    try:
        reference = _bench_reference(data, file, row) if "kosmoss_bench" in data else \
            _run_reference(data, file)
    except (KeyError, TypeError, AttributeError, ZeroDivisionError) as err:  # not kosmoss's
        raise UsageError(f"--from {file}: not a kosmoss result.json or bench.json ({err!r} "
                         "in it); give a kosmoss run folder, its result.json, or a bench.json") \
            from None
    samples, batch = reference["samples_per_s"], reference["batch"]
    if not (_finite(samples) and samples > 0 and isinstance(batch, int) and batch >= 1):
        raise UsageError(f"--from {file}: its samples/s {samples!r} and batch {batch!r} are not "
                         "a number > 0 and a whole number >= 1; give a run or bench that trained")
    spread = reference["step_time_cv"]
    if spread is not None and not (_finite(spread) and spread >= 0):
        raise UsageError(f"--from {file}: its step_time_cv {spread!r} is not a number >= 0 (the "
                         "steps' spread); give a run or bench kosmoss wrote")
    return reference


def _run_reference(result: dict, file: Path) -> dict:
    needed = ("train_samples_per_s", "per_device_batch_size", "world_size")
    missing = [key for key in needed if result.get(key) is None]
    if missing:
        raise UsageError(f"--from {file}: no {', '.join(missing)}; a projection needs a run "
                         "that trained (result.json of a finished kosmoss run)")
    if result["world_size"] != 1:
        raise UsageError(f"--from {file}: a run of {result['world_size']} ranks; a projection "
                         "starts from one device: give a 1-process run")
    return {"samples_per_s": one_step_a_batch(result["train_samples_per_s"],
                                              result["per_device_batch_size"], result),
            "batch": result["per_device_batch_size"],
            "device": "cuda" if result.get("accelerator") in ("gpu", "cuda") else "cpu",
            "source": f"run {file}", "step_time_cv": _first(result.get("step_time_cv"))}


def one_step_a_batch(samples_per_s: float, batch: int, measured: dict) -> float:
    """The reference's samples/s had it run Lightning's loop every step, as each rank of a
    multi-rank run does: a 1-process run with K steps a loop step (kosmoss.run.chunks) ran
    it once per K and measured its cost between chunks (``loop_step_s``)."""
    steps = measured.get("steps_per_execution") or 1
    loop = (measured.get("loop_step_s") or 0.0) * (1 - 1 / steps)
    return batch / (batch / samples_per_s + loop)


def _first(value) -> Optional[float]:
    """A 1-rank run's per-rank list holds one value."""
    return value[0] if isinstance(value, list) and value else value


def _bench_reference(bench: dict, file: Path, row_id: Optional[str]) -> dict:
    rows = {r["id"]: r for r in bench.get("rows", []) if r.get("status") == "measured"}
    if row_id is None:
        row_id = next((r for r in ("kosmoss-gpu", "kosmoss-cpu") if r in rows), None)
    row = rows.get(row_id or "")
    if row is None or row.get("ranks") != 1 or not row.get("samples_per_s"):
        usable = [r for r, v in rows.items() if v.get("ranks") == 1 and v.get("samples_per_s")]
        if not usable:
            raise UsageError(f"--from {file}: no 1-rank row was measured in it; a projection "
                             "starts from one device (bench a 1-rank set-up, e.g. --only "
                             "kosmoss-cpu)")
        if row_id is None:  # no --row typed, and neither kosmoss row was measured
            raise UsageError(f"--from {file}: no measured kosmoss-gpu or kosmoss-cpu row; "
                             f"give --row, one of {', '.join(usable)}")
        raise UsageError(f"--row {row_id}: not a measured 1-rank row of {file}; choose from "
                         f"{', '.join(usable)}")
    return {"samples_per_s": one_step_a_batch(row["samples_per_s"], row["batch_size"], row),
            "batch": row["batch_size"],
            "device": "cuda" if row["device"] == "gpu" else "cpu",
            "source": f"bench row {row_id} of {file}", "step_time_cv": row.get("step_time_cv")}


def _device(name: str):
    import torch

    return torch.device("cuda" if name == "cuda" else "cpu")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(batch: int, device: str = "cpu", hidden: Sequence[int] = (100, 100, 100),
              n_x: int = 4128, n_y: int = 552, min_s: float = 0.5,
              threads: Optional[int] = None) -> Tuple[float, float]:
    """(forward+backward, optimizer) seconds of kosmoss's MLP with Adam on synthetic
    tensors, medians after 3 warm-up steps, for at least ``min_s``; on ``threads`` CPU
    threads if given (restored after)."""
    import statistics

    import torch

    from ..model import mlp

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        target = _device(device)
        model = mlp(n_x, hidden, n_y).to(target)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(batch, n_x, device=target), torch.randn(batch, n_y, device=target)
        fb, opt, start, step = [], [], time.perf_counter(), 0
        while step < 3 + 5 or time.perf_counter() - start < min_s:
            _sync(target)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            _sync(target)
            t1 = time.perf_counter()
            optimizer.step()
            _sync(target)
            if step >= 3:
                fb.append(t1 - t0)
                opt.append(time.perf_counter() - t1)
            step += 1
    finally:
        torch.set_num_threads(before)
    return statistics.median(fb), statistics.median(opt)


def ddp_overhead_s(batch: int, threads: int = 1, rounds: int = 7, steps: int = 60,
                   hidden: Sequence[int] = (100, 100, 100), n_x: int = 4128,
                   n_y: int = 552) -> Optional[float]:
    """What DDP adds to a rank's CPU step besides the transfer: its forward wrapper, the
    Reducer's hooks and bucket handling, timed as kosmoss runs DDP (gradients as bucket
    views, no buffer sync) on a 1-rank gloo group, against the bare model; median of the
    alternated rounds' median steps. None where this process is in a group already."""
    import statistics
    import warnings

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..engines.ddp import no_buffer_sync_per_step
    from ..model import mlp

    if dist.is_initialized():
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x, y = torch.randn(batch, n_x), torch.randn(batch, n_y)
        bare = mlp(n_x, hidden, n_y)
        with warnings.catch_warnings():  # DDP warns that one rank has nothing to reduce
            warnings.simplefilter("ignore")
            wrapped = DistributedDataParallel(mlp(n_x, hidden, n_y), gradient_as_bucket_view=True,
                                              **no_buffer_sync_per_step())
        times = {"bare": [], "ddp": []}
        for k in range(rounds):
            for name, model in (("bare", bare), ("ddp", wrapped))[::1 if k % 2 else -1]:
                times[name].append(_median_step(model, x, y, steps))
        del wrapped  # before the group: a Reducer must not be the group's last owner
        return max(0.0, statistics.median(times["ddp"]) - statistics.median(times["bare"]))
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(before)


def _median_step(model, x, y, steps: int) -> float:
    import statistics

    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for step in range(steps + 3):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if step >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def thread_speedup(batch: int, threads: int, rounds: int = 3, min_s: float = 0.3,
                   hidden: Sequence[int] = (100, 100, 100), n_x: int = 4128,
                   n_y: int = 552) -> float:
    """How many cores ``threads`` CPU threads are worth now: the step on 1 thread ÷ on
    ``threads`` (medians of alternated rounds). Nominally ``threads``; on a host other
    processes also use, threads that wait for each other at every parallel region can
    make it far less (even below 1), and the ranks of a run, one thread each, do not pay it."""
    import statistics

    if threads <= 1:
        return 1.0
    one, many = [], []
    for _ in range(rounds):
        one.append(sum(time_step(batch, "cpu", hidden, n_x, n_y, min_s=min_s, threads=1)))
        many.append(sum(time_step(batch, "cpu", hidden, n_x, n_y, min_s=min_s,
                                  threads=threads)))
    return statistics.median(one) / statistics.median(many)


def measured_profile(batch: int, device: str,
                     hidden: Sequence[int] = (100, 100, 100)) -> StepProfile:
    """A step measured here; ``fixed_s`` from a second, 8× smaller batch (the intercept of
    a line through both). On CPU on one thread, so the reference is 1 core: on a busy host
    a 2-thread timing is mostly threads waiting for each other."""
    threads = 1 if device == "cpu" else None
    fb, opt = time_step(batch, device, hidden, threads=threads)
    small = max(1, batch // 8)
    fb_small, _ = time_step(small, device, hidden, threads=threads)
    slope = (fb - fb_small) / (batch - small) if batch > small else 0.0
    fixed = min(max(0.0, fb - slope * batch), fb)
    return StepProfile(batch, fb, opt, 1.0, device,
                       f"measured here ({device}{', 1 thread' if threads else ''}, batch {batch})",
                       fixed_s=fixed)


def profile_from_reference(reference: dict, share: float,
                           hidden: Sequence[int] = (100, 100, 100), n_x: int = 4128,
                           n_y: int = 552) -> StepProfile:
    """A run's or bench row's step, split: the optimizer step measured here (it does not
    depend on the data), the rest counted as forward+backward. On CPU the optimizer is
    timed on one thread and scaled to ``share`` cores by the same rule as the ranks: on a
    busy host, threads waiting for each other make a 2-thread timing mostly noise."""
    step = reference["batch"] / reference["samples_per_s"]
    cpu = reference["device"] == "cpu"
    _, opt = time_step(min(reference["batch"], 64), reference["device"], hidden, n_x, n_y,
                       min_s=0.3, threads=1 if cpu else None)
    opt = opt / share if cpu else opt
    opt = min(opt, 0.5 * step)  # a busier machine now than during the run must not eat the step
    fixed = min(reference.get("fixed_s") or 0.0, step - opt)
    return StepProfile(reference["batch"], step - opt, opt, share, reference["device"],
                       reference["source"], fixed_s=fixed,
                       step_cv=reference.get("step_time_cv") or 0.0)
