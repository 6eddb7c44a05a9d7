"""Lesson 05 (devices): where a run computes (``kosmoss.devices.policy.decide``), and the backend
and memory share of ranks sharing a host's GPUs (``kosmoss.devices.policy.sharing``).

    kosmoss check 05
"""
from __future__ import annotations

import itertools
import math

from .core import Exercise, failed, learner, number, passed, show

# ---------------------------------------------------------------- 05.device_for

DEVICE_STATEMENT = """\
**Decide where a run computes, as `kosmoss.devices.policy.decide` does.**

Write `device_for(machine, machine_index, run_asks_gpu, visible_gpus)` returning
`"cpu"` or `"cuda:N"`. `machine` is the machine's setting: `"none"` (CPU only),
`"offer"` (a GPU if the run asks) or `"force"` (a GPU whatever the run asks);
`machine_index` picks a GPU (`None`: the first); `visible_gpus` is how many GPUs torch
sees. A GPU that is wanted but absent means CPU; an index that does not exist means GPU
0. The checker compares with `decide` on every row of the lesson's decision table.
"""

DEVICE_SKELETON = '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    """Returns "cpu" or "cuda:N"."""
    raise NotImplementedError("your code here")
'''

DEVICE_REFERENCE = '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if 0 <= index < visible_gpus else 0}"
'''

DEVICE_WRONG = {
    "the run decides": '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if run_asks_gpu and visible_gpus > 0:
        return f"cuda:{machine_index or 0}"
    return "cpu"
''',
    "trusts the index": '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    return f"cuda:{machine_index or 0}"
''',
}


def device_rows():
    for machine, index, asks, visible in itertools.product(
            ("none", "offer", "force"), (None, 1, 3), (False, True), (0, 1, 2)):
        yield machine, index, asks, visible


def device_judge(namespace: dict) -> tuple:
    from ..devices.policy import MachineGpu, decide

    mine = learner(namespace, "device_for")
    rows = list(device_rows())
    for machine, index, asks, visible in rows:
        policy = decide(MachineGpu(machine, index), asks, gpu_count=visible)
        expected, got = str(policy.device), str(mine(machine, index, asks, visible))
        if got != expected:
            why = f" ({'; '.join(policy.warnings)})" if policy.warnings else ""
            return failed(f"machine {machine!r} with index {index}, run asks "
                          f"{'yes' if asks else 'no'}, {visible} GPU(s) visible: yours "
                          f"{got!r}, decide gives {expected!r}{why}")
    return passed(f"all {len(rows)} rows of the decision table match decide")


# ---------------------------------------------------------------- 05.memory_share

SHARE_STATEMENT = """\
**Pick the backend and memory share for ranks on a host's GPUs.**

Write `memory_share(ranks_on_host, gpus_on_host)` returning `(backend, fraction)`: the
process-group backend (`"nccl"` or `"gloo"`) and the fraction of one GPU's memory each
rank may use, when the ranks are spread as evenly as possible over the GPUs. NCCL
refuses two ranks on one GPU; gloo accepts CUDA tensors; with no GPU, gloo and a
fraction of `1.0`. The checker compares with `kosmoss.devices.policy.sharing`.
"""

SHARE_SKELETON = '''
def memory_share(ranks_on_host, gpus_on_host):
    """(backend, fraction of a GPU's memory per rank)."""
    raise NotImplementedError("your code here")
'''

SHARE_REFERENCE = '''
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
'''

SHARE_WRONG = {
    "GPUs over ranks": '''
def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", gpus_on_host / ranks_on_host
''',
    "NCCL whenever there is a GPU": '''
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    return "nccl", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
''',
}

SHARE_CASES = ((2, 0), (1, 1), (2, 2), (2, 1), (3, 1), (4, 2), (3, 2), (5, 2), (1, 4))


def share_judge(namespace: dict) -> tuple:
    from ..devices.policy import sharing

    mine = learner(namespace, "memory_share")
    for ranks, gpus in SHARE_CASES:
        expected = sharing(ranks, gpus)
        got = mine(ranks, gpus)
        try:
            backend, fraction = got
        except (TypeError, ValueError):
            return failed(f"memory_share({ranks}, {gpus}) returned {got!r}: return "
                          "(backend, fraction)")
        setup = f"{ranks} rank(s) on {gpus} GPU(s)"
        if backend != expected.backend:
            return failed(f"{setup}: your backend is {backend!r}, kosmoss uses "
                          f"{expected.backend!r} ({expected.reason})")
        if number(fraction) is None or not math.isclose(number(fraction),
                                                        expected.memory_fraction):
            return failed(f"{setup}: your share is {show(fraction)}, kosmoss gives "
                          f"{expected.memory_fraction:.3g}: the busiest GPU holds "
                          f"{math.ceil(ranks / gpus) if gpus else 0} rank(s)")
    return passed(f"matches kosmoss.devices.policy.sharing in {len(SHARE_CASES)} set-ups")


EXERCISES = [
    Exercise("05.device_for", DEVICE_STATEMENT, DEVICE_SKELETON, DEVICE_REFERENCE,
             DEVICE_WRONG, device_judge, names=("device_for",)),
    Exercise("05.memory_share", SHARE_STATEMENT, SHARE_SKELETON, SHARE_REFERENCE,
             SHARE_WRONG, share_judge, names=("memory_share",)),
]
