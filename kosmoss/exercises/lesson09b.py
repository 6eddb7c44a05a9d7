"""Lesson 09b (write your own DDP): three wrappers a learner writes in turn — one flat
all-reduce after backward, per-parameter hooks with asynchronous all-reduces, buckets in
reverse parameter order — each checked at 2, 3 and 4 gloo processes against
``torch.nn.parallel.DistributedDataParallel``: the start from rank 0's weights, the
gradients after every backward and the weights after several optimizer steps, and the
all-reduces themselves (how many, of what size, launched when, waited on).

    kosmoss check 09b
"""
from __future__ import annotations

import copy
import gc
from typing import List, Optional

from .core import (Exercise, LearnerRaised, Mistake, NotAnswered, cell_filename,
                   describe_error, failed, learner, passed)
from .lesson09 import torch_buckets
from .tolerance import FLOAT32_UNIT
from .watch import watched
from ..run.lightning_private import bucket_assignment_function

NOTEBOOK_GLOB = "09b_*"
ROWS = 10  # each step's batch: shares of 5 + 5, 3 + 3 + 4, 2 + 3 + 2 + 3 rows
STEPS = 3
LR, MOMENTUM = 0.1, 0.9
# Bucket caps in bytes: one a bucket reaches exactly, one a gradient alone is larger than
# (and that 10**6-byte megabytes would split otherwise), one that holds every gradient.
CAPS_BYTES = (340, 345, 2 ** 20)
FORBIDDEN = ("torch.nn.parallel", "kosmoss.bench.own_ddp")


def _toy_class():
    import torch
    from torch import nn

    class Toy(nn.Module):
        """Three layers and a frozen parameter between them (DDP reduces no gradient of
        it, it has none, but broadcasts it from rank 0 when built, as every parameter;
        drawn from the seed, it differs from rank to rank until then). Parameter bytes,
        last first: 20, 320, 64, 1024, 64, 768."""

        def __init__(self):
            super().__init__()
            self.first = nn.Linear(12, 16)
            self.scale = nn.Parameter(0.25 + 0.5 * torch.rand(1), requires_grad=False)
            self.second = nn.Linear(16, 16)
            self.third = nn.Linear(16, 5)

        def forward(self, x):
            hidden = nn.functional.silu(self.first(x)) * self.scale
            return self.third(nn.functional.silu(self.second(hidden)))

    return Toy


def toy(seed: int, dtype: str = "float32"):
    """The checker's model; every rank builds it from another seed (DDP starts them all
    from rank 0's weights)."""
    import torch

    torch.manual_seed(seed)
    return _toy_class()().to(getattr(torch, dtype))  # the frozen scale differs too


def shard(step: int, rank: int, world_size: int, dtype: str = "float32"):
    """This rank's rows of step ``step``'s batch."""
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(ROWS, 12, generator=generator), torch.randn(ROWS, 5, generator=generator)
    rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
    return x[rows].to(getattr(torch, dtype)), y[rows].to(getattr(torch, dtype))


def _trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def _flat(tensors):
    import torch

    return torch.cat([t.detach().double().flatten() for t in tensors])


# ---------------------------------------------------------------- statements and cells

FLAT_STATEMENT = """\
**Write DDP with one flat all-reduce after backward.**

Write a class `FlatDDP(module)`: a `torch.nn.Module` wrapped around the model on every
rank, whose `forward` runs the model. The training loop calls, every step,
`loss.backward()`, then `wrapper.finish_gradient_synchronization()`, then
`optimizer.step()`. Like DDP, the wrapper starts every rank from rank `0`'s weights
(broadcast every parameter in `__init__`), and once `finish_gradient_synchronization()`
returns, every `.grad` holds the average over the ranks of that gradient, whatever the
size of each rank's share of the batch. Here that is one `dist.all_reduce` a step, of
every gradient at once in one flat buffer (`torch.cat`: one collective pays the latency
once); `torch.cat` copies, so copy the reduced buffer back into the gradients. A frozen
parameter (`requires_grad=False`; the model has one) has no `.grad`: skip it, as DDP
does. The checker runs `3` steps of SGD with momentum at 2, 3 and 4 gloo processes (the
shares are uneven at 3 and 4), compares the start, every step's gradients and the final
weights with DDP's to float32 rounding, and counts your all-reduces.
"""

