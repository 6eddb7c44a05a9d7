"""Lesson 07 (scaling out): global rank from node rank and local rank, and back.

    kosmoss check 07
"""
from __future__ import annotations

from .core import Exercise, failed, learner, passed

RANKS_STATEMENT = """\
**Convert between global rank and (node rank, local rank).**

A job runs `num_nodes × devices_per_node` ranks; torchrun, Slurm and Lightning number
them node after node. Write two functions: `rank_of(node_rank, local_rank,
devices_per_node)`, the global rank (`RANK`) of local rank `local_rank` on node
`node_rank`; and `place_of(rank, devices_per_node)`, the `(node_rank, local_rank)` of
global rank `rank` (local rank also picks the GPU on its node). The checker goes through
every rank of jobs from `2 × 1` to `4 × 8`.
"""

RANKS_SKELETON = '''
def rank_of(node_rank, local_rank, devices_per_node):
    """The global rank."""
    raise NotImplementedError("your code here")


def place_of(rank, devices_per_node):
    """(node_rank, local_rank) of a global rank."""
    raise NotImplementedError("your code here")
'''

RANKS_REFERENCE = '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return divmod(rank, devices_per_node)
'''

RANKS_WRONG = {
    "ranks interleaved over nodes": '''
def rank_of(node_rank, local_rank, devices_per_node):
    return local_rank * devices_per_node + node_rank


def place_of(rank, devices_per_node):
    return divmod(rank, devices_per_node)
''',
    "place swapped": '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return rank % devices_per_node, rank // devices_per_node
''',
}

JOBS = ((2, 1), (2, 2), (3, 4), (4, 8))


def ranks_judge(namespace: dict) -> tuple:
    rank_of, place_of = learner(namespace, "rank_of"), learner(namespace, "place_of")
    for nodes, per_node in JOBS:
        job = f"{nodes} node(s) x {per_node} rank(s)"
        for node in range(nodes):
            for local in range(per_node):
                expected = node * per_node + local  # torchrun's RANK: node after node
                got = rank_of(node, local, per_node)
                if got != expected:
                    return failed(f"{job}: local rank {local} of node {node} is global rank "
                                  f"{expected}; your rank_of says {got!r}")
                place = place_of(expected, per_node)
                if not _pair(place) or tuple(place) != (node, local):
                    return failed(f"{job}: global rank {expected} is local rank {local} of node "
                                  f"{node}; your place_of says {place!r} (node, local)")
    return passed(f"every rank of {len(JOBS)} jobs, up to {JOBS[-1][0]} x {JOBS[-1][1]}, "
                  "both ways")


def _pair(value) -> bool:
    try:
        return len(value) == 2
    except TypeError:
        return False


EXERCISES = [
    Exercise("07.rank_arithmetic", RANKS_STATEMENT, RANKS_SKELETON, RANKS_REFERENCE,
             RANKS_WRONG, ranks_judge, names=("rank_of", "place_of")),
]
