"""Lesson 05 (devices): where a run computes (``kosmoss.devices.policy.decide``), and the backend
and memory share of ranks sharing a host's GPUs (``kosmoss.devices.policy.sharing``).

    kosmoss check 05
"""
from __future__ import annotations

import itertools

from .core import Exercise, LearnerRaised, Mistake, failed, learner, number, passed, show
from .tolerance import float64_close

# ---------------------------------------------------------------- 05.device_for

DEVICE_STATEMENT = """\
**Decide where a run computes, as `kosmoss.devices.policy.decide` does.**

Write `device_for(machine, machine_index, run_asks_gpu, visible_gpus)` returning
`"cpu"` or `"cuda:N"`. `machine` is the machine's setting: `"none"` (CPU only),
`"offer"` (a GPU if the run asks) or `"force"` (a GPU whatever the run asks);
`machine_index` picks a GPU (`None`: the first); `visible_gpus` is how many GPUs torch
sees. A GPU that is wanted but absent means CPU; an index that does not exist (negative,
or not below `visible_gpus`) means GPU 0. The checker compares with `decide` on every
row of the decision table, indexes at the edges included.
"""

DEVICE_SKELETON = """
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    \"\"\"Returns "cpu" or "cuda:N".\"\"\"
    raise NotImplementedError("your code here")
"""

DEVICE_REFERENCE = """
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if 0 <= index < visible_gpus else 0}"
"""

DEVICE_WRONG = {
    "the run decides": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if run_asks_gpu and visible_gpus > 0:
        return f"cuda:{machine_index or 0}"
    return "cpu"
""", "keeps every run on CPU"),
    "trusts the index": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    return f"cuda:{machine_index or 0}"
""", "does not exist"),
    "offer as force": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if machine == "none" or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if 0 <= index < visible_gpus else 0}"
""", "only when the run asks"),
    "off by one at the top": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if 0 <= index <= visible_gpus else 0}"
""", "ids 0 to"),
    "a negative index kept": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if index < visible_gpus else 0}"
""", "ids 0 to"),
    "a GPU even when none is visible": Mistake("""
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{index if 0 <= index < visible_gpus else 0}"
""", "no GPU is visible"),
}


def device_rows():
    for machine, index, asks, visible in itertools.product(
            ("none", "offer", "force"), (None, 0, 1, 2, 3, -1), (False, True), (0, 1, 2, 3)):
        yield machine, index, asks, visible


def device_judge(namespace: dict) -> tuple:
    from ..devices.policy import MachineGpu, decide

    mine = learner(namespace, "device_for")
    rows = list(device_rows())
    for machine, index, asks, visible in rows:
        policy = decide(MachineGpu(machine, index), asks, gpu_count=visible)
        expected, got = str(policy.device), str(mine(machine, index, asks, visible))
        if got != expected:
            return failed(f"machine {machine!r} with index {index}, run asks "
                          f"{'yes' if asks else 'no'}, {visible} GPU(s) visible: yours "
                          f"{got!r}, decide gives {expected!r}"
                          + _device_hint(machine, index, asks, visible, got, expected))
    return passed(f"all {len(rows)} rows of the decision table match decide")


def _device_hint(machine: str, index, asks: bool, visible: int, got: str,
                 expected: str) -> str:
    if expected == "cpu" and got.startswith("cuda"):
        if visible == 0:
            return ": no GPU is visible — a GPU that is wanted but absent means CPU"
        if machine == "none":
            return ": the machine's 'none' keeps every run on CPU, whatever the run asks"
        return ": 'offer' gives a GPU only when the run asks for one"
    if got == "cpu" and machine == "force" and not asks:
        return ": 'force' takes a GPU even when the run does not ask (the machine decides)"
    if got == "cpu" and index is not None and not 0 <= index < visible:
        return f": GPU {index} does not exist, and an index that does not exist means GPU 0"
    if got == "cpu":
        return f": {machine!r} with a run that asks, and a GPU visible, gives that GPU"
    index = got.split(":", 1)[-1]
    if not index.lstrip("-").isdigit() or not 0 <= int(index) < visible:
        return (f": GPU {index} does not exist with {visible} visible (ids 0 to {visible - 1}):"
                " an index that does not exist means GPU 0")
    return ""


# ---------------------------------------------------------------- 05.memory_share

SHARE_STATEMENT = """\
**Pick the backend and memory share for ranks on a host's GPUs.**

