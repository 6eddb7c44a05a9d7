"""Three DDPs written by hand, timed beside torch's on the course's MLP (lesson 9b): one
flat all-reduce after backward, one asynchronous all-reduce per gradient from its hook,
buckets in reverse order — each a wrapper with ``finish_gradient_synchronization()``,
the interface of the lesson's exercises (``kosmoss check 09b``).

Every rank times, step by step, forward + backward and then the synchronisation
(``time.perf_counter`` around ``finish_gradient_synchronization()``, where the wrappers
wait on their all-reduces: the communication a rank is *exposed* to), and the same
all-reduces replayed one after the other with nothing else running (what the
communication costs when nothing hides it; torch's DDP launches its all-reduces in C++, out
of sight, so its own buckets, as it rebuilt them after its first step, are replayed).
torch's DDP waits inside backward, so its exposed time is its step less the step of the
model alone. The lesson runs it on forked gloo ranks, over the loopback or with one rank per host of a ``kosmoss.launch.hosts``
set (each rank enters its host's network namespace before it opens a socket)::

    on_ranks(bench_rank, 2, wrappers, Setup(), folder)            # the loopback
    with hosts.host_set(2, rate, purpose="lesson 9b") as made:
        on_ranks(bench_rank, 2, wrappers, Setup(), folder, made)    # a link of a set rate

``course_wrappers()`` are the lesson's reference answers, for a learner who has not
written the exercises yet.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..launch import hosts as host_sets
from ..model import mlp
from ..run.lightning_private import ddp_bucket_bytes

WRAPPERS = {"flat": "FlatDDP", "overlap": "OverlapDDP", "buckets": "BucketDDP"}
VARIANTS = ("model alone", "torch DDP", *WRAPPERS)


COURSE_MLP = (4128, 100, 100, 100, 552)  # inputs, the hidden widths, outputs
EQUAL_LAYERS = (512,) * 9  # eight layers of 512 x 512: every gradient the same size
LINK = "1gbit"  # the lesson's link between hosts: an all-reduce takes long enough to hide


@dataclass(frozen=True)
class Setup:
    layers: tuple = COURSE_MLP  # the widths of kosmoss.model.mlp, first to last
    batch: int = 64  # columns per rank
    steps: int = 20  # timed, after the warm-up
    warmup: int = 3  # DDP rebuilds its buckets after its first step
    bucket_cap_mb: float = 0.25  # BucketDDP's and torch DDP's (lesson 9's small cap)
    replays: int = 5  # of the all-reduces alone

    def model(self):
        return mlp(self.layers[0], self.layers[1:-1], self.layers[-1])


def lesson_settings(missing: Optional[str], quick: bool) -> Dict[str, Tuple[Setup,
                                                                           Optional[str]]]:
    """The lesson's settings, label -> (setup, the link's rate, None for the loopback): the
    course's MLP over the loopback and over a link between two hosts, a model of equal
    layers over the link; where hosts cannot be made (``missing`` says why), no link, and
    the model of equal layers over the loopback."""
    steps = dict(steps=5, warmup=2, replays=3) if quick else dict(steps=20, warmup=3, replays=5)
    link = None if missing else LINK
    where = "loopback" if missing else f"{LINK} link"
    settings = {"course MLP, loopback": (Setup(**steps), None)}
    if link:
        settings[f"course MLP, {where}"] = (Setup(**steps), link)
    settings[f"equal layers, {where}"] = (Setup(layers=EQUAL_LAYERS, batch=256, **steps), link)
    return settings


def bucket_bytes(setup: Setup) -> List[int]:
    """BucketDDP's buckets on the setup's model, in bytes, in the order they fill (the
    reverse of the parameters; a bucket closes once it reaches the cap)."""
    cap, buckets, size = setup.bucket_cap_mb * 1024 * 1024, [], 0
    for parameter in reversed(list(setup.model().parameters())):
        size += 4 * parameter.numel()
        if size >= cap:
            buckets, size = buckets + [size], 0
    return buckets + ([size] if size else [])


def course_wrappers() -> Dict[str, type]:
    """The lesson's reference answers, as classes (by ``WRAPPERS``' key)."""
    from ..exercises.core import find

    namespace: dict = {}
    for key in WRAPPERS:
        exercise = find(f"09b.{key}")
        exec(compile(exercise.reference, f"<reference {exercise.id}>", "exec"), namespace)
    return {key: namespace[name] for key, name in WRAPPERS.items()}


def wrappers_for(namespace: dict) -> Tuple[Dict[str, type], Dict[str, str]]:
    """The learner's classes where they have answered their exercise cell (the one run
    last, from IPython's history), else the course's; and whose each one is."""
    from ..exercises.core import find
    from ..exercises.judging import cell_source, untouched

    course = course_wrappers()
    chosen, whose = {}, {}
    for key, name in WRAPPERS.items():
        exercise = find(f"09b.{key}")
        source = cell_source(exercise, namespace)
        if callable(namespace.get(name)) and source and not untouched(exercise, source):
            chosen[key], whose[key] = namespace[name], "yours"
        else:
            chosen[key], whose[key] = course[key], "the course's"
    return chosen, whose


def bench_rank(rank: int, world_size: int, port: int, wrappers: Dict[str, type],
               setup: Setup, folder: Path, made: Optional["host_sets.HostSet"] = None) -> None:
    """One rank of the benchmark (``on_ranks`` calls it): every variant in turn, from the
    same weights on the same data; writes ``rank<N>.json`` into ``folder``."""
    master = "127.0.0.1"
    if made is not None:
        host = made.hosts[rank]
        host_sets.enter(host.namespace)  # before any socket: gloo's threads follow
        os.environ.update(host.socket_env)
        master = made.master_addr
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world_size)
    figures = {name: _time_variant(name, wrappers, setup, rank, folder) for name in VARIANTS}
    (folder / f"rank{rank}.json").write_text(json.dumps(
        {"setup": asdict(setup), "world_size": world_size, "figures": figures}))
    dist.destroy_process_group()


def _time_variant(name: str, wrappers: Dict[str, type], setup: Setup, rank: int,
                  folder: Path) -> dict:
    torch.manual_seed(0)
    model = setup.model()
    wrapped = _wrap(name, model, wrappers, setup)
    data = torch.Generator().manual_seed(rank)
    x = torch.randn(setup.batch, setup.layers[0], generator=data)
    y = torch.randn(setup.batch, setup.layers[-1], generator=data)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sync = getattr(wrapped, "finish_gradient_synchronization", lambda: None)
    compute, exposed, sizes = [], [], []
    for step in range(setup.warmup + setup.steps):
        optimizer.zero_grad()
        dist.barrier()  # every rank starts the step together
        with _recorded(sizes if step == 0 else None):
            started = time.perf_counter()
            torch.nn.functional.mse_loss(wrapped(x), y).backward()
            backward_done = time.perf_counter()
            sync()
            synced = time.perf_counter()
        optimizer.step()
        if step >= setup.warmup:
            compute.append(backward_done - started)
            exposed.append(synced - backward_done)
    if rank == 0:
        torch.save(torch.cat([p.detach().flatten() for p in model.parameters()]),
                   folder / f"weights-{name}.pt")
    if name == "torch DDP":  # its all-reduces run in C++, unseen: its buckets say what they held
        sizes = [nbytes // 4 for nbytes in ddp_bucket_bytes(wrapped)]
    figures = {"forward_backward_s": compute, "finish_s": exposed,
               "step_s": [c + e for c, e in zip(compute, exposed)],
               "all_reduce_elements": sizes}
    figures["alone_s"] = _alone(sizes, setup.replays, name != "flat") if sizes else 0.0
    del wrapped  # a DDP before its process group (lesson 9 says why)
    gc.collect()
    return figures


def _wrap(name: str, model, wrappers: Dict[str, type], setup: Setup):
    if name == "model alone":
        return model
    if name == "torch DDP":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, bucket_cap_mb=setup.bucket_cap_mb)
    if name == "buckets":
        return wrappers[name](model, setup.bucket_cap_mb)
    return wrappers[name](model)


class _recorded:
    """Record the sizes of the all-reduces Python code launches in the block (the
    wrappers'; DDP's run in C++ and are not seen), to replay them alone."""

    def __init__(self, sizes: Optional[List[int]]):
        self.sizes = sizes

    def __enter__(self):
        if self.sizes is None:
            return self
        original = self.original = dist.all_reduce
        sizes = self.sizes

        def all_reduce(tensor, *args, **kwargs):
            sizes.append(int(tensor.numel()))
            return original(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        if self.sizes is not None:
            dist.all_reduce = self.original
        return False


def _alone(sizes: List[int], replays: int, asynchronous: bool) -> float:
    """The median time of these all-reduces with nothing else running, launched as the
    wrapper launches them: one after the other (asynchronous ones all at once, then
    waited on: gloo works on several at a time)."""
    buffers = [torch.randn(size) for size in sizes]
    times = []
    for _ in range(replays):
        dist.barrier()
        started = time.perf_counter()
        handles = [dist.all_reduce(buffer, async_op=asynchronous) for buffer in buffers]
        for handle in handles if asynchronous else ():
            handle.wait()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# ---------------------------------------------------------------- reading the ranks


def read(folder: Path, world_size: int) -> dict:
    """Every rank's figures: {variant: {figure: [rank 0's, rank 1's, ...]}}."""
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]
    return {name: {key: [r["figures"][name][key] for r in ranks]
                   for key in ranks[0]["figures"][name]} for name in VARIANTS}


