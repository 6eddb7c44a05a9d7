"""Lesson 10 (when it hangs or crashes): reduce a dict of statistics whose keys the ranks
hold in different orders (at 2, 3 and 4 gloo processes); name the straggler from the ranks'
heartbeats, as ``kosmoss watch`` does.

    kosmoss check 10
"""
from __future__ import annotations

import itertools
import statistics
from typing import List

from .core import (TENSOR_HINT, Exercise, LearnerRaised, Mistake, failed, is_tensor, learner,
                   passed)

# ---------------------------------------------------------------- 10.sum_stats

SUM_STATEMENT = """\
**All-reduce a dict of statistics whose keys the ranks hold in different orders.**

Write `sum_stats(stats)`. On every rank, `stats` is a dict from a name to a float
(`"loss_sum"`, `"samples"`, ...): the same names on every rank, but not inserted in the
same order (each rank built its dict as its batches came). Return a new dict with the
same names, each value a Python float summed over all ranks, the same on every rank
(`stats` left as it was). Use `torch.distributed.all_reduce`. Every collective matches
the call with the same position on the other ranks, whatever tensor it was given: the
ranks must call them in an order they all agree on. The checker runs your cell at 2, 3
and 4 gloo processes, each rank's dict in another order; the values are multiples of
`1/8`, so every sum is exact in float32 and float64, and the checker compares exactly.
"""

SUM_SKELETON = """
import torch
import torch.distributed as dist


def sum_stats(stats):
    \"\"\"{name: value summed over all ranks}, the same on every rank.\"\"\"
    raise NotImplementedError("your code here")
"""

SUM_REFERENCE = """
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)  # one order on every rank, whatever order the dict was built in
    values = torch.tensor([float(stats[name]) for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
"""

SUM_WRONG = {
    "the dict's own order": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    summed = {}
    for name, value in stats.items():
        tensor = torch.tensor(float(value), dtype=torch.float64)
        dist.all_reduce(tensor)
        summed[name] = tensor.item()
    return summed
""", "reduced their entries in different orders"),
    "one tensor in the dict's order": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    values = torch.tensor(list(stats.values()), dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(stats, values.tolist()))
""", "agree on one order (sorted names)"),
    "ordered by value": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats, key=stats.get)
    values = torch.tensor([stats[name] for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
""", "agree on one order (sorted names)"),
    "the mean, not the sum": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[name] for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, (values / dist.get_world_size()).tolist()))
""", "summed, not averaged"),
    "integer values": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([int(stats[name]) for name in names])
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
""", "fractions"),
    "tensors for values": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[name] for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values))
""", "a tensor, not a Python number"),
    "reduce to rank 0 only": Mistake("""
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[name] for name in names], dtype=torch.float64)
    dist.reduce(values, dst=0)
    return dict(zip(names, values.tolist()))
""", "the same on every rank"),
}

# Counts past 2048 on rank 0: a 16-bit float rounds them (4097 is 4096 in float16).
# "samples" and "seconds" share a first letter: names ordered by it alone (a key of
# item[0], the habit of sorting .items()) keep each rank's insertion order for the two.
STATS = ({"loss_sum": 12.5, "samples": 4097.0, "correct": 3041.0, "batches": 5.0,
          "seconds": 1.5},
         {"loss_sum": 30.5, "samples": 24.0, "correct": 17.0, "batches": 3.0, "seconds": 0.25},
         {"loss_sum": 3.125, "samples": 16.0, "correct": 9.0, "batches": 2.0, "seconds": 2.0},
         {"loss_sum": 0.375, "samples": 8.0, "correct": 6.0, "batches": 1.0, "seconds": 0.75})


def _order(rank: int) -> List[str]:
    """Rank r's insertion order: rank 0 the table's, the others each another one."""
    names = list(STATS[0])
    shift = rank % len(names)
    rotated = names[shift:] + names[:shift]
    return rotated if rank % 2 == 0 else rotated[::-1]


def sum_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    stats = {name: STATS[rank][name] for name in _order(rank)}
    given = dict(stats)
    got = learner(namespace, "sum_stats")(given)
    got = dict(got)
    odd = {str(k): v for k, v in got.items()
           if isinstance(v, bool) or not isinstance(v, (int, float))}
    return {"got": {str(k): float(v) for k, v in got.items()}, "order": _order(rank),
            "changed_input": given != stats,
            "not_floats": {k: repr(v) for k, v in odd.items()},
            "tensors": sorted(k for k, v in odd.items() if is_tensor(v))}


