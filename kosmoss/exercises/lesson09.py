"""Lesson 09 (communication): a ring all-reduce written with send/recv, checked against
the exact sum and for the traffic a ring moves, at 2, 3 and 4 gloo processes; DDP's gradient
buckets, checked against torch's own bucketing function.

    kosmoss check 09
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Dict, Iterator, List

from .core import Exercise, Mistake, failed, learner, passed
from .tolerance import gamma
from ..run.lightning_private import bucket_assignment_function

# Odd sizes: the chunks are not all equal; (3,) at 4 ranks leaves one chunk empty.
RING_SHAPES = ((10,), (1001,), (3, 7), (3,))
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
Cut the tensor into `n` chunks (`torch.tensor_split`; some may be one element shorter,
or empty when the tensor has fewer elements than ranks); in the reduce-scatter phase
(`n - 1` steps) each rank sends one chunk and adds the one it receives, so that it ends
with one chunk summed over all ranks; in the all-gather phase (`n - 1` steps) the summed
chunks go round once more. The checker runs your cell at 2, 3 and 4 gloo processes on
tensors of several shapes, compares with the exact sum to float32 rounding, and counts
the messages each rank sends: a ring sends `2(n-1)` messages of one chunk each,
`2(n-1)/n` of the buffer in all. Collectives are not allowed.
"""

RING_SKELETON = """
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    \"\"\"Sum `tensor` over all ranks, in place, with send/recv around a ring.\"\"\"
    raise NotImplementedError("your code here")
"""

RING_REFERENCE = """
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
"""


def _ring(scatter_out: str, scatter_in: str, gather_out: str, gather_in: str,
          steps: str = "n - 1", combine: str = "incoming.copy_(received)") -> str:
    """A ring like the reference, with its chunk indices, step count or all-gather
    changed: the shape of most learners' mistakes."""
    return f"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for step in range({steps}):
        outgoing, incoming = chunks[{scatter_out}], chunks[{scatter_in}]
        request = dist.isend(outgoing.clone(), (rank + 1) % n)
        received = torch.empty_like(incoming)
        dist.recv(received, (rank - 1) % n)
        request.wait()
        incoming += received
    for step in range({steps}):
        outgoing, incoming = chunks[{gather_out}], chunks[{gather_in}]
        request = dist.isend(outgoing.clone(), (rank + 1) % n)
        received = torch.empty_like(incoming)
        dist.recv(received, (rank - 1) % n)
        request.wait()
        {combine}
    return tensor
"""


_RIGHT = ("(rank - step) % n", "(rank - step - 1) % n", "(rank + 1 - step) % n",
          "(rank - step) % n")

RING_WRONG = {
    "reduce-scatter only": Mistake("""
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
""", "the all-gather must pass them round"),
    "the whole buffer to the neighbour": Mistake("""
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
""", "a ring sends chunks of 1/n"),
    "calls all_reduce": Mistake("""
import torch.distributed as dist


def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor
""", "called dist.all_reduce"),
    "reduce-scatter's chunk index walks +step": Mistake(
        _ring("(rank + step) % n", "(rank + step - 1) % n", *_RIGHT[2:]),
        "collects every rank's values over the n - 1 steps", wrong_at=(3, 4)),
    "one step per phase, as at 2 ranks": Mistake(
        _ring(*_RIGHT, steps="1"), "a ring of 3 sends 2(n-1) = 4", wrong_at=(3, 4)),
    "the all-gather adds": Mistake(
        _ring(*_RIGHT, combine="incoming += received"), "copies the summed chunk"),
    "the all-gather starts from the wrong chunk": Mistake(
        _ring(*_RIGHT[:2], "(rank - step) % n", "(rank - step - 1) % n"),
        "passes on completed chunks only"),
}


@contextmanager
def _watched() -> Iterator[Dict[str, List]]:
    """Record every point-to-point message sent (elements) and every collective called,
    in both namespaces a cell may reach them through; restore them afterwards."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    seen: Dict[str, List] = {"sent": [], "to": [], "from": [], "collectives": []}
    saved, depth = [], [0]

    def wrap(name, original):
        def watched(*args, **kwargs):
            if depth[0] == 0:  # dist.send calls isend itself: count the learner's call only
                if name in SENDS:
                    tensor = args[0] if args else kwargs.get("tensor")
                    seen["sent"].append(int(tensor.numel()))
                    seen["to"].append(_peer(args, kwargs, "dst"))
                elif name in RECEIVES:
                    seen["from"].append(_peer(args, kwargs, "src"))
                else:
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