OVERLAP_STATEMENT = """\
**Overlap the all-reduces with backward: one asynchronous all-reduce per gradient.**

Write a class `OverlapDDP(module)`, the same contract as `FlatDDP` (rank `0`'s weights
at the start, the averaged gradients once `finish_gradient_synchronization()` returns,
frozen parameters skipped), but with one `dist.all_reduce` per parameter, launched
during backward as soon as that parameter's gradient is ready: register a hook with
`parameter.register_post_accumulate_grad_hook(hook)` (it is called with the parameter,
its `.grad` complete), and launch the all-reduce there with `async_op=True`, so that
backward goes on computing the earlier layers' gradients while it runs. Keep the handle
it returns; `finish_gradient_synchronization()` waits on every handle
(`handle.wait()`) before the gradients are used, and divides them by the world size. The
checker compares with DDP as for `FlatDDP`, and watches every all-reduce: launched
during backward, asynchronous, waited on.
"""

BUCKET_STATEMENT = """\
**Bucket the gradients, last layer first; all-reduce each bucket as soon as it is full.**

Write a class `BucketDDP(module, bucket_cap_mb)`, the same contract as `FlatDDP`, with
one all-reduce per bucket. In `__init__`, put the parameters that require a gradient into
buckets in *reverse* order of `module.parameters()` (the order backward makes their
gradients ready): a bucket closes as soon as its size in bytes reaches the cap,
`bucket_cap_mb × 1024 × 1024` (a gradient is never split, so a bucket may go over it);
the last bucket holds what is left. During backward, when a bucket's last gradient is
ready (a post-accumulate-grad hook on each parameter), flatten the bucket's gradients
into one buffer and launch its all-reduce with `async_op=True`.
`finish_gradient_synchronization()` waits on every handle, copies the averaged buffers
back into the gradients, and gets ready for the next step. The checker compares with
DDP as for `FlatDDP`, with caps that a bucket reaches exactly, that one gradient alone
exceeds, and that hold every gradient, and checks each all-reduce: its size, launched
during backward as soon as its bucket is full, asynchronous, waited on.
"""

FLAT_SKELETON = """
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    \"\"\"DDP by hand: every gradient averaged by one flat all-reduce after backward.\"\"\"

    def __init__(self, module):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: start every rank from rank 0's weights")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        \"\"\"Called after loss.backward(), before optimizer.step().\"\"\"
        raise NotImplementedError("your code here")
"""

FLAT_REFERENCE = """
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for parameter in module.parameters():
                dist.broadcast(parameter, src=0)  # every rank starts from rank 0's weights

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([grad.flatten() for grad in grads])  # a copy: one buffer, one call
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(part.view_as(grad))
"""

_BROADCAST = """        with torch.no_grad():
            for parameter in module.parameters():
                dist.broadcast(parameter, src=0)
"""


def _flat_cell(sync: str, init: str = _BROADCAST) -> str:
    """A FlatDDP like the reference with another finish_gradient_synchronization body."""
    return f"""
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
{init}
    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
{sync}"""


_FLAT_SYNC = """        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([grad.flatten() for grad in grads])
        dist.all_reduce(flat)
        flat /= {divisor}
        for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(part.view_as(grad))
"""

FLAT_WRONG = {
    "one all-reduce per parameter": Mistake(_flat_cell("""        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
"""), "flatten every gradient into one buffer"),
    "reduces the flat copy, never copies it back": Mistake(_flat_cell(
        """        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([grad.flatten() for grad in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
"""), "copy the reduced buffer back"),
    "the sum, not the average": Mistake(_flat_cell(_FLAT_SYNC.format(divisor="1")),
                                        "the sum over the ranks"),
    "divides by 2, the lesson's world size": Mistake(
        _flat_cell(_FLAT_SYNC.format(divisor="2")), "divided by 2, not by the world size",
        wrong_at=(3, 4)),
    "no broadcast at the start": Mistake(_flat_cell(_FLAT_SYNC.format(
        divisor="dist.get_world_size()"), init="        pass\n"), "rank 0's weights"),
    "the frozen parameter's missing gradient": Mistake(_flat_cell(
        """        grads = [p.grad for p in self.module.parameters()]
        flat = torch.cat([grad.flatten() for grad in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(part.view_as(grad))
"""), "'NoneType' object has no attribute"),
}

OVERLAP_SKELETON = """
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    \"\"\"DDP by hand: each gradient's all-reduce starts, asynchronously, as soon as
    backward has computed it.\"\"\"

    def __init__(self, module):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: broadcast, then register the hooks")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        \"\"\"Called after loss.backward(), before optimizer.step().\"\"\"
        raise NotImplementedError("your code here")
"""

OVERLAP_REFERENCE = """
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.handles = []
        with torch.no_grad():
            for parameter in module.parameters():
                dist.broadcast(parameter, src=0)
        for parameter in module.parameters():
            if parameter.requires_grad:  # a frozen parameter gets no gradient, and no hook
                parameter.register_post_accumulate_grad_hook(self._launch)

    def _launch(self, parameter):
        # Runs inside backward, as soon as this gradient is complete; backward goes on.
        self.handles.append(dist.all_reduce(parameter.grad, async_op=True))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        for parameter in self.module.parameters():
            if parameter.grad is not None:
                parameter.grad /= dist.get_world_size()
"""


