"""The DDP-metrics lab: reduce a validation loss exactly over ranks with uneven shares
(in 2 gloo processes), and count what DistributedSampler pads with.

    kosmoss check metrics
"""
from __future__ import annotations

from typing import List

from .core import Exercise, failed, learner, passed

NOTEBOOK_GLOB = "*metrics*"  # the lab's notebook: its file name contains "metrics"
SHARES = (5, 3)  # samples on rank 0 and rank 1: uneven, as the last batch of a split is
TOLERANCE = 1e-6


# ---------------------------------------------------------------- metrics.exact_val_loss

EXACT_STATEMENT = """\
**Reduce a validation loss exactly over ranks with uneven shares.**

Write `exact_val_loss(losses)`. On every rank, `losses` is a one-dimensional tensor of
the per-sample losses of that rank's share of the validation split — and the shares
need not be equal. Return the mean over *every* sample of *every* rank (a float or a
zero-dimensional tensor), the same on all ranks: the loss one process would compute on
the whole split. Use `torch.distributed.all_reduce`. The checker runs your cell in two
gloo processes, the first holding five samples and the second three, and compares with
the single-process mean (to `1e-6`, relative).
"""

EXACT_SKELETON = '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    """The mean of every rank's per-sample losses, the same on every rank."""
    raise NotImplementedError("your code here")
'''

EXACT_REFERENCE = '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    # Sums and counts add up over ranks; means do not when the shares differ.
    totals = torch.stack([losses.sum(), torch.tensor(float(losses.numel()))]).double()
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals[0] / totals[1]
'''

EXACT_WRONG = {
    "mean of the ranks' means (what sync_dist=True does)": '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    mean = losses.mean()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    return mean / dist.get_world_size()
''',
    "this rank's mean only": '''
def exact_val_loss(losses):
    return losses.mean()
''',
}


def _losses(rank: int):
    """Per-sample losses spread over two orders of magnitude, split 5 / 3."""
    import torch

    generator = torch.Generator().manual_seed(7)
    every = torch.rand(sum(SHARES), generator=generator) * 10 ** torch.linspace(-1, 1, 8)
    start = sum(SHARES[:rank])
    return every, every[start:start + SHARES[rank]].clone()


def exact_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    every, mine = _losses(rank)
    got = learner(namespace, "exact_val_loss")(mine)
    value = float(got.item() if hasattr(got, "item") else got)
    return {"got": value, "expected": float(every.double().mean()),
            "local_mean": float(mine.double().mean()), "local_sum": float(mine.double().sum()),
            "samples": mine.numel()}


def exact_judge(ranks: List[dict]) -> tuple:
    expected = ranks[0]["expected"]
    values = [r["got"] for r in ranks]
    if abs(values[0] - values[1]) > TOLERANCE * max(1.0, abs(values[0])):
        return failed(f"rank 0 returns {values[0]:.6g} and rank 1 {values[1]:.6g}: every rank "
                      "must return the same loss — it was not reduced over the ranks")
    gap = abs(values[0] - expected) / abs(expected)
    if gap > TOLERANCE:
        return failed(f"your loss {values[0]:.6g} differs from the single-process loss "
                      f"{expected:.6g} by {gap:.1e} (relative)" + _why(values[0], ranks))
    return passed(f"{values[0]:.6g} on both ranks (5 and 3 samples) equals the single-process "
                  f"loss to {gap:.0e}")


def _why(value: float, ranks: List[dict]) -> str:
    def near(x):
        return abs(value - x) <= 1e-5 * max(1.0, abs(x))

    means = [r["local_mean"] for r in ranks]
    if near(sum(means) / len(means)):
        return (f": it is the average of the ranks' means — with {SHARES[0]} and {SHARES[1]} "
                "samples they do not weigh the same; all-reduce the sum and the count")
    if near(sum(r["local_sum"] for r in ranks)):
        return ": it is the sum over every sample — divide by the total count"
    return ""


# ---------------------------------------------------------------- metrics.padding

PADDING_STATEMENT = """\
**Count the samples `DistributedSampler` serves twice.**

Write `padded_duplicates(n_samples, world_size)`: how many extra, repeated samples
`torch.utils.data.DistributedSampler` (with its default `drop_last=False`) adds so that
every rank gets the same number — samples a validation metric then counts twice. The
checker measures it by running the sampler on every rank for a range of sizes.
"""

PADDING_SKELETON = '''
def padded_duplicates(n_samples, world_size):
    """Extra (repeated) samples DistributedSampler serves over all ranks."""
    raise NotImplementedError("your code here")
'''

PADDING_REFERENCE = '''
import math


def padded_duplicates(n_samples, world_size):
    return math.ceil(n_samples / world_size) * world_size - n_samples
'''

PADDING_WRONG = {
    "the remainder, not the padding": '''
def padded_duplicates(n_samples, world_size):
    return n_samples % world_size
''',
}

PADDING_CASES = ((10, 4), (8, 2), (7, 3), (5, 8), (100, 7), (1001, 2))


def served(n_samples: int, world_size: int) -> int:
    """Samples the sampler hands out over all ranks: measured, not computed."""
    from torch.utils.data import DistributedSampler

    return sum(len(list(DistributedSampler(range(n_samples), num_replicas=world_size,
                                           rank=rank, shuffle=False)))
               for rank in range(world_size))


def padding_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "padded_duplicates")
    for n_samples, world_size in PADDING_CASES:
        expected = served(n_samples, world_size) - n_samples
        got = mine(n_samples, world_size)
        if got != expected:
            return failed(f"for {n_samples} samples on {world_size} ranks yours says {got!r}; "
                          f"the sampler serves {n_samples + expected}, so {expected} repeated")
    return passed(f"matches what DistributedSampler served in {len(PADDING_CASES)} set-ups")


EXERCISES = [
    Exercise("metrics.exact_val_loss", EXACT_STATEMENT, EXACT_SKELETON, EXACT_REFERENCE,
             EXACT_WRONG, exact_judge, rank_task=exact_rank_task, names=("exact_val_loss",)),
    Exercise("metrics.padding", PADDING_STATEMENT, PADDING_SKELETON, PADDING_REFERENCE,
             PADDING_WRONG, padding_judge, names=("padded_duplicates",)),
]