def _peer(args, kwargs, key: str):
    """The rank a send goes to (``dst``) or a receive comes from (``src``; None: any)."""
    peer = args[1] if len(args) > 1 else kwargs.get(key, kwargs.get(f"group_{key}"))
    return None if peer is None else int(peer)


def _inputs(rank: int, shape) -> "tuple":
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(*shape, generator=generator)


def ring_rank_task(namespace: dict, rank: int, world_size: int) -> list:
    ring = learner(namespace, "ring_all_reduce")
    results = []
    for shape in RING_SHAPES:
        given = _inputs(rank, shape)
        mine = given.clone()
        storage = mine.data_ptr()  # `tensor.data = ...` swaps it: a view taken before misses
        with _watched() as seen:
            ring(mine)
        results.append({"shape": shape, "given": given, "got": mine, "sent": seen["sent"],
                        "to": seen["to"], "from": seen["from"],
                        "collectives": seen["collectives"],
                        "moved": mine.data_ptr() != storage})
    return results


def ring_tolerance(inputs: List) -> "tuple":
    """The exact sum (float64) and, per element, the float32 error of summing n values in
    any order: γ_{n-1}·Σ|x_r| (Higham 2002, §4.2)."""
    exact = sum(x.double() for x in inputs)
    return exact, gamma(max(len(inputs) - 1, 1)) * sum(x.double().abs() for x in inputs)


def ring_judge(ranks: List[list]) -> tuple:
    n = len(ranks)
    for index, shape in enumerate(RING_SHAPES):
        inputs = [cases[index]["given"] for cases in ranks]
        exact, tolerance = ring_tolerance(inputs)
        for rank, cases in enumerate(ranks):
            case = cases[index]
            message = (_wrong_call(case) or _wrong_values(rank, case, inputs, exact, tolerance)
                       or _wrong_traffic(rank, case, n))
            if message:
                return failed(message)
        message = _not_a_ring([cases[index] for cases in ranks])
        if message:
            return failed(message)
    return passed(f"equal to the sum on {len(RING_SHAPES)} shapes on all {n} ranks, with "
                  f"2(n-1) = {2 * (n - 1)} messages of one chunk each, 2(n-1)/n = "
                  f"{2 * (n - 1) / n:.3g} of the buffer sent per rank")


def _wrong_call(case: dict):
    if case["collectives"]:
        return (f"your ring called dist.{case['collectives'][0]}: write it with send/recv "
                "only (that is what the collective does inside)")
    if case.get("moved"):
        return (f"shape {tuple(case['shape'])}: the tensor given now holds new memory "
                "(`tensor.data = ...`): a view of it taken before (DDP's buckets are views) "
                "still holds the rank's own values — reduce into the tensor in place "
                "(tensor.copy_(...), or work on its chunks)")
    return None


def _wrong_values(rank: int, case: dict, inputs: List, exact, tolerance):
    import torch

    got, shape = case["got"], tuple(case["shape"])
    if got.shape != exact.shape:
        return f"rank {rank}: the tensor of shape {shape} came back with shape {tuple(got.shape)}"
    gap = (got.double() - exact).abs()
    if float((gap - tolerance).max()) <= 0:
        return None
    where = (f"rank {rank}, shape {shape}: your result differs from the sum by "
             f"{float(gap.max()):.3g}")
    if torch.equal(got, case["given"]):
        return where + ": the tensor was not changed — reduce it in place"
    return where + _chunk_diagnosis(rank, got, inputs, case["sent"])