def sum_judge(ranks: List[dict]) -> tuple:
    n = len(ranks)
    expected = {name: sum(STATS[r][name] for r in range(n)) for name in STATS[0]}
    for rank, result in enumerate(ranks):
        got = result["got"]
        if set(got) != set(expected):
            return failed(f"rank {rank} returned the names {sorted(got)}, expected "
                          f"{sorted(expected)}")
        for name, value in expected.items():
            if got[name] != value:  # dyadic values: every sum is exact
                return failed(f"rank {rank}: {name!r} came out {got[name]:g}"
                              + _sum_hint(rank, name, got[name], ranks)
                              + f" (the sum over the ranks is {value:g})")
    for rank, result in enumerate(ranks):
        if result["not_floats"]:
            name, shown = next(iter(result["not_floats"].items()))
            return failed(f"the right sums, but rank {rank}'s {name!r} is {shown}: "
                          f"{TENSOR_HINT if name in result['tensors'] else _NOT_FLOAT}")
    if any(result.get("changed_input") for result in ranks):
        return failed("the right sums, but written into the caller's stats: return a new dict "
                      "— a caller that adds this rank's next batches to its stats and reduces "
                      "again would count the other ranks' totals again")
    return passed(f"every name summed exactly on all {n} ranks, whose dicts held them in "
                  f"{n} different orders")


_NOT_FLOAT = "return Python floats (float(...) or .tolist()), which every logger and json take"


def _partners(rank: int, name: str, value: float, n: int):
    """The other ranks' entries this one was summed with, if the value is such a sum."""
    names = list(STATS[0])
    for choice in itertools.product(names, repeat=n - 1):
        mixed = list(choice[:rank]) + [name] + list(choice[rank:])
        if mixed != [name] * n and value == sum(STATS[r][mixed[r]] for r in range(n)):
            return mixed
    return None


def _sum_hint(rank: int, name: str, value: float, ranks: List[dict]) -> str:
    n = len(ranks)
    mixed = _partners(rank, name, value, n)
    if mixed:
        partners = ", ".join(f"rank {r}'s {mixed[r]!r}" for r in range(n) if r != rank)
        return (f" = its {STATS[rank][name]:g} + {partners}: the ranks reduced their entries "
                "in different orders, and each all_reduce matched whatever the other ranks "
                "called at the same position; agree on one order (sorted names)")
    if any(ranks[r]["got"][name] != value for r in range(n)):
        return (" on this rank and something else on another: the result must be the same on "
                "every rank")
    total = sum(STATS[r][name] for r in range(n))
    if value == total / n:
        return ": the mean over the ranks — the statistics are summed, not averaged"
    if value == sum(int(STATS[r][name]) for r in range(n)):
        return ": the fractions were cut off — keep the values as floats"
    if abs(value - total) <= abs(total) * 2 ** -6:
        return (": off by a rounding — a 16-bit float (float16, bfloat16) holds integers "
                "exactly only up to 2048 or 256; sum in float32 or float64")
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
`2` ms (smaller gaps are timer noise); a rank alone, with no others, is none. Under DDP
every rank makes the same number of steps per second, so step rates cannot tell. The
checker compares with `kosmoss watch`'s own code on several sets of ranks, two
stragglers, both thresholds met exactly and a world of one among them.
"""

STRAGGLER_SKELETON = """
def stragglers(busy_ms, wait_ms):
    \"\"\"Sorted ranks whose own work per step holds the others back.\"\"\"
    raise NotImplementedError("your code here")
"""

STRAGGLER_REFERENCE = """
import statistics


def stragglers(busy_ms, wait_ms):
    if len(busy_ms) < 2:  # no other ranks: nobody to hold back (and no median)
        return []
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = statistics.median(busy_ms[:rank] + busy_ms[rank + 1:])
        if mine > others * 1.3 and mine - others >= 2:
            slow.append(rank)
    return slow
"""


def _rule(typical: str = "statistics.median(busy_ms[:r] + busy_ms[r + 1:])",
          test: str = "mine > others * 1.3 and mine - others >= 2") -> str:
    return f"""
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for r, mine in enumerate(busy_ms):
        others = {typical}
        if {test}:
            slow.append(r)
    return slow
"""


STRAGGLER_WRONG = {
    "the rank that waits most": Mistake("""
def stragglers(busy_ms, wait_ms):
    return [wait_ms.index(max(wait_ms))]
""", "the rank that waits longest is the fast one"),
    "the slowest step, busy + wait": Mistake("""
def stragglers(busy_ms, wait_ms):
    steps = [b + w for b, w in zip(busy_ms, wait_ms)]
    return [steps.index(max(steps))]