def _overlap(launch: str, finish: str = "", hooks: str = "if parameter.requires_grad:",
             init: str = _BROADCAST, divisor: str = "dist.get_world_size()") -> str:
    """An OverlapDDP like the reference with one part changed."""
    return f"""
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.handles = []
{init}        for parameter in module.parameters():
            {hooks}
                parameter.register_post_accumulate_grad_hook(self._launch)

    def _launch(self, parameter):
{launch}
    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
{finish or _WAIT}        for parameter in self.module.parameters():
            if parameter.grad is not None:
                parameter.grad /= {divisor}
"""


_ASYNC = "        self.handles.append(dist.all_reduce(parameter.grad, async_op=True))\n"
_WAIT = """        for handle in self.handles:
            handle.wait()
        self.handles.clear()
"""

OVERLAP_WRONG = {
    "a blocking all-reduce in the hook": Mistake(_overlap(
        "        dist.all_reduce(parameter.grad)\n"), "async_op=True"),
    "never waits on the handles": Mistake(_overlap(_ASYNC, finish="        pass\n"),
                                          "wait on every handle"),
    "all-reduces after backward, in finish": Mistake(_overlap(
        "        pass\n", finish="""        for parameter in self.module.parameters():
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
"""), "during backward"),
    "the sum, not the average": Mistake(_overlap(_ASYNC, divisor="1"),
                                        "the sum over the ranks"),
    "divides by 2, the lesson's world size": Mistake(
        _overlap(_ASYNC, divisor="2"), "divided by 2, not by the world size", wrong_at=(3, 4)),
    "a hook on the frozen parameter too": Mistake(_overlap(_ASYNC, hooks="if True:"),
                                                  "doesn't require grad"),
    "no broadcast at the start": Mistake(_overlap(_ASYNC, init=""), "rank 0's weights"),
}

BUCKET_SKELETON = """
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    \"\"\"DDP by hand: gradients in buckets, last layer first; each bucket's all-reduce
    starts, asynchronously, as soon as its last gradient is ready.\"\"\"

    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        raise NotImplementedError("your code here: broadcast, buckets, hooks")

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        \"\"\"Called after loss.backward(), before optimizer.step().\"\"\"
        raise NotImplementedError("your code here")
"""


_COPY_BACK = """\
            for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(part.view_as(grad))
"""
_CLOSE_BEFORE_THE_CAP = """\
            nbytes = {size}
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(parameter)
            size += nbytes
"""


def _bucket(order: str = "[p for p in module.parameters() if p.requires_grad][::-1]",
            size: str = "parameter.numel() * parameter.element_size()",
            close: str = """            current.append(parameter)
            size += {size}
            if size >= cap:
                self.buckets.append(current)
                current, size = [], 0
""", cap: str = "int(bucket_cap_mb * 1024 * 1024)", init: str = _BROADCAST,
            ready: str = """        if self.waiting[index] == 0:
            self._launch(index)
""", launch: str = "dist.all_reduce(flat, async_op=True)",
            finish_wait: str = "            handle.wait()\n", copy_back: str = _COPY_BACK,
            divisor: str = "dist.get_world_size()",
            reset: str = "        self.waiting = [len(bucket) for bucket in self.buckets]\n",
            finish_launch: str = "") -> str:
    """A BucketDDP like the reference with one part changed: most mistakes' shape."""
    return f"""
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
{init}        cap = {cap}
        self.buckets, current, size = [], [], 0
        for parameter in {order}:
{close.format(size=size)}        if current:
            self.buckets.append(current)
        self.bucket_of = {{parameter: index for index, bucket in enumerate(self.buckets)
                          for parameter in bucket}}
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.pending = []
        for parameter in self.bucket_of:
            parameter.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, parameter):
        index = self.bucket_of[parameter]
        self.waiting[index] -= 1
{ready}
    def _launch(self, index):
        flat = torch.cat([p.grad.flatten() for p in self.buckets[index]])
        self.pending.append((index, flat, {launch}))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
{finish_launch}        for index, flat, handle in self.pending:
{finish_wait}            flat /= {divisor}
            grads = [p.grad for p in self.buckets[index]]
{copy_back}        self.pending.clear()
{reset}"""


BUCKET_REFERENCE = _bucket()

