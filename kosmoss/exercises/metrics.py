"""The DDP-metrics lab: reduce a validation loss exactly over ranks with uneven shares
(at 2, 3 and 4 gloo processes), and count what DistributedSampler pads with.

    kosmoss check metrics
"""
from __future__ import annotations

from typing import List

from .core import Exercise, Mistake, failed, is_integer, learner, number_hint, passed
from .tolerance import gamma
from .watch import called

NOTEBOOK_GLOB = "*metrics*"  # the lab's notebook: its file name contains "metrics"
# Samples per rank at each world size: uneven, as the last batch of a split is; at 4 ranks
# one rank's share is empty (a split smaller than the ranks, or cut without padding).
SHARES = {2: (5, 3), 3: (5, 3, 1), 4: (6, 0, 3, 1)}


# ---------------------------------------------------------------- metrics.exact_val_loss

EXACT_STATEMENT = """\
**Reduce a validation loss exactly over ranks with uneven shares.**

Write `exact_val_loss(losses)`. On every rank, `losses` is a one-dimensional float32
tensor of the per-sample losses of that rank's share of the validation split — and the
shares need not be equal; one may even be empty. Return the mean over *every* sample of
*every* rank (a float or a zero-dimensional tensor), the same on all ranks, leaving
`losses` as it was: the loss one process would compute on the whole split. Use
`torch.distributed.all_reduce`. The checker runs your cell at 2, 3 and 4 gloo processes
holding `5 + 3`, `5 + 3 + 1` and `6 + 0 + 3 + 1` samples, and compares with the
single-process mean to float32 rounding.
"""

EXACT_SKELETON = """
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    \"\"\"The mean of every rank's per-sample losses, the same on every rank.\"\"\"
    raise NotImplementedError("your code here")
"""

EXACT_REFERENCE = """
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    # Sums and counts add up over ranks; means do not when the shares differ.
    totals = torch.stack([losses.sum(), torch.tensor(float(losses.numel()))]).double()
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals[0] / totals[1]
"""

EXACT_WRONG = {
    "mean of the ranks' means (what sync_dist=True does)": Mistake("""
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    mean = losses.mean()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    return mean / dist.get_world_size()
""", "average of the ranks' means"),
    "this rank's mean only": Mistake("""
def exact_val_loss(losses):
    return losses.mean()
""", "it was not reduced over the ranks"),
    "the sum, not the mean": Mistake("""
import torch.distributed as dist


def exact_val_loss(losses):
    total = losses.sum()
    dist.all_reduce(total)
    return total
""", "divide by the total count"),
    "equal shares assumed": Mistake("""
import torch.distributed as dist


def exact_val_loss(losses):
    total = losses.sum()
    dist.all_reduce(total)
    return total / (losses.numel() * dist.get_world_size())
""", "this rank's count times the world size"),
    "reduce to rank 0 only": Mistake("""
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    totals = torch.stack([losses.sum(), torch.tensor(float(losses.numel()))])
    dist.reduce(totals, dst=0)
    return totals[0] / totals[1]
""", "it was not reduced over the ranks"),
    "every loss gathered to every rank": Mistake("""
import torch.distributed as dist


def exact_val_loss(losses):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, losses.tolist())
    values = [v for part in gathered for v in part]
    return sum(values) / len(values)
""", "sends every sample's loss to the other ranks"),
}


def _losses(rank: int, world_size: int):
    """Per-sample losses of the whole split, over two orders of magnitude, and this rank's
    share of them."""
    import torch

    shares = SHARES[world_size]
    generator = torch.Generator().manual_seed(7 + world_size)
    every = torch.rand(sum(shares), generator=generator) * 10 ** torch.linspace(
        -1, 1, sum(shares))
    start = sum(shares[:rank])
    return every, every[start:start + shares[rank]].clone()


def exact_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    import torch

    every, mine = _losses(rank, world_size)
    given = mine.clone()  # compared afterwards: the caller's losses must be left as they were
    seen: List[tuple] = []
    with called(SENT, seen, _sent):
        got = learner(namespace, "exact_val_loss")(given)
    value = float(got.item() if hasattr(got, "item") else got)
    local = mine.double()
    return {"got": value, "expected": float(every.double().mean()),
            "local_mean": float(local.mean()) if len(local) else float("nan"),
            "local_sum": float(local.sum()), "samples": mine.numel(),
            "shape": list(got.shape) if isinstance(got, torch.Tensor) else [],
            "changed_input": not torch.equal(given, mine),
            "gathered": [name for name, elements in seen
                         if _every_loss(name, elements, mine.numel(), every.numel())]}