def _chunk_diagnosis(rank: int, got, inputs: List, sent: List[int]) -> str:
    """What each chunk of the learner's result holds, as a sum of the ranks' chunks."""
    n = len(inputs)
    chunks = _split(got, n)
    parts = [_split(x, n) for x in inputs]
    found = [_combination([p[c] for p in parts], chunks[c]) for c in range(n)]
    full = [c for c, weights in enumerate(found) if weights == (1,) * n]
    steps = (f" (rank {rank} sent {len(sent)} messages; a ring of {n} sends 2(n-1) = "
             f"{2 * (n - 1)})" if len(sent) != 2 * (n - 1) else "")
    if len(full) == 1 and all(w is not None and sum(w) < n for c, w in enumerate(found)
                              if c not in full and chunks[c].numel()):
        return (f": only chunk {full[0]} holds the sum — each rank ends the reduce-scatter "
                "with one complete chunk; the all-gather must pass them round")
    for c, weights in enumerate(found):
        if weights is None or weights == (1,) * n or not chunks[c].numel():
            continue
        if max(weights) > 1:
            twice = [r for r, w in enumerate(weights) if w > 1]
            return (f": chunk {c} counts rank {twice[0]}'s values twice — in the all-gather a "
                    "rank copies the summed chunk it receives; it does not add it")
        holds = [r for r, w in enumerate(weights) if w]
        missing = [r for r, w in enumerate(weights) if not w]
        return (f": chunk {c} holds the sum of rank(s) {holds} only, without {missing} — in "
                "the reduce-scatter each chunk collects every rank's values over the n - 1 "
                "steps (at step s rank r sends chunk (r - s) % n and adds the one it receives "
                "into chunk (r - s - 1) % n); the all-gather then passes on completed chunks "
                f"only, starting with chunk (r + 1) % n{steps}")
    sums = _split(sum(x.double() for x in inputs), n)
    for c in range(n):
        if found[c] is None and any(sums[d].shape == chunks[c].shape and d != c and bool(
                (sums[d] - chunks[c].double()).abs().max() < 1e-4) for d in range(n)):
            return (f": chunk {c} holds another chunk's sum — the all-gather starts with the "
                    "chunk it completed, (r + 1) % n, and writes each chunk where it came from")
    return steps


def _split(tensor, n: int):
    import torch

    return torch.tensor_split(tensor.reshape(-1), n)


def _combination(parts: List, got):
    """The weights (0, 1 or 2 per rank) whose sum of the ranks' chunks is ``got``."""
    import itertools

    if not got.numel():
        return (1,) * len(parts)
    for weights in itertools.product((1, 0, 2), repeat=len(parts)):
        total = sum(w * p.double() for w, p in zip(weights, parts))
        scale = sum(p.double().abs() for p in parts)
        if bool(((total - got.double()).abs() <= 4 * gamma(len(parts)) * scale + 1e-30).all()):
            return tuple(weights)
    return None


def _wrong_traffic(rank: int, case: dict, n: int):
    numel = math.prod(case["shape"])
    chunk = math.ceil(numel / n)
    sent = case["sent"]
    if not sent:
        return f"rank {rank} sent no message: use dist.send/dist.isend around the ring"
    if max(sent) > chunk:
        return (f"rank {rank} sent a message of {max(sent)} elements for a tensor of {numel} at "
                f"{n} ranks: a ring sends chunks of 1/n of it (at most {chunk} here), so that "
                "every link carries the same share")
    if len(sent) != 2 * (n - 1):
        return (f"rank {rank} sent {len(sent)} messages at {n} ranks; a ring all-reduce sends "
                f"2(n-1) = {2 * (n - 1)}: n-1 in the reduce-scatter, n-1 in the all-gather")
    return None


def _not_a_ring(cases: List[dict]):
    """Every rank sends to one neighbour and receives from the rank that sends to it, and
    these links close one cycle through all n ranks: a ring (turned either way), not
    messages sent straight to where each chunk ends."""
    n = len(cases)
    right = {}
    for rank, case in enumerate(cases):
        peers = sorted(set(case["to"]), key=str)
        if len(peers) != 1:
            return (f"rank {rank} sent to ranks {peers}: in a ring every rank sends only to its "
                    f"neighbour, (r + 1) % n = {(rank + 1) % n} — each chunk travels round the "
                    "ring, one link a step, and every link carries the same traffic")
        right[rank] = peers[0]
    rank, visited = 0, set()
    while rank not in visited:
        visited.add(rank)
        rank = right[rank]
    if len(visited) != n or rank != 0:
        links = ", ".join(f"{r} → {right[r]}" for r in range(n))
        return (f"your sends ({links}) do not close one ring through all {n} ranks: rank r "
                "sends to (r + 1) % n and receives from (r - 1) % n")
    for rank, case in enumerate(cases):
        left = next(r for r in range(n) if right[r] == rank)
        strangers = sorted({src for src in case["from"] if src is not None and src != left})
        if strangers:
            return (f"rank {rank} received from ranks {strangers}, but only rank {left} sends to "
                    "it: in a ring a rank receives from its other neighbour only")
    return None