Write `memory_share(ranks_on_host, gpus_on_host)` returning `(backend, fraction)`: the
process-group backend (`"nccl"` or `"gloo"`) and the fraction of one GPU's memory each
rank may use, when the ranks are spread as evenly as possible over the GPUs (the busiest
GPU sets the share). NCCL refuses two ranks on one GPU; gloo accepts CUDA tensors; with
no GPU, gloo and a fraction of `1.0`. The checker compares with
`kosmoss.devices.policy.sharing`, as many ranks as GPUs, fewer, and ranks that do not
divide included.
"""

SHARE_SKELETON = """
def memory_share(ranks_on_host, gpus_on_host):
    \"\"\"(backend, fraction of a GPU's memory per rank).\"\"\"
    raise NotImplementedError("your code here")
"""

SHARE_REFERENCE = """
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
"""

SHARE_WRONG = {
    "GPUs over ranks": Mistake("""
def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", gpus_on_host / ranks_on_host
""", "the busiest GPU holds"),
    "NCCL whenever there is a GPU": Mistake("""
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    return "nccl", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
""", "NCCL refuses"),
    "rounds the ranks per GPU down": Mistake("""
def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / (ranks_on_host // gpus_on_host)
""", "rounded up"),
    "as many ranks as GPUs is not one each": Mistake("""
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host < gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
""", "one rank per GPU"),
    "divides by zero without a GPU": Mistake("""
import math


def memory_share(ranks_on_host, gpus_on_host):
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / math.ceil(ranks_on_host / gpus_on_host)
""", "ZeroDivisionError"),
}

# (1, 4) and (3, 4): fewer ranks than GPUs, one that divides their count and one that
# does not (NCCL either way).
SHARE_CASES = ((2, 0), (1, 1), (2, 2), (4, 4), (2, 1), (3, 1), (4, 2), (3, 2), (5, 2), (7, 3),
               (1, 4), (3, 4), (2, 3))


def share_judge(namespace: dict) -> tuple:
    from ..devices.policy import sharing

    mine = learner(namespace, "memory_share")
    setups = share_setups()
    for ranks, gpus in setups:
        expected = sharing(ranks, gpus)
        setup = f"{ranks} rank(s) on {gpus} GPU(s)"
        got = _share(mine, ranks, gpus, setup)
        try:
            backend, fraction = got
        except (TypeError, ValueError):
            return failed(f"memory_share({ranks}, {gpus}) returned {got!r}: return "
                          "(backend, fraction)")
        if backend != expected.backend:
            why = ("NCCL refuses two ranks on one GPU" if backend == "nccl" and gpus
                   else expected.reason)
            return failed(f"{setup}: your backend is {backend!r}, kosmoss uses "
                          f"{expected.backend!r} ({why})")
        if number(fraction) is None or not float64_close(number(fraction),
                                                         expected.memory_fraction, 2):
            why = (f"the busiest GPU holds {-(-ranks // gpus)} rank(s) — ranks over GPUs, "
                   "rounded up" if gpus else "without a GPU the ranks share the host's "
                   "memory, and a rank's share of no GPU is taken as the whole (1.0)")
            return failed(f"{setup}: your share is {show(fraction)}, kosmoss gives "
                          f"{expected.memory_fraction:.3g}: {why}")
    return passed(f"matches kosmoss.devices.policy.sharing in {len(setups)} set-ups")


def share_setups() -> list:
    """SHARE_CASES, a host without a GPU tried with every rank count up to its own: one
    rank alone there takes gloo too (NCCL needs a GPU, however few the ranks)."""
    setups = []
    for ranks, gpus in SHARE_CASES:
        setups += [(fewer, gpus) for fewer in range(1, ranks) if gpus == 0]
        setups.append((ranks, gpus))
    return setups


def _share(mine, ranks: int, gpus: int, setup: str):
    try:
        return mine(ranks, gpus)
    except LearnerRaised as err:
        raise LearnerRaised(f"for {setup}: {err}", err.original) from None


EXERCISES = [
    Exercise("05.device_for", DEVICE_STATEMENT, DEVICE_SKELETON, DEVICE_REFERENCE,
             DEVICE_WRONG, device_judge, names=("device_for",),
             forbidden=("kosmoss.devices",)),
    Exercise("05.memory_share", SHARE_STATEMENT, SHARE_SKELETON, SHARE_REFERENCE,
             SHARE_WRONG, share_judge, names=("memory_share",),
             forbidden=("kosmoss.devices",)),
]