BUCKET_WRONG = {
    "buckets in forward order": Mistake(_bucket(
        order="[p for p in module.parameters() if p.requires_grad]"),
        "reverse order of module.parameters()"),
    "a bucket closes before it would pass the cap": Mistake(
        _bucket(close=_CLOSE_BEFORE_THE_CAP), "as soon as its size reaches the cap"),
    "the cap counted in elements": Mistake(_bucket(size="parameter.numel()"),
                                           "counted in elements"),
    "a megabyte of 10**6 bytes": Mistake(_bucket(cap="int(bucket_cap_mb * 1e6)"),
                                         "1024 × 1024"),
    "every bucket launched in finish": Mistake(_bucket(
        ready="        pass\n",
        finish_launch="        for index in range(len(self.buckets)):\n"
                      "            self._launch(index)\n"), "during backward"),
    "every bucket launched with the last gradient": Mistake(_bucket(ready="""\
        if sum(self.waiting) == 0:
            for each in range(len(self.buckets)):
                self._launch(each)
"""), "as soon as its last gradient is ready"),
    "the ready counts never reset": Mistake(_bucket(reset=""), "reset the count"),
    "reduces the flat copy, never copies it back": Mistake(_bucket(copy_back=""),
                                                           "copy the reduced buffer back"),
    "the sum, not the average": Mistake(_bucket(divisor="1"), "the sum over the ranks"),
    "divides by 2, the lesson's world size": Mistake(
        _bucket(divisor="2"), "divided by 2, not by the world size", wrong_at=(3, 4)),
    "a blocking all-reduce": Mistake(_bucket(launch="dist.all_reduce(flat)",
                                             finish_wait=""), "async_op=True"),
    "no broadcast at the start": Mistake(_bucket(init=""), "rank 0's weights"),
}


# ---------------------------------------------------------------- what the ranks do


def _ddp_run(rank: int, world_size: int) -> dict:
    """torch's DDP on the checker's model: the reference, run first on every rank."""
    import torch
    from torch.nn.functional import mse_loss
    from torch.nn.parallel import DistributedDataParallel

    model = toy(seed=rank)
    ddp = DistributedDataParallel(model)
    start = _flat(model.parameters())
    x, y = shard(0, rank, world_size)
    replica = copy.deepcopy(model)
    mse_loss(replica(x), y).backward()
    local = _flat(p.grad for p in _trainable(replica))  # this rank's own, unreduced
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    grads, weights = [], []
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = shard(step, rank, world_size)
        mse_loss(ddp(x), y).backward()
        grads.append(_flat(p.grad for p in _trainable(model)))
        optimizer.step()
        weights.append(_flat(model.parameters()))
    del ddp  # DDP before its process group (lesson 9 says why)
    gc.collect()
    return {"start": start, "local": local, "grads": grads, "weights": weights}


def _learner_run(namespace: dict, name: str, args: tuple, rank: int, world_size: int,
                 cell_file: str) -> dict:
    """The learner's wrapper on the same model and data: what it did and what came out."""
    import torch
    from torch.nn.functional import mse_loss

    model = toy(seed=rank)
    events: list = []
    phase = ["init"]
    handles: list = []
    with watched("all_reduce", events, phase, handles):
        learner(namespace, name)  # says "not answered" when the cell defines no such class
        wrapper = _mine(namespace[name], name, cell_file)(model, *args)
        start = _flat(model.parameters())
        for index, parameter in enumerate(_trainable(model)):
            # Registered after the learner's hooks: it runs after theirs on each gradient.
            parameter.register_post_accumulate_grad_hook(
                lambda _, index=index: events.append(("ready", index)))
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        grads, weights = [], []
        for step in range(STEPS):
            optimizer.zero_grad()
            x, y = shard(step, rank, world_size)
            phase[0] = "forward"
            loss = mse_loss(_mine(wrapper, "forward", cell_file)(x), y)
            phase[0] = "backward"
            events.append(("backward", step))
            earlier = sum(1 for e in events if e[0] == "launch")  # launches of earlier steps
            _mine(loss.backward, "a hook of yours", cell_file)()
            phase[0] = "finish"
            events.append(("finish", step))
            _mine(_attribute(wrapper, "finish_gradient_synchronization"),
                  "finish_gradient_synchronization", cell_file)()
            events.append(("finished", step))
            gc.collect()  # a handle the learner dropped is gone: one still held is kept
            events.append(("kept", sum(1 for launch, handle in handles
                                       if launch < earlier and handle() is not None)))
            phase[0] = "step"
            grads.append(_flat(p.grad if p.grad is not None else torch.zeros_like(p)
                               for p in _trainable(model)))
            optimizer.step()
            weights.append(_flat(model.parameters()))
    return {"args": args, "start": start, "grads": grads, "weights": weights, "events": events}