""", "the rank that waits longest is the fast one"),
    "no noise floor": Mistake(_rule(test="mine > others * 1.3"), "a gap under 2 ms"),
    "the median of every rank, itself included": Mistake(
        _rule(typical="statistics.median(busy_ms)"), "the median of the *other* ranks"),
    "the mean of the others": Mistake(
        _rule(typical="statistics.mean(busy_ms[:r] + busy_ms[r + 1:])"),
        "the median, not the mean"),
    "30 percent or more": Mistake(
        _rule(test="mine >= others * 1.3 and mine - others >= 2"), "more than 30 percent"),
    "the median of the ranks but the slowest": Mistake("""
import statistics


def stragglers(busy_ms, wait_ms):
    typical = statistics.median(sorted(busy_ms)[:-1])
    return [r for r, mine in enumerate(busy_ms) if mine > typical * 1.3 and mine - typical >= 2]
""", "the slowest included"),
    "the slowest first": Mistake(STRAGGLER_REFERENCE.replace(
        "return slow", "return sorted(slow, key=lambda rank: busy_ms[rank], reverse=True)"),
        "in increasing order"),
    "more than 2 ms": Mistake(
        _rule(test="mine > others * 1.3 and mine - others > 2"), "at least 2 ms"),
}

# (busy, wait) per rank: what heartbeats said in lesson 10's runs and in shapes like them.
STRAGGLER_CASES = (
    ((2.4, 42.9), (42.2, 1.5)),  # lesson 10: rank 1 sleeps 40 ms per step
    ((3.1, 3.0, 3.3, 3.2), (1.0, 1.1, 0.9, 1.0)),  # nobody
    ((3.0, 3.1, 12.0, 3.2, 2.9, 3.0, 11.5, 3.1), (9.0, 9.1, 0.4, 9.0, 9.2, 9.0, 0.9, 9.1)),
    ((1.0, 1.6), (0.6, 0.1)),  # 60 % more, but 0.6 ms: noise
    ((40.0, 41.0, 39.5), (30.0, 29.0, 30.5)),  # all slow alike: nobody stands out
    ((3.0, 3.0, 6.0, 6.0), (4.0, 4.0, 1.0, 1.0)),  # two slow of four: each's others median 3
    ((2.0, 2.0, 2.0, 30.0, 9.0), (28.0, 28.0, 28.0, 0.5, 21.0)),  # a mean would hide rank 4
    ((10.0, 10.0, 13.0), (3.0, 3.0, 0.5)),  # exactly 30 % more: not more than 30 %
    ((5.0, 5.0, 7.0), (2.0, 2.0, 0.5)),  # 40 % more and exactly 2 ms: a straggler
    ((5.0, 10.0, 10.5, 11.0), (6.0, 1.0, 0.5, 0.0)),  # a fast rank is no yardstick
    ((4.0, 9.0, 7.0), (5.0, 0.0, 2.0)),  # two others: their median is their mean
    # three speeds, the slowest last: rank 2 is below its others' median (12 ms), though
    # above that of the ranks but the slowest (6 ms)
    ((20.0, 4.0, 8.0, 4.0, 30.0), (12.0, 27.0, 23.0, 27.0, 1.0)),
    ((45.0,), (0.0,)),  # a world of one: nobody to hold back
    # three slow alike and one fast: each slow rank's others hold two as slow as itself (a
    # rank's others are the other positions, equal values included): nobody
    ((3.0, 10.0, 10.0, 10.0), (7.0, 0.5, 0.5, 0.5)),
    # the straggler does not wait least here (a window's waits are noisy): the rule reads
    # own work alone
    ((3.0, 3.1, 12.0, 3.0), (0.5, 0.4, 0.5, 0.6)),
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
        try:
            returned = mine(list(busy), list(wait))
        except LearnerRaised as err:  # the world of one: statistics.median([]) raises
            if len(busy) > 1:
                raise
            raise LearnerRaised(f"one rank, busy {list(busy)} ms per step: {err}{ALONE}",
                                err.original) from None
        try:
            ranks = [int(rank) for rank in returned]
        except (TypeError, ValueError):
            return failed(f"stragglers returned {returned!r}: return a list of ranks")
        got = sorted(ranks)
        if got != expected:
            return failed(f"busy {list(busy)} ms and wait {list(wait)} ms per step: yours "
                          f"{got}, kosmoss watch flags {expected}"
                          + _straggler_hint(got, expected, busy, wait))
        if not isinstance(returned, (list, tuple)) or ranks != got:
            return failed(f"busy {list(busy)} ms and wait {list(wait)} ms per step: the right "
                          f"ranks, but yours returned {returned!r}: return them as a sorted "
                          "list, in increasing order (sorted(...)), as kosmoss watch lists them")
    return passed(f"the same ranks as kosmoss watch in {len(STRAGGLER_CASES)} sets of heartbeats")


ALONE = (" — a rank alone holds back nobody: with no other ranks there is no median to "
         "compare with, and no straggler (return [])")

# (what a learner may take for the others' median, what they are told)
TYPICAL_MISTAKES = (
    (lambda others: sorted(others)[len(others) // 2],
     " — with an even number of other ranks the median is the mean of the two middle values "
     "(statistics.median), not the upper one"),
    (lambda others: sorted(others)[(len(others) - 1) // 2],
     " — with an even number of other ranks the median is the mean of the two middle values "
     "(statistics.median), not the lower one"),
    (min, " — compare with the median of the other ranks, not the fastest of them: one fast "
          "rank would make every other one a straggler"),
    (lambda others: statistics.mean(others),
     " — the median, not the mean — one very slow rank moves a mean"),
)


def _others_by_value(busy) -> List[int]:
    """The rule with a rank's others taken as the values unequal to its own."""
    flagged = []
    for mine in busy:
        others = [b for b in busy if b != mine]
        typical = statistics.median(others) if others else mine
        flagged.append(mine > typical * 1.3 and mine - typical >= 2)
    return [rank for rank, slow in enumerate(flagged) if slow]


