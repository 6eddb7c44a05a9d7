"""Lesson 10 (when it hangs or crashes): reduce a dict of statistics whose keys the ranks
hold in different orders (in 2 gloo processes); name the straggler from the ranks'
heartbeats, as ``kosmoss watch`` does.

    kosmoss check 10
"""
from __future__ import annotations

import math
from typing import List

from .core import Exercise, failed, learner, passed

# ---------------------------------------------------------------- 10.sum_stats

SUM_STATEMENT = """\
**All-reduce a dict of statistics whose keys the ranks hold in different orders.**

Write `sum_stats(stats)`. On every rank, `stats` is a dict from a name to a float
(`"loss_sum"`, `"samples"`, ...): the same names on every rank, but not inserted in the
same order (each rank built its dict as its batches came). Return a dict with the same
names, each value summed over all ranks, the same on every rank. Use
`torch.distributed.all_reduce`. Every collective matches the call with the same position
on the other ranks, whatever tensor it was given: the ranks must call them in an order
they all agree on. The checker runs your cell in two gloo processes whose dicts hold the
names in different orders.
"""

SUM_SKELETON = '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    """{name: value summed over all ranks}, the same on every rank."""
    raise NotImplementedError("your code here")
'''

SUM_REFERENCE = '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)  # one order on every rank, whatever order the dict was built in
    values = torch.tensor([float(stats[name]) for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
'''

SUM_WRONG = {
    "the dict's own order": '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    summed = {}
    for name, value in stats.items():
        tensor = torch.tensor(float(value), dtype=torch.float64)
        dist.all_reduce(tensor)
        summed[name] = tensor.item()
    return summed
''',
    "one tensor in the dict's order": '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    values = torch.tensor(list(stats.values()), dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(stats, values.tolist()))
''',
}

STATS = ({"loss_sum": 12.5, "samples": 40.0, "correct": 31.0, "batches": 5.0},
         {"loss_sum": 7.25, "samples": 24.0, "correct": 17.0, "batches": 3.0})


def sum_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    names = list(STATS[rank])
    order = names if rank == 0 else names[::-1]  # the ranks' dicts in different orders
    stats = {name: STATS[rank][name] for name in order}
    got = learner(namespace, "sum_stats")(dict(stats))
    return {"got": {str(k): float(v) for k, v in dict(got).items()}, "order": order}


def sum_judge(ranks: List[dict]) -> tuple:
    expected = {name: sum(stats[name] for stats in STATS) for name in STATS[0]}
    for rank, result in enumerate(ranks):
        got = result["got"]
        if set(got) != set(expected):
            return failed(f"rank {rank} returned the names {sorted(got)}, expected "
                          f"{sorted(expected)}")
        for name, value in expected.items():
            if not math.isclose(got[name], value, rel_tol=1e-9):
                return failed(f"rank {rank}: {name!r} came out {got[name]:g}"
                              + _mixed(rank, name, got[name], ranks)
                              + f" (the sum over the ranks is {value:g})")
    return passed(f"every name summed right on both ranks, whose dicts held them in the "
                  f"orders {ranks[0]['order']} and {ranks[1]['order']}")


def _mixed(rank: int, name: str, value: float, ranks: List[dict]) -> str:
    """Name the other rank's entry this one was summed with, if that explains it."""
    other = 1 - rank
    for partner in STATS[other]:
        if math.isclose(STATS[rank][name] + STATS[other][partner], value, rel_tol=1e-9):
            return (f" = its {STATS[rank][name]:g} + rank {other}'s {partner!r}: the ranks "
                    f"reduced their entries in different orders ({ranks[rank]['order']} against "
                    f"{ranks[other]['order']}), and each all_reduce matched whatever the other "
                    "rank called at the same position; agree on one order (sorted names)")
    return ""


# ---------------------------------------------------------------- 10.stragglers

STRAGGLER_STATEMENT = """\
**Name the straggler from the ranks' heartbeats.**

Write `stragglers(busy_ms, wait_ms)`: two lists, one number per rank, of what each rank's
heartbeat says about its last steps — `busy_ms`, its own work per step (loading,
forward, optimizer), and `wait_ms`, the time it spent in backward, where DDP's all-reduce
waits for the slowest rank. Return the sorted list of the ranks that hold the others
back, by `kosmoss watch`'s rule: a rank is a straggler when its own work per step is
larger than the median of the *other* ranks' by more than `30` percent *and* by at least
`2` ms (smaller gaps are timer noise). Under DDP every rank makes the same number of
steps per second, so step rates cannot tell. The checker compares with `kosmoss watch`'s
own code on several sets of ranks.
"""