def _attribute(instance, name: str):
    found = getattr(instance, name, None)
    if not callable(found):
        raise NotAnswered(f"your {type(instance).__name__} has no method `{name}`")
    return found


def _mine(function, name: str, cell_file: str):
    """``function`` (the learner's class, method, or a backward that runs their hooks)
    called as ``learner()`` calls a learner's function: what it raises becomes a verdict
    naming the line of their cell, and calling what the exercise is checked against is
    refused."""
    from .guard import raise_if_hit, tripwire

    def call(*args):
        try:
            with tripwire() as hits:
                result = function(*args)
        except NotImplementedError:
            raise NotAnswered(f"not answered yet: `{name}` still raises "
                              "NotImplementedError") from None
        except (Exception, SystemExit) as err:  # sys.exit() in a cell ends no checker
            raise LearnerRaised(describe_error(err, cell_file), err) from None
        raise_if_hit(hits)
        return result

    return call


def _rank_task(name: str, runs: tuple):
    def rank_task(namespace: dict, rank: int, world_size: int) -> dict:
        from .core import find

        reference = _ddp_run(rank, world_size)  # first: every rank reaches its collectives
        # The trajectory to compare with, computed here rather than in the notebook's kernel:
        # a backward there would stop ranks the lesson forks later, on a GPU machine.
        expected = expectation(world_size) if rank == 0 else None
        cell_file = cell_filename(find(f"09b.{_IDS[name]}"))
        mine = [_learner_run(namespace, name, args, rank, world_size, cell_file)
                for args in runs]
        return {"reference": reference, "runs": mine, "expected": expected}
    return rank_task


_IDS = {"FlatDDP": "flat", "OverlapDDP": "overlap", "BucketDDP": "buckets"}


# ---------------------------------------------------------------- tolerances