def _flagged(busy, typical) -> List[int]:
    """The ranks kosmoss watch's rule flags when ``typical`` stands for the median."""
    flagged = []
    for rank, mine in enumerate(busy):
        others = typical(busy[:rank] + busy[rank + 1:])
        if mine > others * 1.3 and mine - others >= 2:
            flagged.append(rank)
    return flagged


def _straggler_hint(got, expected, busy, wait) -> str:
    import statistics

    if len(busy) == 1:
        return ALONE
    if got and all(wait[r] == max(wait) for r in got):
        return (" — the rank that waits longest is the fast one: it waits in the all-reduce "
                "for the straggler; look at each rank's own work")
    if got == _others_by_value(busy):
        return (" — a rank's others are the other positions of the list (drop its index, not "
                "its value): ranks as slow as it count among them")
    if len(busy) > 2 and got == _flagged(busy, lambda others: statistics.median(
            sorted(busy)[:-1])):
        return (" — each rank's yardstick is the median of all the *other* ranks, the slowest "
                "included, not one median of every rank but the slowest")
    for typical, hint in TYPICAL_MISTAKES:
        if got == _flagged(busy, typical):
            return hint
    for rank in sorted(set(got) ^ set(expected)):
        others = busy[:rank] + busy[rank + 1:]
        typical, mine = statistics.median(others), busy[rank]
        if mine == typical * 1.3:
            return (f" — rank {rank} is exactly 30 percent above: a straggler is more than 30 "
                    "percent")
        if mine - typical == 2:
            return f" — rank {rank} is exactly 2 ms above: at least 2 ms is enough"
        if mine <= typical:
            return (f" — rank {rank} works {mine:g} ms per step, no more than the median of "
                    f"the other ranks ({typical:g} ms): compare each rank with the median of "
                    "all the others, the slowest included")
        if mine - typical < 2:
            return " — a gap under 2 ms, or every rank as slow, flags nobody"
        if statistics.median(busy) != typical and (mine > statistics.median(busy) * 1.3) != (
                mine > typical * 1.3) or mine - statistics.median(busy) < 2 <= mine - typical:
            return (f" — compare rank {rank} with the median of the *other* ranks: its own "
                    "time pulls a median of every rank towards it")
        if rank in expected:
            return (f" — rank {rank} works {mine:g} ms per step, more than 30 percent and 2 ms "
                    f"above the median of the others ({typical:g} ms): a straggler by the "
                    "rule, whatever the waits say")
        if statistics.mean(others) != typical:
            return f" — rank {rank}: the median, not the mean — one very slow rank moves a mean"
    steps = [b + w for b, w in zip(busy, wait)]
    if got and all(steps[r] == max(steps) for r in got):
        return (" — busy + wait is about the same for every rank under DDP (they wait for "
                "each other): look at each rank's own work")
    return ""


EXERCISES = [
    Exercise("10.sum_stats", SUM_STATEMENT, SUM_SKELETON, SUM_REFERENCE, SUM_WRONG, sum_judge,
             rank_task=sum_rank_task, names=("sum_stats",)),
    Exercise("10.stragglers", STRAGGLER_STATEMENT, STRAGGLER_SKELETON, STRAGGLER_REFERENCE,
             STRAGGLER_WRONG, straggler_judge, names=("stragglers",),
             forbidden=("kosmoss.diagnose",)),
]