def _median_of_slowest(per_rank: List[List[float]]) -> float:
    """The median over the steps of the slowest rank's time: a collective ends when its
    last rank does."""
    return statistics.median(max(step) for step in zip(*per_rank))


def summary(figures: dict, slowest: Callable = _median_of_slowest) -> Dict[str, dict]:
    """Per variant, in seconds (medians over the steps of the slowest rank): the step (forward,
    backward and synchronisation), the communication a rank was exposed to (its time in
    finish_gradient_synchronization; torch's DDP waits inside backward, so its step less
    the model alone's), its all-reduces alone, and what the overlap hid: the step
    nothing would overlap, model alone + all-reduces alone, less the step measured."""
    compute = slowest(figures["model alone"]["step_s"])
    table = {"model alone": {"step_s": compute}}
    for name in VARIANTS[1:]:
        row = figures[name]
        step = slowest(row["step_s"])
        table[name] = {"step_s": step, "alone_s": max(row["alone_s"]),
                       "exposed_s": step - compute if name == "torch DDP"
                       else slowest(row["finish_s"]),
                       "all_reduces": len(row["all_reduce_elements"][0])}
    for name in VARIANTS[1:]:
        table[name]["hidden_s"] = compute + table[name]["alone_s"] - table[name]["step_s"]
    return table


def weight_gaps(folder: Path) -> Dict[str, float]:
    """Each wrapper's final weights (rank 0's) against torch DDP's: the largest difference
    relative to the largest weight (float32 sums in another order differ in their last
    bits; a wrong wrapper by whole factors)."""
    reference = torch.load(folder / "weights-torch DDP.pt").double()
    scale = float(reference.abs().max())
    return {name: float((torch.load(folder / f"weights-{name}.pt").double()
                         - reference).abs().max()) / scale for name in WRAPPERS}