# The collectives through which a cell could send every loss instead of two numbers, and
# the parameter holding what a rank sends, in torch.distributed's signatures.
SENT = {"all_reduce": "tensor", "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
        "all_gather_object": "obj", "gather": "tensor", "gather_object": "obj",
        "broadcast": "tensor", "broadcast_object_list": "object_list"}


def _every_loss(name: str, elements: int, share: int, split: int) -> bool:
    """Whether a collective carried every loss: a gather or broadcast of this rank's share,
    or an all_reduce of a buffer as long as the split (each rank's losses at its offset;
    a count per rank, or a sum and a count per rank, are shorter)."""
    return elements >= (split if name == "all_reduce" else max(share, 3))


def _sent(name: str, arguments: dict) -> int:
    """How many numbers a gather or broadcast sends from this rank: its input's elements
    (a tensor's, or a sequence's length; an object counts one)."""
    sent = arguments.get(SENT[name])
    if name == "broadcast_object_list":
        return sum(_elements(item) for item in sent or [])
    return _elements(sent)


def _elements(value) -> int:
    if hasattr(value, "numel"):
        return int(value.numel())
    return len(value) if isinstance(value, (list, tuple)) else 1


def exact_tolerance(ranks: List[dict]) -> float:
    """Relative: the float32 sum of N non-negative losses, in any order and over the
    ranks (N − 1 additions), the count, and one division — γ_{N+1} (Higham 2002, §4.2)."""
    return gamma(sum(r["samples"] for r in ranks) + 1)


def exact_judge(ranks: List[dict]) -> tuple:
    expected = ranks[0]["expected"]
    values = [r["got"] for r in ranks]
    shares = " + ".join(str(r["samples"]) for r in ranks)
    tolerance = exact_tolerance(ranks)
    if any(abs(v - values[0]) > 2 * tolerance * abs(expected) or v != v for v in values):
        return failed(f"the ranks return {', '.join(f'{v:.6g}' for v in values)}: every rank "
                      "must return the same loss — it was not reduced over the ranks"
                      + _unequal_why(values, ranks))
    gap = abs(values[0] - expected) / abs(expected)
    if not gap <= tolerance:
        return failed(f"your loss {values[0]:.6g} differs from the single-process loss "
                      f"{expected:.6g} by {gap:.1e} (relative; float32 rounding allows "
                      f"{tolerance:.0e})" + _why(values[0], ranks))
    shaped = next((r["shape"] for r in ranks if r.get("shape")), None)
    if shaped:
        return failed(f"the right loss, but as a tensor of shape {tuple(shaped)}: return a float "
                      "or a zero-dimensional tensor (totals[0] / totals[1], not totals[:1] / "
                      "totals[1:]) — a logger or a comparison with a scalar expects one number")
    if any(r.get("changed_input") for r in ranks):
        return failed("the right loss, but your exact_val_loss changed its input losses in "
                      "place (losses /= n, or an all_reduce on losses itself): the caller "
                      "still holds these per-sample losses — reduce a new tensor")
    gathered = sorted({name for r in ranks for name in r.get("gathered", [])})
    if gathered:
        return failed(f"the right loss, but your exact_val_loss sends every sample's loss to "
                      f"the other ranks ({', '.join(gathered)}): a split of a million columns "
                      "would send a million numbers to each — all_reduce two, the sum and the "
                      "count, as the statement asks")
    return passed(f"{values[0]:.6g} on every rank ({shares} samples) equals the single-process "
                  f"loss to {gap:.0e}")


def _near(value: float, x: float) -> bool:
    return abs(value - x) <= 1e-5 * max(1.0, abs(x))


def _why(value: float, ranks: List[dict]) -> str:
    means = [r["local_mean"] for r in ranks]
    if _near(value, sum(means) / len(means)):
        return (": it is the average of the ranks' means — with "
                f"{' and '.join(str(r['samples']) for r in ranks)} samples they do not weigh "
                "the same; all-reduce the sum and the count")
    if _near(value, sum(r["local_sum"] for r in ranks)):
        return ": it is the sum over every sample — divide by the total count"
    return ""