def trajectory(world_size: int, dtype: str) -> dict:
    """DDP's computation on one process in ``dtype``: each rank's gradient on its share,
    averaged (summed in rank order, then divided), SGD with momentum; the start is rank
    0's model. float64 is the reference, float32 what every right answer rounds from."""
    import torch
    from torch.nn.functional import mse_loss

    model = toy(seed=0, dtype=dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    grads, weights = [], []
    for step in range(STEPS):
        per_rank = []
        for rank in range(world_size):
            model.zero_grad()
            x, y = shard(step, rank, world_size, dtype)
            mse_loss(model(x), y).backward()
            per_rank.append([p.grad.clone() for p in _trainable(model)])
        for index, parameter in enumerate(_trainable(model)):
            parameter.grad = sum(r[index] for r in per_rank[1:]) + per_rank[0][index]
            parameter.grad /= world_size
        grads.append(_flat(p.grad for p in _trainable(model)))
        optimizer.step()
        weights.append(_flat(model.parameters()))
    return {"grads": grads, "weights": weights}


def expectation(world_size: int) -> dict:
    """The exact (float64) trajectory and its per-step tolerances."""
    exact = trajectory(world_size, "float64")
    return {"exact": exact, "limits": tolerances(world_size, exact)}


def tolerances(world_size: int, exact: Optional[dict] = None) -> dict:
    """Per step, for the gradients and for the weights: 8 times the float32 computation's
    own distance from the float64 one (a right answer sums the same gradients in another
    order: DDP divides before it sums), and at least 8 float32 steps of the largest value."""
    exact = exact or trajectory(world_size, "float64")
    single = trajectory(world_size, "float32")
    return {kind: [max(8 * float((s - e).abs().max()), 8 * FLOAT32_UNIT * float(e.abs().max()))
                   for s, e in zip(single[kind], exact[kind])] for kind in ("grads", "weights")}


# ---------------------------------------------------------------- judging


def _judge(kind: str):
    def judge(ranks: List[dict]) -> tuple:
        n, expected = len(ranks), ranks[0]["expected"]
        exact, limits = expected["exact"], expected["limits"]
        for result in ranks:
            sanity = _ddp_outside(result["reference"], exact, limits)
            if sanity:
                return failed(sanity)
        checks = (lambda run, result, rank: _wrong_start(run, ranks[0]["reference"], rank),
                  lambda run, result, rank: _wrong_traffic(kind, run, rank),
                  lambda run, result, rank: _wrong_numbers(run, result["reference"], n, limits,
                                                           rank, kind))
        for run_index in range(len(ranks[0]["runs"])):
            for check in checks:  # every rank's start first: a wrong start changes the rest
                for rank, result in enumerate(ranks):
                    run = result["runs"][run_index]
                    message = check(run, result, rank)
                    if message:
                        return failed(_where(kind, run) + message)
        return passed(_praise(kind, ranks[0]))
    return judge


def _ddp_outside(reference: dict, exact: dict, limits: dict) -> Optional[str]:
    for kind in ("grads", "weights"):
        for step, (got, want) in enumerate(zip(reference[kind], exact[kind])):
            if float((got - want).abs().max()) > limits[kind][step]:
                return (f"the checker's reference, DDP, is outside its own tolerance on the "
                        f"{kind} of step {step + 1}: please report it")
    return None


def _where(kind: str, run: dict) -> str:
    if kind != "buckets":
        return ""
    return f"with a cap of {_cap_bytes(run):,} bytes: "


def _cap_bytes(run: dict) -> int:
    return int(run["args"][0] * 1024 * 1024)


def _wrong_start(run: dict, rank0: dict, rank: int) -> Optional[str]:
    differ = run["start"] != rank0["start"]
    if not bool(differ.any()):
        return None
    frozen = _frozen_mask()
    if bool(differ[frozen].all()) and not bool(differ[~frozen].any()):
        return (f"rank {rank} did not start from rank 0's frozen parameter: broadcast every "
                "parameter from rank 0 in __init__, the frozen one (requires_grad=False) too "
                "— DDP broadcasts it when it is built; only its gradient is skipped")
    return (f"rank {rank} did not start from rank 0's weights: broadcast every parameter "
            "from rank 0 in __init__ (dist.broadcast(parameter, src=0)), as DDP does when it "
            "is built")


def _frozen_mask():
    """Which elements of the flattened parameters belong to a frozen parameter."""
    import torch

    return torch.cat([torch.full((p.numel(),), not p.requires_grad)
                      for p in toy(0).parameters()])


def _steps(events: list) -> List[list]:
    """The events of each step, from its backward to the end of its finish."""
    steps, current = [], None
    for event in events:
        if event[0] == "backward":
            current = []
            steps.append(current)
        if current is not None:
            current.append(event)
    return steps


def _wrong_traffic(kind: str, run: dict, rank: int) -> Optional[str]:
    sizes = [p.numel() for p in _trainable(toy(0))]
    for step, events in enumerate(_steps(run["events"])):
        launches = [e for e in events if e[0] == "launch"]
        where = f"rank {rank}, step {step + 1}: "
        if not launches:
            return where + _none_launched(step, kind)
        message = {"flat": _flat_traffic, "overlap": _overlap_traffic,
                   "buckets": _bucket_traffic}[kind](launches, events, sizes, run)
        message = message or _unwaited(events, run["events"])
        if message:
            return where + message
    return None


def _none_launched(step: int, kind: str) -> str:
    if step > 0:
        return ("the first step launched all-reduces, this one none: get ready for the next "
                "step in finish_gradient_synchronization() (reset the count of ready "
                "gradients, clear the handles)")
    what = {"flat": "one flat buffer of every gradient", "overlap": "each gradient",
            "buckets": "each bucket"}[kind]
    return (f"your code called no dist.all_reduce (the checker watches dist.all_reduce, as "
            f"the lesson calls it): all-reduce {what}")


def _flat_traffic(launches, events, sizes, run) -> Optional[str]:
    if len(launches) > 1:
        return (f"your code called dist.all_reduce {len(launches)} times, on "
                f"{_elements(launches)} elements: one collective per parameter pays the "
                "latency each time — flatten every gradient into one buffer (torch.cat) and "
                "all-reduce it once")
    if launches[0][1] != sum(sizes):
        return (f"your one all-reduce held {launches[0][1]} elements; the gradients hold "
                f"{sum(sizes)}: all of them, in one buffer")
    return None


def _overlap_traffic(launches, events, sizes, run) -> Optional[str]:
    late = [e for e in launches if e[3] != "backward"]
    if late:
        return (f"{len(late)} of your {len(launches)} all-reduces started after backward "
                f"(in {late[0][3]}): launch each one during backward, from the hook that runs "
                "when its gradient is ready (register_post_accumulate_grad_hook)")
    if sorted(e[1] for e in launches) != sorted(sizes):
        return (f"your all-reduces held {_elements(launches)} elements; the gradients hold "
                f"{sizes}: one all-reduce per parameter that requires a gradient")
    blocking = [e for e in launches if not e[2]]
    if blocking:
        return _blocking(len(blocking), len(launches))
    return _waited_in_backward(events) or _late_launches(events) or _kept_handles(events)


def _late_launches(events: list) -> Optional[str]:
    """The k-th all-reduce launched from the hook of the k-th gradient ready (the checker's
    hook runs after the learner's on each gradient: k gradients are marked ready then)."""
    ready, launched = 0, 0
    for event in events:
        ready += event[0] == "ready"
        if event[0] == "launch":
            launched += 1
            if ready > launched:
                return (f"all-reduce {launched} was launched only after {ready} gradients were "
                        "ready, not from its own gradient's hook: launch each one from the "
                        "hook of its own gradient, while backward computes the next ones — "
                        "launched at the end of backward, nothing overlaps")
    return None


def _kept_handles(events: list) -> Optional[str]:
    kept = next((e[1] for e in events if e[0] == "kept" and e[1]), 0)
    if kept:
        return (f"{kept} handle(s) of an earlier step were still held after this step's "
                "finish_gradient_synchronization(): clear them once waited on — each keeps "
                "the gradient it reduced alive, so memory grows with every step")
    return None


def _waited_in_backward(events: list) -> Optional[str]:
    early = [e for e in events if e[0] == "wait" and e[2] == "backward"]
    if early:
        return (f"you waited on {len(early)} handle(s) during backward, in the hook that "
                "launched them: backward then stops as for a blocking all-reduce — wait in "
                "finish_gradient_synchronization(), once backward has computed the rest")
    return None


def _bucket_traffic(launches, events, sizes, run) -> Optional[str]:
    cap = _cap_bytes(run)
    expected = expected_buckets(cap)
    want = [sum(sizes[i] for i in bucket) for bucket in expected]
    got = [e[1] for e in launches]
    late = [e for e in launches if e[3] != "backward"]
    if late and sorted(got) == sorted(want):
        return (f"{len(late)} of your {len(launches)} bucket all-reduces started after "
                f"backward (in {late[0][3]}): launch each bucket during backward, from the "
                "hook of its last gradient, so that it overlaps what backward still computes")
    if got != want:
        return (f"your all-reduces held {got} elements, in that order; {len(want)} bucket(s) "
                f"of {want}" + bucket_hint(got, cap))
    blocking = [e for e in launches if not e[2]]
    if blocking:
        return _blocking(len(blocking), len(launches))
    return (_waited_in_backward(events) or _late_buckets(events, expected)
            or _kept_handles(events))


def _late_buckets(events: list, expected: List[List[int]]) -> Optional[str]:
    """Each bucket launched as soon as its last gradient is ready: before the gradient
    that follows it (the checker's hook runs after the learner's on the same gradient)."""
    ready = [e[1] for e in events if e[0] == "ready"]
    seen = 0
    for index, event in enumerate(events):
        if event[0] == "ready":
            seen += 1
        if event[0] != "launch":
            continue
        bucket = expected[sum(1 for e in events[:index] if e[0] == "launch")]
        last = max(ready.index(i) for i in bucket) if all(i in ready for i in bucket) else None
        if last is not None and seen > last + 1:
            return (f"a bucket was launched only after {seen} gradients were ready; its own "
                    f"were ready after {last + 1}: launch each bucket as soon as its last "
                    "gradient is ready, while backward computes the next ones")
    return None


def _blocking(count: int, total: int) -> str:
    return (f"{count} of your {total} all-reduces were blocking: backward stops at each one "
            "until it is done — pass async_op=True and wait on the handle in "
            "finish_gradient_synchronization()")


def _unwaited(events: list, every: list) -> Optional[str]:
    launches = [i for i, e in enumerate(every) if e[0] == "launch"]
    start = every.index(events[0])
    end = next((i for i in range(start, len(every)) if every[i][0] == "finished"), len(every))
    waited = {e[1] for e in every[:end] if e[0] == "wait"}
    for number, position in enumerate(launches):
        if start <= position < end and every[position][2] and number not in waited:
            return ("an asynchronous all-reduce was not waited on before "
                    "finish_gradient_synchronization() returned: wait on every handle "
                    "(handle.wait()) — until then the gradient may be half reduced")
    return None


def _elements(launches) -> str:
    shown = [e[1] for e in launches]
    return f"{shown[:8]}{' ...' if len(shown) > 8 else ''}"


def _wrong_numbers(run: dict, reference: dict, n: int, limits: dict, rank: int,
                   kind: str) -> Optional[str]:
    for step in range(STEPS):
        mine, want = run["grads"][step], reference["grads"][step]
        gap = float((mine - want).abs().max())
        if gap > limits["grads"][step]:
            return (f"rank {rank}, step {step + 1}: your gradients differ from DDP's by "
                    f"{gap:.2g}" + _numbers_why(mine, want, reference["local"], step, n, kind))
    gap = float((run["weights"][-1] - reference["weights"][-1]).abs().max())
    if gap > limits["weights"][-1]:
        return (f"rank {rank}: your weights after {STEPS} steps differ from DDP's by {gap:.2g}, "
                "while every step's gradients matched: does your wrapper change the weights "
                "themselves?")
    return None


def _numbers_why(mine, want, local, step: int, n: int, kind: str) -> str:
    import torch

    def close(a, b):
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-7))

    if step == 0 and close(mine, local):
        copy_back = ("all_reduce wrote into the flat copy (torch.cat copies): copy the "
                     "reduced buffer back into each .grad" if kind != "overlap" else
                     "all-reduce .grad itself")
        return f": they are this rank's own gradients, not reduced — {copy_back}"
    for divisor in range(1, 2 * n + 1):
        if divisor != n and close(mine, want * n / divisor):
            if divisor == 1:
                return f": {n}x DDP's — the sum over the ranks; divide by the world size"
            return (f": the sum over the ranks divided by {divisor}, not by the world size "
                    f"({n}) — ask dist.get_world_size()")
    return ""


