"""Lesson 09 (communication): a ring all-reduce written with send/recv, checked against
``dist.all_reduce`` and for the traffic a ring moves, in 2 gloo processes; DDP's gradient
buckets, checked against torch's own bucketing function.

    kosmoss check 09
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Dict, Iterator, List

from .core import Exercise, failed, learner, passed

TOLERANCE = 1e-6
RING_SHAPES = ((10,), (1001,), (3, 7))  # odd sizes: the chunks are not all equal
SENDS = ("send", "isend")
RECEIVES = ("recv", "irecv")
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
               "all_gather_into_tensor", "broadcast", "reduce", "all_to_all_single")

# ---------------------------------------------------------------- 09.ring_all_reduce

RING_STATEMENT = """\
**Write a ring all-reduce with `send` and `recv`: reduce-scatter, then all-gather.**

Write `ring_all_reduce(tensor)`: on every rank, replace `tensor` (any shape, float32) in
place by the sum of that tensor over all ranks, as `dist.all_reduce(tensor)` does — but
with point-to-point messages only (`dist.send`/`dist.recv` or `dist.isend`/`dist.irecv`),
around a ring: rank `r` sends to rank `(r + 1) % n` and receives from rank `(r - 1) % n`.
Cut the tensor into `n` chunks; in the reduce-scatter phase (`n - 1` steps) each rank
sends one chunk and adds the one it receives, so that it ends with one chunk summed over
all ranks; in the all-gather phase (`n - 1` steps) the summed chunks go round once more.
The checker runs your cell in two gloo processes on tensors of several shapes, compares
with `dist.all_reduce`, and counts the bytes each rank sends: a ring sends `2(n-1)`
messages of one chunk each, `2(n-1)/n` of the buffer in all. Collectives are not allowed.
"""

RING_SKELETON = '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place, with send/recv around a ring."""
    raise NotImplementedError("your code here")
'''

RING_REFERENCE = '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = torch.tensor_split(tensor.view(-1), n)  # views: writing them writes tensor
    for step in range(n - 1):  # reduce-scatter
        outgoing, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(outgoing.clone(), right)
        received = torch.empty_like(incoming)
        dist.recv(received, left)
        request.wait()
        incoming += received
    for step in range(n - 1):  # all-gather: chunk (rank + 1) % n is complete here
        outgoing, incoming = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        request = dist.isend(outgoing.clone(), right)
        received = torch.empty_like(incoming)
        dist.recv(received, left)
        request.wait()
        incoming.copy_(received)
    return tensor
'''

RING_WRONG = {
    "reduce-scatter only": '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for step in range(n - 1):
        outgoing, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(outgoing.clone(), (rank + 1) % n)
        received = torch.empty_like(incoming)
        dist.recv(received, (rank - 1) % n)
        request.wait()
        incoming += received
    return tensor
''',
    "the whole buffer to the neighbour": '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    request = dist.isend(tensor.clone(), (rank + 1) % n)
    received = torch.empty_like(tensor)
    dist.recv(received, (rank - 1) % n)
    request.wait()
    tensor += received
    return tensor
''',
    "calls all_reduce": '''
import torch.distributed as dist


def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor
''',
}


@contextmanager
def _watched() -> Iterator[Dict[str, List]]:
    """Record every point-to-point message sent (elements) and every collective called,
    in both namespaces a cell may reach them through; restore them afterwards."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    seen: Dict[str, List] = {"sent": [], "collectives": []}
    saved, depth = [], [0]

    def wrap(name, original):
        def watched(*args, **kwargs):
            if depth[0] == 0:  # dist.send calls isend itself: count the learner's call only
                if name in SENDS:
                    tensor = args[0] if args else kwargs.get("tensor")
                    seen["sent"].append(int(tensor.numel()))
                elif name not in RECEIVES:
                    seen["collectives"].append(name)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return watched

    for name in SENDS + RECEIVES + COLLECTIVES:
        original = getattr(distributed_c10d, name, None)
        if original is None:
            continue
        replacement = wrap(name, original)
        for module in (dist, distributed_c10d):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, replacement)
    try:
        yield seen
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


def _inputs(rank: int, shape) -> "tuple":
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(*shape, generator=generator)


def ring_rank_task(namespace: dict, rank: int, world_size: int) -> list:
    import torch.distributed as dist

    ring = learner(namespace, "ring_all_reduce")
    results = []
    for shape in RING_SHAPES:
        mine = _inputs(rank, shape)
        expected = mine.clone()
        dist.all_reduce(expected)  # the reference first: both ranks always reach it
        given = mine.clone()
        with _watched() as seen:
            ring(given)
        results.append({"shape": shape, "given": mine, "got": given, "expected": expected,
                        "sent": seen["sent"], "collectives": seen["collectives"],
                        "world_size": world_size})
    return results


def ring_judge(ranks: List[list]) -> tuple:
    for rank, cases in enumerate(ranks):
        for case in cases:
            message = _wrong_values(rank, case) or _wrong_traffic(rank, case)
            if message:
                return failed(message)
    n = ranks[0][0]["world_size"]
    return passed(f"equal to dist.all_reduce on {len(RING_SHAPES)} shapes on both ranks, "
                  f"with 2(n-1) = {2 * (n - 1)} messages of one chunk each, 2(n-1)/n = "
                  f"{2 * (n - 1) / n:g} of the buffer sent per rank")


def _wrong_values(rank: int, case: dict):
    import torch

    if case["collectives"]:
        return (f"your ring called dist.{case['collectives'][0]}: write it with send/recv "
                "only (that is what the collective does inside)")
    got, expected, shape = case["got"], case["expected"], tuple(case["shape"])
    if got.shape != expected.shape:
        return f"rank {rank}: the tensor of shape {shape} came back with shape {tuple(got.shape)}"
    gap = float((got - expected).abs().max())
    if gap <= TOLERANCE * max(1.0, float(expected.abs().max())):
        return None
    where = f"rank {rank}, shape {shape}: your result differs from dist.all_reduce by {gap:.2g}"
    if torch.equal(got, case["given"]):
        return where + ": the tensor was not changed — reduce it in place"
    chunks = zip(torch.tensor_split(got.view(-1), case["world_size"]),
                 torch.tensor_split(expected.view(-1), case["world_size"]))
    right = [i for i, (a, b) in enumerate(chunks) if torch.allclose(a, b, atol=TOLERANCE)]
    if right:
        return (where + f": only chunk(s) {right} hold the sum — each rank ends the "
                "reduce-scatter with one complete chunk; the all-gather must pass them round")
    return where


def _wrong_traffic(rank: int, case: dict):
    n, numel = case["world_size"], math.prod(case["shape"])
    chunk = math.ceil(numel / n)
    sent = case["sent"]
    if not sent:
        return f"rank {rank} sent no message: use dist.send/dist.isend around the ring"
    if max(sent) > chunk:
        return (f"rank {rank} sent a message of {max(sent)} elements for a tensor of {numel}: "
                f"a ring sends chunks of 1/n of it (at most {chunk} here), so that every link "
                "carries the same share")
    if len(sent) != 2 * (n - 1):
        return (f"rank {rank} sent {len(sent)} messages; a ring all-reduce sends 2(n-1) = "
                f"{2 * (n - 1)}: n-1 in the reduce-scatter, n-1 in the all-gather")
    return None


# ---------------------------------------------------------------- 09.buckets

BUCKET_STATEMENT = """\
**Put gradients into DDP's buckets.**