# ---------------------------------------------------------------- 09.buckets

BUCKET_STATEMENT = """\
**Put gradients into DDP's buckets.**

Write `ddp_buckets(grad_bytes, first_cap, cap)`. `grad_bytes` lists the sizes (bytes) of
the gradients in the order backward makes them ready. DDP fills a bucket with them in
that order and closes it as soon as its size reaches the cap (a gradient is never split,
so a bucket may go over the cap); the first bucket has cap `first_cap`, every later one
`cap`; the last bucket holds what is left. Return the buckets as lists of indices into
`grad_bytes` (left as it was). The checker compares with the function
DistributedDataParallel itself calls on several cases — the sizes of kosmoss's MLP
among them, a bucket that reaches its cap exactly, a gradient larger than any cap —
without calling it from your cell.
"""

BUCKET_SKELETON = """
def ddp_buckets(grad_bytes, first_cap, cap):
    \"\"\"Lists of indices into grad_bytes, one per bucket, in order.\"\"\"
    raise NotImplementedError("your code here")
"""

BUCKET_REFERENCE = """
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
"""


def _buckets(close: str = "size >= limit", limit: str = "cap",
             order: str = "enumerate(grad_bytes)",
             leftover: str = "if current:\n        buckets.append(current)\n") -> str:
    """A bucketing like the reference, one piece changed."""
    return f"""
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in {order}:
        current.append(index)
        size += nbytes
        if {close}:
            buckets.append(current)
            current, size, limit = [], 0, {limit}
    {leftover}    return buckets
"""


BUCKET_WRONG = {
    "never over the cap": Mistake("""
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
""", "DDP closes a bucket once it *reaches* the cap"),
    "one cap for every bucket": Mistake("""
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
""", "the first bucket has its own cap, first_cap"),
    "closes past the cap, not at it": Mistake(_buckets(close="size > limit"),
                                              "as soon as its size reaches the cap"),
    "forgets the last bucket": Mistake(_buckets(leftover=""), "holds what is left"),
    "first_cap for every bucket": Mistake(_buckets(limit="first_cap"),
                                          "every later bucket has the cap `cap`"),
    "reverses the order": Mistake(_buckets(order="reversed(list(enumerate(grad_bytes)))"),
                                  "already in the order backward makes them ready"),
    "the sizes, not the indices": Mistake(_buckets(order="zip(grad_bytes, grad_bytes)"),
                                          "return indices into grad_bytes"),
    "indices counted from 1": Mistake(_buckets(order="enumerate(grad_bytes, start=1)"),
                                      "(0 to len - 1)"),
}

MIB = 2 ** 20
# kosmoss's MLP in backward's order (last layer first; bias, then weight), float32 bytes.
MLP_READY_ORDER = (552 * 4, 100 * 552 * 4, 100 * 4, 100 * 100 * 4, 100 * 4, 100 * 100 * 4,
                   100 * 4, 4128 * 100 * 4)
