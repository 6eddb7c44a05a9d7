"""Plausible wrong answers the checkers once called correct, as a learner wrote them:
each is now rejected, with a message that says why.

- 01.normalise, the usual `std == 0` guard: a float32 column one ulp apart came out
  0..1.98, not 0;
- 08.training_memory, every bias forgotten: 0.6 % low, inside the old 1 % tolerance;
- 03.average_gradients, `p.grad /= 2`: 1.5 instead of 1.0 on 3 ranks;
- 09.ring_all_reduce, the reduce-scatter's index walking `+step`: 4.65 away from
  `all_reduce` on 3 ranks;
- where the statement left room (each now says which): 03.per_device_batch refusing 0 but
  not -4; 06.port_holder testing `status != ESTABLISHED` (a CLOSE_WAIT is no listener);
  10.stragglers flagging a rank alone; 12.pick_interface breaking a tie by name, not by the
  order given; 01.normalise standardising the caller's x in place.
"""
from __future__ import annotations

import pytest

from kosmoss.exercises.core import WRONG, find
from kosmoss.exercises.judging import judge_sources

STD_ZERO_GUARD = '''
import torch


def normalise(x):
    mean = x.mean(dim=0)
    std = x.std(dim=0)
    std[std == 0] = 1.0  # constant columns: avoid dividing by zero
    return (x - mean) / std
'''

BIASES_FORGOTTEN = '''
from torch import nn


def training_memory(model, batch_size):
    weights = sum(layer.weight.numel() for layer in model if isinstance(layer, nn.Linear))
    first = next(layer for layer in model if isinstance(layer, nn.Linear))
    activations = first.in_features
    width = first.in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            width = layer.out_features
        activations += width
    activations += width  # the targets
    return 4 * 4 * weights + 4 * batch_size * activations
'''

DIVIDE_BY_TWO = '''
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2
'''

PLUS_STEP = '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for step in range(n - 1):
        send = chunks[(rank + step) % n].clone()
        recv = torch.empty_like(chunks[(rank + step - 1) % n])
        req = dist.isend(send, (rank + 1) % n)
        dist.recv(recv, (rank - 1) % n)
        req.wait()
        chunks[(rank + step - 1) % n] += recv
    for step in range(n - 1):
        send = chunks[(rank + 1 - step) % n].clone()
        recv = torch.empty_like(chunks[(rank - step) % n])
        req = dist.isend(send, (rank + 1) % n)
        dist.recv(recv, (rank - 1) % n)
        req.wait()
        chunks[(rank - step) % n].copy_(recv)
    return tensor
'''

NEGATIVE_ACCEPTED = '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world_size = num_nodes * devices_per_node
    if global_batch_size == 0 or global_batch_size % world_size:
        raise ValueError(f"{global_batch_size} does not split over {world_size} ranks")
    return global_batch_size // world_size
'''

NOT_ESTABLISHED = '''
import psutil


def port_holder(port):
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.status != psutil.CONN_ESTABLISHED:
            return c.pid
    return None
'''

ALONE_A_STRAGGLER = '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = busy_ms[:rank] + busy_ms[rank + 1:]
        typical = statistics.median(others) if others else 0.0
        if mine > typical * 1.3 and mine - typical >= 2:
            slow.append(rank)
    return slow
'''

TIE_BY_NAME = '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name in sorted(interfaces):
        for address in interfaces[name]:
            network = ipaddress.ip_interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
'''

IN_PLACE = '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    x -= x.mean(dim=0)
    x /= torch.where(constant, torch.ones_like(std), std)
    x[:, constant] = 0
    return x
'''


def _verdict(exercise_id: str, body: str):
    exercise = find(exercise_id)
    return judge_sources([(exercise, exercise.cell(body))])[0]


# (exercise, how the answer went wrong, its source, what the verdict must say): judged in the
# checker's processes here, and in pytest's own process under mutmut (test_mutants.py).
ONCE_TOLD = [
    ("01.normalise", "the std == 0 guard misses a column one float32 step apart",
     STD_ZERO_GUARD, "surface pressure whose samples differ by one float32 step",
     "a test for std == 0"),
    ("08.training_memory", "every bias forgotten is named exactly", BIASES_FORGOTTEN,
     "short of it by exactly the biases"),
    ("03.per_device_batch", "a negative global batch is refused as zero is", NEGATIVE_ACCEPTED,
     "a global batch of -4", "a negative batch is fewer columns than ranks too"),
    ("06.port_holder", "a connection in CLOSE_WAIT is no listener", NOT_ESTABLISHED,
     "CLOSE_WAIT", "status == LISTEN"),
    ("10.stragglers", "a rank alone is no straggler", ALONE_A_STRAGGLER,
     "a rank alone holds back nobody"),
    ("12.pick_interface", "a tie goes to the first interface given, not by name", TIE_BY_NAME,
     "yours is 'eth0', the route goes over 'eth1'", "the first of them in the order given"),
    ("01.normalise", "normalising in place changes the caller's batch", IN_PLACE,
     "changed its input x in place"),
]


@pytest.fixture(scope="module")
def once_told_verdicts():
    """All of ONCE_TOLD in one launch of the checker's processes."""
    return judge_sources([(find(exercise_id), find(exercise_id).cell(body))
                          for exercise_id, _, body, *_ in ONCE_TOLD])


@pytest.mark.parametrize("index", range(len(ONCE_TOLD)), ids=[c[1] for c in ONCE_TOLD])
def test_each_is_now_wrong_and_says_why(index, once_told_verdicts):
    exercise_id, _, _, *says = ONCE_TOLD[index]
    verdict = once_told_verdicts[index]
    assert verdict.status == WRONG and verdict.exercise_id == exercise_id, verdict.line
    assert all(fragment in verdict.message for fragment in says), verdict.line


@pytest.mark.slow
def test_dividing_by_two_is_right_at_two_ranks_only():
    verdict = _verdict("03.average_gradients", DIVIDE_BY_TWO)
    assert verdict.status == WRONG, verdict.line
    assert [(size, ok) for size, ok, _ in verdict.per_world_size] == \
        [(2, True), (3, False), (4, False)]
    assert "divided by 2, not by the world size (3)" in verdict.message, verdict.line


@pytest.mark.slow
def test_a_ring_walking_plus_step_is_right_at_two_ranks_only():
    verdict = _verdict("09.ring_all_reduce", PLUS_STEP)
    assert verdict.status == WRONG, verdict.line
    assert [(size, ok) for size, ok, _ in verdict.per_world_size] == \
        [(2, True), (3, False), (4, False)]
    assert verdict.message.startswith("at 3 ranks: ") and "holds the sum of rank(s)" in \
        verdict.message, verdict.line
