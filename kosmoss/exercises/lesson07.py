"""Lesson 07 (scaling out): global rank from node rank and local rank, and back.

    kosmoss check 07
"""
from __future__ import annotations

from .core import (TENSOR_HINT, Exercise, Mistake, failed, is_integer, is_tensor, learner,
                   passed)

RANKS_STATEMENT = """\
**Convert between global rank and (node rank, local rank).**

A job runs `num_nodes × devices_per_node` ranks; torchrun, Slurm and Lightning number
them node after node, from `0`. Write two functions: `rank_of(node_rank, local_rank,
devices_per_node)`, the global rank (`RANK`, an integer) of local rank `local_rank` on
node `node_rank`; and `place_of(rank, devices_per_node)`, the `(node_rank, local_rank)`
of global rank `rank` (local rank also picks the GPU on its node). The checker goes
through every rank of jobs from `1 × 4` and `3 × 1` to `4 × 8`.
"""

RANKS_SKELETON = """
def rank_of(node_rank, local_rank, devices_per_node):
    \"\"\"The global rank.\"\"\"
    raise NotImplementedError("your code here")


def place_of(rank, devices_per_node):
    \"\"\"(node_rank, local_rank) of a global rank.\"\"\"
    raise NotImplementedError("your code here")
"""

RANKS_REFERENCE = """
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return divmod(rank, devices_per_node)
"""

_PLACE = """

def place_of(rank, devices_per_node):
    return divmod(rank, devices_per_node)
"""
_RANK = """
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank

"""

RANKS_WRONG = {
    "ranks interleaved over nodes": Mistake("""
def rank_of(node_rank, local_rank, devices_per_node):
    return local_rank * devices_per_node + node_rank
""" + _PLACE, "node after node"),
    "place swapped": Mistake(_RANK + """
def place_of(rank, devices_per_node):
    return rank % devices_per_node, rank // devices_per_node
""", "(node, local) swapped"),
    "ranks counted from 1": Mistake("""
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank + 1
""" + _PLACE, "ranks count from 0"),
    "two devices per node hard-coded": Mistake("""
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * 2 + local_rank
""" + _PLACE, "devices_per_node, not 2"),
    "true division in place_of": Mistake(_RANK + """
def place_of(rank, devices_per_node):
    return rank / devices_per_node, rank % devices_per_node
""", "integers"),
    "numpy's floor gives floats": Mistake(_RANK + """
import numpy as np


def place_of(rank, devices_per_node):
    return np.floor(rank / devices_per_node), rank % devices_per_node
""", "ranks are integers"),
    "tensors from torch's floor division": Mistake(_RANK + """
import torch


def place_of(rank, devices_per_node):
    rank = torch.tensor(rank)
    return torch.div(rank, devices_per_node, rounding_mode="floor"), rank % devices_per_node
""", "a tensor, not a Python number"),
    "bit operations, right for powers of two": Mistake("""
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node | local_rank
""" + _PLACE, "power of two"),
    "the node from the wrong count": Mistake(_RANK + """
def place_of(rank, devices_per_node):
    return rank // (devices_per_node + 1), rank % devices_per_node
""", "node_rank = rank // devices_per_node"),
}

JOBS = ((1, 4), (3, 1), (2, 2), (3, 4), (4, 8))
# The same nodes with one rank fewer each where several are left: 3 and 7 ranks per node
# are no power of two, where `|` and `&` would stand in for + and % by luck.
UNEVEN_JOBS = tuple((nodes, per_node - 1) for nodes, per_node in JOBS if per_node > 2)


def ranks_judge(namespace: dict) -> tuple:
    rank_of, place_of = learner(namespace, "rank_of"), learner(namespace, "place_of")
    for nodes, per_node in JOBS + UNEVEN_JOBS:
        job = f"{nodes} node(s) x {per_node} rank(s)"
        for node in range(nodes):
            for local in range(per_node):
                expected = node * per_node + local  # torchrun's RANK: node after node
                got = rank_of(node, local, per_node)
                if got != expected or not is_integer(got):
                    return failed(f"{job}: local rank {local} of node {node} is global rank "
                                  f"{expected}; your rank_of says {got!r}"
                                  + _rank_hint(got, node, local, per_node))
                place = place_of(expected, per_node)
                if not _pair(place) or tuple(place) != (node, local) or \
                        not all(is_integer(v) for v in place):
                    return failed(f"{job}: global rank {expected} is local rank {local} of node "
                                  f"{node}; your place_of says {place!r} (node, local)"
                                  + _place_hint(place, node, local, per_node))
    return passed(f"every rank of {len(JOBS + UNEVEN_JOBS)} jobs, up to {JOBS[-1][0]} x "
                  f"{JOBS[-1][1]}, ranks per node that are no power of two included, both ways")


def _rank_hint(got, node: int, local: int, per_node: int) -> str:
    if is_tensor(got):
        return f": {TENSOR_HINT}"
    bits = ("shifts and | stand in for * and + only when devices_per_node is a power of two "
            "— node_rank * devices_per_node + local_rank")
    for candidate, hint in ((node * per_node | local, bits),
                            ((node << (per_node.bit_length() - 1)) + local, bits),
                            (node * 2 + local, "multiply by devices_per_node, not 2"),
                            (local * per_node + node, "ranks go node after node: all of "
                             "node 0's, then node 1's"),
                            (node * per_node + local + 1, "ranks count from 0")):
        if got == candidate:
            return f": {hint}"
    if not is_integer(got):
        return ": a rank is an integer"
    return ""


def _pair(value) -> bool:
    try:
        return len(value) == 2
    except TypeError:
        return False


def _place_hint(place, node: int, local: int, per_node: int) -> str:
    if not _pair(place):
        return ": return a pair (node_rank, local_rank)"
    if any(is_tensor(v) for v in place):
        return f": {TENSOR_HINT}"
    if not all(is_integer(v) for v in place):
        return ": ranks are integers — node_rank = rank // devices_per_node (floor division)"
    if tuple(place) == (local, node):
        return ": (node, local) swapped — node_rank = rank // devices_per_node"
    rank = node * per_node + local
    by_bits = (rank >> (per_node.bit_length() - 1), rank & (per_node - 1))
    if all(mine in (right, bits) for mine, right, bits in zip(place, (node, local), by_bits)):
        return (f": {per_node} ranks per node is no power of two — shifts and masks "
                "(>>, &) stand in for // and % only for a power of two")
    return ": node_rank = rank // devices_per_node, local_rank = rank % devices_per_node"


EXERCISES = [
    Exercise("07.rank_arithmetic", RANKS_STATEMENT, RANKS_SKELETON, RANKS_REFERENCE,
             RANKS_WRONG, ranks_judge, names=("rank_of", "place_of"),
             forbidden=("kosmoss.launch",)),
]