def _unequal_why(values: List[float], ranks: List[dict]) -> str:
    total = sum(r["local_sum"] for r in ranks)
    if all(r["samples"] and _near(v, total / (r["samples"] * len(ranks)))
           for v, r in zip(values, ranks)):
        return (" (each rank divided the total by this rank's count times the world size: "
                "the shares differ; all-reduce the count too)")
    return ""


# ---------------------------------------------------------------- metrics.padding

PADDING_STATEMENT = """\
**Count the samples `DistributedSampler` serves twice.**

Write `padded_duplicates(n_samples, world_size)`: how many extra, repeated samples
`torch.utils.data.DistributedSampler` (with its default `drop_last=False`) adds so that
every rank gets the same number — samples a validation metric then counts twice. The
checker measures it by running the sampler on every rank for a range of sizes: splits
that divide evenly, and splits smaller than the world.
"""

PADDING_SKELETON = """
def padded_duplicates(n_samples, world_size):
    \"\"\"Extra (repeated) samples DistributedSampler serves over all ranks.\"\"\"
    raise NotImplementedError("your code here")
"""

PADDING_REFERENCE = """
import math


def padded_duplicates(n_samples, world_size):
    return math.ceil(n_samples / world_size) * world_size - n_samples
"""

PADDING_WRONG = {
    "the remainder, not the padding": Mistake("""
def padded_duplicates(n_samples, world_size):
    return n_samples % world_size
""", "the remainder"),
    "a whole world of padding when it divides": Mistake("""
def padded_duplicates(n_samples, world_size):
    return world_size - n_samples % world_size
""", "divides evenly"),
    "each rank's count": Mistake("""
import math


def padded_duplicates(n_samples, world_size):
    return math.ceil(n_samples / world_size)
""", "each rank's count"),
    "what drop_last=True would drop": Mistake("""
def padded_duplicates(n_samples, world_size):
    return -(n_samples % world_size)
""", "pads by default"),
    "numpy's ceil gives a float": Mistake("""
import numpy as np


def padded_duplicates(n_samples, world_size):
    return np.ceil(n_samples / world_size) * world_size - n_samples
""", "a count of samples is an integer"),
    "one repeat at most": Mistake("""
def padded_duplicates(n_samples, world_size):
    return 0 if n_samples % world_size == 0 else 1
""", "as many repeats as it takes"),
}

PADDING_CASES = ((10, 4), (8, 2), (7, 3), (5, 8), (100, 7), (1001, 2), (9, 3), (1, 4))


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
        if got != expected or not is_integer(got):
            return failed(f"for {n_samples} samples on {world_size} ranks yours says {got!r}; "
                          f"the sampler serves {n_samples + expected}, so {expected} repeated"
                          + _padding_hint(got, n_samples, world_size, expected))
    return passed(f"matches what DistributedSampler served in {len(PADDING_CASES)} set-ups")


def _padding_hint(got, n: int, world: int, expected: int) -> str:
    per_rank = -(-n // world)
    if got == expected and not is_integer(got):
        return ": " + number_hint(got, "a count of samples is an integer")
    for candidate, hint in (
            (n % world, "that is the remainder; the padding fills the last round up to the "
             "world size"),
            (world - n % world, "when the split divides evenly there is no padding"),
            (per_rank, "that is each rank's count; the padding is the ranks' total minus "
             "the samples"),
            (-(n % world), "DistributedSampler pads by default (drop_last=False): it adds, "
             "it does not drop"),
            (min(1, n % world), "as many repeats as it takes to give every rank the same "
             "count, not one")):
        if got == candidate:
            return f": {hint}"
    if not is_integer(got):
        return ": a count of samples is an integer"
    return ""


EXERCISES = [
    Exercise("metrics.exact_val_loss", EXACT_STATEMENT, EXACT_SKELETON, EXACT_REFERENCE,
             EXACT_WRONG, exact_judge, rank_task=exact_rank_task, names=("exact_val_loss",)),
    Exercise("metrics.padding", PADDING_STATEMENT, PADDING_SKELETON, PADDING_REFERENCE,
             PADDING_WRONG, padding_judge, names=("padded_duplicates",),
             forbidden=("torch.utils.data.distributed",)),
]