BUCKET_CASES = ((MLP_READY_ORDER, MIB, 25 * MIB), (MLP_READY_ORDER, MIB // 4, MIB // 4),
                ((100,) * 10, 150, 300), ((600, 100, 100, 100, 100), 500, 500),
                ((4000, 4000, 4000), 1000, 6000), ((12, 20, 28, 40), 24, 1000),
                ((100, 100, 100, 100), 200, 200), ((8000, 40, 40), 100, 100),
                ((40, 80, 120, 160, 200), 400, 100))


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
        given = list(grad_bytes)
        got = mine(given, first_cap, cap)
        if given != list(grad_bytes):
            return failed(f"for gradients of {list(grad_bytes)} bytes your ddp_buckets left the "
                          f"caller's list as {given}: read grad_bytes, do not consume it (pop, "
                          "del, sort in place) — DDP reads those sizes again")
        try:
            got = [[int(i) for i in bucket] for bucket in got]
        except (TypeError, ValueError):
            return failed(f"ddp_buckets returned {got!r}: return a list of lists of indices")
        if sorted(i for bucket in got for i in bucket) != list(range(len(grad_bytes))) and \
                not all(0 <= i < len(grad_bytes) for bucket in got for i in bucket):
            return failed(f"for gradients of {list(grad_bytes)} bytes yours {got}: return "
                          "indices into grad_bytes (0 to len - 1), each once, not sizes")
        if got != expected:
            return failed(f"for gradients of {list(grad_bytes)} bytes, first cap {first_cap}, "
                          f"cap {cap}: yours {got}, DDP's {expected}"
                          + _bucket_hint(got, expected, grad_bytes, first_cap, cap))
    return passed(f"your buckets equal DDP's in {len(BUCKET_CASES)} cases, kosmoss's MLP "
                  "with the default and with a 0.25 MiB cap among them")


def _bucket_hint(got, expected, grad_bytes, first_cap: int, cap: int) -> str:
    if [] in got:
        return (" — every bucket holds at least one gradient: when the last gradient closes "
                "a bucket, append nothing after the loop")
    seen = sorted(i for bucket in got for i in bucket)
    if seen != list(range(len(grad_bytes))) and seen == sorted(
            i for bucket in expected[:-1] for i in bucket):
        return " — the last bucket holds what is left, even under the cap"
    if got == torch_buckets(grad_bytes, cap, cap):
        return " — the first bucket has its own cap, first_cap"
    if got == torch_buckets(grad_bytes, first_cap, first_cap):
        return " — only the first bucket has first_cap: every later bucket has the cap `cap`"
    last = len(grad_bytes) - 1
    if got == [[last - i for i in bucket] for bucket in torch_buckets(
            list(reversed(grad_bytes)), first_cap, cap)]:
        return (" — grad_bytes is already in the order backward makes them ready: fill the "
                "buckets in that order")
    if got == torch_buckets([nbytes // 4 for nbytes in grad_bytes], first_cap, cap):
        return (" — grad_bytes and the caps are both in bytes: compare them as they are, not "
                "divided by a float32's 4 bytes")
    sizes = [sum(grad_bytes[i] for i in bucket) for bucket in got]
    caps = [first_cap] + [cap] * len(got)
    # the first bucket that differs from DDP's, closed by first_cap though it is a later one
    differ = next((k for k, (mine, ddp) in enumerate(zip(got, expected)) if mine != ddp), 0)
    if 0 < differ < len(got) - 1 and first_cap <= sizes[differ] < cap:
        return " — only the first bucket has first_cap: every later bucket has the cap `cap`"
    if any(size == limit for size, limit in zip(sizes, caps)) or any(
            size > limit and len(bucket) > 1 and size - grad_bytes[bucket[-1]] >= limit
            for size, limit, bucket in zip(sizes, caps, got)):
        return (" — DDP closes a bucket as soon as its size reaches the cap (>=): a bucket "
                "that reaches it exactly is closed")
    if all(size <= limit for size, limit, bucket in zip(sizes, caps, got) if len(bucket) > 1):
        return (" — DDP closes a bucket once it *reaches* the cap, with the gradient that "
                "made it go over inside")
    return ""


EXERCISES = [
    Exercise("09.ring_all_reduce", RING_STATEMENT, RING_SKELETON, RING_REFERENCE, RING_WRONG,
             ring_judge, rank_task=ring_rank_task, names=("ring_all_reduce",)),
    Exercise("09.buckets", BUCKET_STATEMENT, BUCKET_SKELETON, BUCKET_REFERENCE, BUCKET_WRONG,
             bucket_judge, names=("ddp_buckets",),
             forbidden=(bucket_assignment_function, "kosmoss.run", "kosmoss.scaling",
                        "torch.nn.parallel")),
]