Write `ddp_buckets(grad_bytes, first_cap, cap)`. `grad_bytes` lists the sizes (bytes) of
the gradients in the order backward makes them ready. DDP fills a bucket with them in
that order and closes it as soon as its size reaches the cap (a gradient is never split,
so a bucket may go over the cap); the first bucket has cap `first_cap`, every later one
`cap`; the last bucket holds what is left. Return the buckets as lists of indices into
`grad_bytes`. The checker compares with the function DistributedDataParallel itself
calls (`torch.distributed._compute_bucket_assignment_by_size`) on several cases, the
sizes of kosmoss's MLP among them.
"""

BUCKET_SKELETON = '''
def ddp_buckets(grad_bytes, first_cap, cap):
    """Lists of indices into grad_bytes, one per bucket, in order."""
    raise NotImplementedError("your code here")
'''

BUCKET_REFERENCE = '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets
'''

BUCKET_WRONG = {
    "never over the cap": '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
        current.append(index)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
''',
    "one cap for every bucket": '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size = [], [], 0
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
''',
}

MIB = 2 ** 20
# kosmoss's MLP in backward's order (last layer first; bias, then weight), float32 bytes.
MLP_READY_ORDER = (552 * 4, 100 * 552 * 4, 100 * 4, 100 * 100 * 4, 100 * 4, 100 * 100 * 4,
                   100 * 4, 4128 * 100 * 4)
BUCKET_CASES = ((MLP_READY_ORDER, MIB, 25 * MIB), (MLP_READY_ORDER, MIB // 4, MIB // 4),
                ((100,) * 10, 150, 300), ((600, 100, 100, 100, 100), 500, 500),
                ((4000, 4000, 4000), 1000, 6000), ((10, 20, 30, 40), 25, 1000))


def torch_buckets(grad_bytes, first_cap: int, cap: int) -> List[List[int]]:
    """What DDP's reducer computes: float32 tensors of those sizes, its own function."""
    import torch

    from ..run.lightning_private import bucket_assignment

    tensors = [torch.empty(nbytes // 4) for nbytes in grad_bytes]
    buckets, _ = bucket_assignment(tensors, [first_cap, cap])
    return [list(bucket) for bucket in buckets]


def bucket_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "ddp_buckets")
    for grad_bytes, first_cap, cap in BUCKET_CASES:
        expected = torch_buckets(grad_bytes, first_cap, cap)
        got = mine(list(grad_bytes), first_cap, cap)
        try:
            got = [[int(i) for i in bucket] for bucket in got]
        except TypeError:
            return failed(f"ddp_buckets returned {got!r}: return a list of lists of indices")
        if got != expected:
            return failed(f"for gradients of {list(grad_bytes)} bytes, first cap {first_cap}, "
                          f"cap {cap}: yours {got}, DDP's {expected}"
                          + _bucket_hint(got, grad_bytes, first_cap, cap))
    return passed(f"your buckets equal DDP's in {len(BUCKET_CASES)} cases, kosmoss's MLP "
                  "with the default and with a 0.25 MiB cap among them")


def _bucket_hint(got, grad_bytes, first_cap: int, cap: int) -> str:
    if got == torch_buckets(grad_bytes, cap, cap):
        return " — the first bucket has its own cap, first_cap"
    if all(sum(grad_bytes[i] for i in bucket) <= (first_cap if k == 0 else cap)
           for k, bucket in enumerate(got) if len(bucket) > 1):
        return (" — DDP closes a bucket once it *reaches* the cap, with the gradient that "
                "made it go over inside")
    return ""


EXERCISES = [
    Exercise("09.ring_all_reduce", RING_STATEMENT, RING_SKELETON, RING_REFERENCE, RING_WRONG,
             ring_judge, rank_task=ring_rank_task, names=("ring_all_reduce",)),
    Exercise("09.buckets", BUCKET_STATEMENT, BUCKET_SKELETON, BUCKET_REFERENCE, BUCKET_WRONG,
             bucket_judge, names=("ddp_buckets",)),
]