def _praise(kind: str, rank0: dict) -> str:
    events = rank0["runs"][0]["events"]
    launches = [e for e in _steps(events)[0] if e[0] == "launch"]
    how = {"flat": "one flat all-reduce a step",
           "overlap": f"{len(launches)} asynchronous all-reduces a step, all launched during "
                      "backward",
           "buckets": f"buckets launched during backward as each filled ({len(CAPS_BYTES)} "
                      "caps)"}[kind]
    return f"DDP's start, gradients and weights after {STEPS} steps on every rank, with {how}"


# ---------------------------------------------------------------- buckets


def expected_buckets(cap_bytes: int) -> List[List[int]]:
    """The buckets the statement asks for, as indices into the trainable parameters
    (0 = the first layer's weight): DDP's own assignment function on the reversed order,
    with the same cap for every bucket."""
    sizes = [4 * p.numel() for p in _trainable(toy(0))]
    last = len(sizes) - 1
    buckets = torch_buckets(sizes[::-1], cap_bytes, cap_bytes)
    return [[last - i for i in bucket] for bucket in buckets]


def bucket_hint(got: List[int], cap: int) -> str:
    """Which plausible rule made ``got`` (elements per all-reduce)."""
    sizes = [p.numel() for p in _trainable(toy(0))]
    rules = (
        (_fill(sizes[::-1], 4, cap, ">="), ""),
        (_fill(sizes, 4, cap, ">="), ": those are the buckets of the forward order — fill "
         "them in reverse order of module.parameters(), the order backward makes them ready"),
        (_fill(sizes[::-1], 4, cap, ">"), ": a bucket of yours closes before it would pass "
         "the cap; it closes as soon as its size reaches the cap (a gradient is never split)"),
        (_fill(sizes[::-1], 1, cap, ">="), ": the cap counted in elements — it is in bytes "
         "(numel × element_size)"),
        (_fill(sizes[::-1], 4, int(cap / 2 ** 20 * 1e6), ">="), ": a megabyte here is "
         "1024 × 1024 bytes, as DDP's bucket_cap_mb counts it, not 10**6"),
        ([[s] for s in sizes[::-1]], ": one bucket per parameter — put gradients together "
         "until the bucket reaches the cap"),
    )
    right = sorted(sum(b) for b in rules[0][0])
    for buckets, hint in rules[1:]:  # in any order: the launches follow the gradients
        if sorted(sum(b) for b in buckets) == sorted(got) != right:
            return hint
    return ""