STRAGGLER_SKELETON = '''
def stragglers(busy_ms, wait_ms):
    """Sorted ranks whose own work per step holds the others back."""
    raise NotImplementedError("your code here")
'''

STRAGGLER_REFERENCE = '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = statistics.median(busy_ms[:rank] + busy_ms[rank + 1:])
        if mine > others * 1.3 and mine - others >= 2:
            slow.append(rank)
    return slow
'''

STRAGGLER_WRONG = {
    "the rank that waits most": '''
def stragglers(busy_ms, wait_ms):
    return [wait_ms.index(max(wait_ms))]
''',
    "the slowest step, busy + wait": '''
def stragglers(busy_ms, wait_ms):
    steps = [b + w for b, w in zip(busy_ms, wait_ms)]
    return [steps.index(max(steps))]
''',
    "no noise floor": '''
import statistics


def stragglers(busy_ms, wait_ms):
    return [r for r, mine in enumerate(busy_ms)
            if mine > statistics.median(busy_ms[:r] + busy_ms[r + 1:]) * 1.3]
''',
}

# (busy, wait) per rank: what heartbeats said in lesson 10's runs and in shapes like them.
STRAGGLER_CASES = (
    ((2.4, 42.9), (42.2, 1.5)),  # lesson 10: rank 1 sleeps 40 ms per step
    ((3.1, 3.0, 3.3, 3.2), (1.0, 1.1, 0.9, 1.0)),  # nobody
    ((3.0, 3.1, 12.0, 3.2, 2.9, 3.0, 11.5, 3.1), (9.0, 9.1, 0.4, 9.0, 9.2, 9.0, 0.9, 9.1)),
    ((1.0, 1.6), (0.6, 0.1)),  # 60 % more, but 0.6 ms: noise
    ((40.0, 41.0, 39.5), (30.0, 29.0, 30.5)),  # all slow alike: nobody stands out
)


def kosmoss_stragglers(busy, wait) -> List[int]:
    """What ``kosmoss watch`` flags for these heartbeats (its own rule, run here)."""
    from ..diagnose.watch import DEFAULT_STALE_S, DEFAULT_THRESHOLD, RankView, _flag_stragglers

    views = [RankView(rank=r, pid=None, label=f"rank {r}", state="train", busy_ms=b, wait_ms=w,
                      heartbeat_age_s=0.5) for r, (b, w) in enumerate(zip(busy, wait))]
    _flag_stragglers(views, DEFAULT_THRESHOLD, DEFAULT_STALE_S)
    return [view.rank for view in views if view.straggler]


def straggler_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "stragglers")
    for busy, wait in STRAGGLER_CASES:
        expected = kosmoss_stragglers(busy, wait)
        got = mine(list(busy), list(wait))
        try:
            got = sorted(int(rank) for rank in got)
        except TypeError:
            return failed(f"stragglers returned {got!r}: return a list of ranks")
        if got != expected:
            return failed(f"busy {list(busy)} ms and wait {list(wait)} ms per step: yours "
                          f"{got}, kosmoss watch flags {expected}"
                          + _straggler_hint(got, expected, busy, wait))
    return passed(f"the same ranks as kosmoss watch in {len(STRAGGLER_CASES)} sets of heartbeats")


def _straggler_hint(got, expected, busy, wait) -> str:
    if got and all(wait[r] == max(wait) for r in got):
        return (" — the rank that waits longest is the fast one: it waits in the all-reduce "
                "for the straggler; look at each rank's own work")
    if not expected and got:
        return " — a gap under 2 ms, or every rank as slow, flags nobody"
    return ""


EXERCISES = [
    Exercise("10.sum_stats", SUM_STATEMENT, SUM_SKELETON, SUM_REFERENCE, SUM_WRONG, sum_judge,
             rank_task=sum_rank_task, names=("sum_stats",)),
    Exercise("10.stragglers", STRAGGLER_STATEMENT, STRAGGLER_SKELETON, STRAGGLER_REFERENCE,
             STRAGGLER_WRONG, straggler_judge, names=("stragglers",)),
]