def _fill(sizes: List[int], element_bytes: int, cap: float, close: str) -> List[List[int]]:
    """Sizes (elements) into buckets: ``>=`` closes a bucket once it reaches the cap, ``>``
    starts a new one before it would pass it."""
    buckets, current, size = [], [], 0
    for elements in sizes:
        nbytes = elements * element_bytes
        if close == ">" and current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(elements)
        size += nbytes
        if close == ">=" and size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


EXERCISES = [
    Exercise("09b.flat", FLAT_STATEMENT, FLAT_SKELETON, FLAT_REFERENCE, FLAT_WRONG,
             _judge("flat"), rank_task=_rank_task("FlatDDP", ((),)), names=("FlatDDP",),
             forbidden=FORBIDDEN),
    Exercise("09b.overlap", OVERLAP_STATEMENT, OVERLAP_SKELETON, OVERLAP_REFERENCE,
             OVERLAP_WRONG, _judge("overlap"), rank_task=_rank_task("OverlapDDP", ((),)),
             names=("OverlapDDP",), forbidden=FORBIDDEN),
    Exercise("09b.buckets", BUCKET_STATEMENT, BUCKET_SKELETON, BUCKET_REFERENCE, BUCKET_WRONG,
             _judge("buckets"),
             rank_task=_rank_task("BucketDDP", tuple((cap / 2 ** 20,) for cap in CAPS_BYTES)),
             names=("BucketDDP",), forbidden=FORBIDDEN + (bucket_assignment_function,)),
]
