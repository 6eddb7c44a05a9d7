"""Lesson 11 (memory and beyond DDP): one optimizer step from micro-batches (gradient
accumulation), checked against the full batch's step; a ZeRO-1 step that keeps only this
rank's share of the optimizer state, checked at 2, 3 and 4 gloo processes against SGD; the
forward of a row-parallel linear layer (Megatron-LM's), checked at 2, 3 and 4 gloo
processes against the single-process layer and for its one all-reduce.

    kosmoss check 11
"""
from __future__ import annotations

from typing import List

from .core import Exercise, Mistake, failed, learner, passed
from .tolerance import FLOAT32_UNIT, gamma
from .watch import called, watched

LR, MOMENTUM = 0.1, 0.9

# ---------------------------------------------------------------- 11.accumulate

ACCUMULATE_STATEMENT = """\
**Take one optimizer step on a large batch from micro-batches (gradient accumulation).**

Write `accumulated_step(model, optimizer, x, y, micro_batches)`. It must take exactly the
optimizer step that one forward and backward of the mean-squared-error loss on the whole
batch `(x, y)` followed by `optimizer.step()` would take — but run the model on
`micro_batches` slices of the batch, one after the other, so that only one slice's
activations are in memory at a time. The slices are as equal as `torch.tensor_split`
makes them: when the batch does not divide, some are one column longer, so weigh each
slice by its share of the batch. The gradients may still hold the previous step's:
zero them first. The checker compares your weights after the step with the full
batch's (plain SGD, so that any scale error shows) to float32 rounding, and watches the
size of every forward pass and every call of `optimizer.step`.
"""

ACCUMULATE_SKELETON = """
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    \"\"\"One optimizer step on (x, y), computed in micro_batches slices.\"\"\"
    raise NotImplementedError("your code here")
"""

ACCUMULATE_REFERENCE = """
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        # backward adds into .grad; each slice's mean, weighed by its share of the batch
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x)
        loss.backward()
    optimizer.step()
"""


def _accumulate(body: str, zero: str = "    optimizer.zero_grad()\n",
                split: str = "tensor_split") -> str:
    return (f"\nimport torch\n\n\ndef accumulated_step(model, optimizer, x, y, micro_batches):\n"
            f"{zero}    for x_part, y_part in zip(x.{split}(micro_batches), "
            f"y.{split}(micro_batches)):\n{body}    optimizer.step()\n")


_SHARE = ("        loss = torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) "
          "/ len(x)\n        loss.backward()\n")

ACCUMULATE_WRONG = {
    "sums the slices' losses": Mistake(_accumulate(
        "        torch.nn.functional.mse_loss(model(x_part), y_part).backward()\n"),
        "x the full batch's"),
    "zero_grad in the loop": Mistake(_accumulate(
        "        optimizer.zero_grad()\n" + _SHARE, zero=""), "follows the last slice only"),
    "the whole batch at once": Mistake("""
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
""", "your forward passes saw [32] columns"),
    "divides by micro_batches when slices differ": Mistake(_accumulate(
        "        (torch.nn.functional.mse_loss(model(x_part), y_part) / micro_batches)"
        ".backward()\n"), "weigh each slice by its share"),
    "never zeroes the gradients": Mistake(_accumulate(_SHARE, zero=""),
                                          "the gradients it was given"),
    "a step per slice": Mistake("""
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x)
        loss.backward()
        optimizer.step()
""", "accumulation takes one optimizer step"),
    "chunk, not tensor_split": Mistake(_accumulate(_SHARE, split="chunk"), "as equal as"),
}

ACCUMULATE_CASES = ((32, 4), (24, 3), (16, 1), (10, 4), (7, 3), (5, 5))  # (batch, slices)
STALE_GRADIENT = 3.0  # what .grad holds before the call: a right answer zeroes it


def _small_model(seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.SiLU(), nn.Linear(16, 5))


def _full_step(x, y, dtype):
    """The full batch's SGD step, in ``dtype``: (start, after)."""
    import copy

    import torch

    start = _small_model().to(dtype)
    after = copy.deepcopy(start)
    torch.nn.functional.mse_loss(after(x.to(dtype)), y.to(dtype)).backward()
    torch.optim.SGD(after.parameters(), lr=LR).step()
    return start, after


def _weights(model):
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def accumulate_tolerance(x, y) -> float:
    """The float32 full-batch step's own distance from the float64 one, times 8 (a right
    answer sums the same per-column gradients in another grouping), and at least 4
    float32 steps of the largest weight (each weight's last rounding)."""
    import torch

    exact = _weights(_full_step(x, y, torch.float64)[1])
    single = _weights(_full_step(x, y, torch.float32)[1])
    return max(8 * float((single - exact).abs().max()),
               4 * 2 * FLOAT32_UNIT * float(exact.abs().max()))


def accumulate_judge(namespace: dict) -> tuple:
    import torch

    mine = learner(namespace, "accumulated_step")
    for batch, micro in ACCUMULATE_CASES:
        generator = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 12, generator=generator)
        y = torch.randn(batch, 5, generator=generator)
        model, (seen, before, changed), steps = _run_learner(mine, x, y, micro)
        message = (_accumulate_mistake(model, x, y, seen, steps, micro) or _graphs_held(before)
                   or _settings_left(changed))
        if message:
            return failed(f"batch {batch} in {micro} micro-batch(es): {message}")
    return passed(f"the same step as the full batch in {len(ACCUMULATE_CASES)} cases, batches "
                  "that do not divide included, one micro-batch in memory at a time")


def _run_learner(mine, x, y, micro: int):
    """The learner's step on a fresh model whose .grad holds stale values: (model, the
    rows of each forward pass, the calls of optimizer.step, the backward passes done
    before each forward pass)."""
    import torch

    model = _small_model()
    for param in model.parameters():
        param.grad = torch.full_like(param, STALE_GRADIENT)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    seen, steps, backwards, before = [], [], [], []
    optimizer.register_step_pre_hook(lambda *args: steps.append(1))

    def forward(module, args):
        seen.append(len(args[0]))
        before.append(len(backwards))

    hooks = [model.register_forward_pre_hook(forward),
             # the first layer's weight: its gradient comes last in every backward pass
             model[0].weight.register_hook(lambda grad: backwards.append(1))]
    settings = [dict(group, params=None) for group in optimizer.param_groups]
    try:
        mine(model, optimizer, x, y, micro)
    finally:
        for hook in hooks:
            hook.remove()
    changed = [key for group, was in zip(optimizer.param_groups, settings)
               for key in was if key != "params" and group.get(key) != was[key]]
    return model, (seen, before, changed), len(steps)


def _settings_left(changed: List[str]):
    """A step that scales the optimizer's rate (lr / k) and leaves it so: the next step
    divides again."""
    if not changed:
        return None
    return (f"the right step, but the optimizer's {changed[0]} was left changed: the next call "
            "would change it again (lr / k, then lr / k², ...) — scale each slice's loss, not "
            "the optimizer's settings")


def _accumulate_mistake(model, x, y, seen, steps: int, micro: int):
    import torch

    right_sizes = sorted(len(part) for part in x.tensor_split(micro))
    if sorted(seen) != right_sizes:
        return (f"your forward passes saw {seen} columns; accumulation runs {micro} slices "
                f"as equal as tensor_split makes them ({right_sizes}), so that one slice's "
                "activations are in memory at a time")
    if steps != 1:
        return (f"optimizer.step ran {steps} times: accumulation takes one optimizer step, "
                "after every slice's backward")
    start, full = _full_step(x, y, torch.float64)
    moved, expected = _weights(model) - _weights(start), _weights(full) - _weights(start)
    gap = float((moved - expected).abs().max())
    if gap <= accumulate_tolerance(x, y):
        return None
    return f"your weights differ from the full batch's step by {gap:.2g}" + _accumulate_why(
        model, x, y, micro, moved, expected)


def _graphs_held(before: List[int]):
    """A slice's forward pass before the backward of the slices before it: their graphs,
    and the activations they hold, are all in memory at once."""
    early = [index for index, done in enumerate(before) if done < index]
    if not early:
        return None
    index = early[0]
    return (f"the forward pass of slice {index + 1} ran before the backward of slice "
            f"{before[index] + 1}: every slice's graph (its activations) was in memory at "
            "once, as for the whole batch — call backward on each slice's loss before the "
            "next slice's forward (not on the sum of the losses, nor after the loop)")


def _accumulate_why(model, x, y, micro: int, moved, expected) -> str:
    import torch

    ratio = float((moved * expected).sum() / (expected * expected).sum())
    if abs(ratio - micro) < 1e-3 * micro:
        return (f": your step is {micro}x the full batch's — each slice's loss is a mean over "
                "the slice; weigh it by its share of the batch before backward")
    stale = float(LR * STALE_GRADIENT)
    if bool(((moved - expected + stale).abs() < 1e-4).all()):
        return (": your step also follows the gradients it was given — zero them first "
                "(optimizer.zero_grad()), once, before the loop")
    last_x, last_y = x.tensor_split(micro)[-1], y.tensor_split(micro)[-1]
    last = _small_model()
    (torch.nn.functional.mse_loss(last(last_x), last_y) * len(last_x) / len(x)).backward()
    follow = -LR * torch.cat([p.grad.flatten() for p in last.parameters()]).double()
    if bool(((moved - follow).abs() < 1e-4).all()):
        return (": your step follows the last slice only — backward adds into .grad, so "
                "zero the gradients once, before the loop")
    if len(x) % micro:
        return (": the slices are not all the same size here — weigh each slice by its share "
                "of the batch (len(slice) / len(batch)), not by 1 / micro_batches")
    return ""


# ---------------------------------------------------------------- 11.zero1_step

ZERO_STATEMENT = """\
**Write a ZeRO-1 optimizer step: each rank keeps and updates only its share.**

Write `zero1_step(params, state, lr)`. It is called on every rank after backward, when
every parameter's `.grad` already holds the gradient averaged over the ranks (DDP did
that), so all ranks hold the same parameters and gradients. It must apply SGD with
momentum `0.9` — for each parameter, `buf = 0.9 * buf + grad` (`buf` starts at zero),
then `param -= lr * buf` — but sharded as ZeRO stage 1 does: parameter `i` of `params`
belongs to rank `i % world_size` (`params` come sorted by size, largest first, so that
this spreads the bytes); a rank keeps the momentum buffers of its own
parameters only (in `state`, a dict you fill, kept between calls), updates only those,
and then every parameter is broadcast from the rank that owns it, so that all ranks end
with the same weights. The checker runs three steps at 2, 3 and 4 gloo processes, `lr`
changing between them as a scheduler's does, and compares with
`torch.optim.SGD(momentum=0.9)` on one process to float32 rounding, and measures what
each rank keeps in `state`.
"""

ZERO_SKELETON = """
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    \"\"\"SGD with momentum 0.9, each rank owning parameters i % world_size == rank.\"\"\"
    raise NotImplementedError("your code here")
"""

ZERO_REFERENCE = """
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index, param in enumerate(params):
            owner = index % world_size
            if owner == rank:
                buf = state.setdefault(index, torch.zeros_like(param))
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
            dist.broadcast(param, src=owner)  # every rank calls it, in the same order
"""


def _zero(owner: str = "index % world_size", src: str = "owner",
          keep: str = "state.setdefault(index, torch.zeros_like(param))") -> str:
    return f"""
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    per_rank = -(-len(params) // world_size)
    with torch.no_grad():
        for index, param in enumerate(params):
            owner = {owner}
            if owner == rank:
                buf = {keep}
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
            dist.broadcast(param, src={src})
"""


ZERO_WRONG = {
    "every rank keeps every buffer": Mistake("""
import torch


def zero1_step(params, state, lr):
    with torch.no_grad():
        for index, param in enumerate(params):
            buf = state.setdefault(index, torch.zeros_like(param))
            buf.mul_(0.9).add_(param.grad)
            param.sub_(lr * buf)
""", "ZeRO-1 keeps only the owner's share"),
    "no broadcast": Mistake("""
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index, param in enumerate(params):
            if index % world_size == rank:
                buf = state.setdefault(index, torch.zeros_like(param))
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
""", "broadcast every parameter from the rank that owns it"),
    "two ranks hard-coded": Mistake(_zero(owner="index % 2"), "i % world_size",
                                    wrong_at=(3, 4)),
    "broadcast from rank 0": Mistake(_zero(src="0"), "src = i % world_size"),
    "momentum not kept between calls": Mistake(_zero(keep="torch.zeros_like(param)"),
                                               "kept between calls"),
    "contiguous blocks, not i % world_size": Mistake(_zero(owner="index // per_rank"),
                                                     "i % world_size"),
    "asynchronous broadcasts never waited on": Mistake(_zero(src="owner, async_op=True"),
                                                       "before waiting on"),
}

ZERO_STEPS = 3
# A rate that changes between steps, as a scheduler's does: a rate folded into the momentum
# buffer (buf = 0.9 * buf + lr * grad; param -= buf) is right only while it stays the same.
ZERO_LRS = (LR, LR / 2, LR / 4)


def _zero_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 8), nn.SiLU(), nn.Linear(8, 6), nn.SiLU(), nn.Linear(6, 3))


def _set_gradients(model, step: int) -> None:
    """The averaged gradient DDP would leave: the same on every rank, new each step, written
    into the .grad tensors of the step before (DDP's gradient_as_bucket_view, zero_grad with
    set_to_none=False): a momentum buffer that is .grad itself is overwritten."""
    import torch

    generator = torch.Generator().manual_seed(step)
    for param in model.parameters():
        grad = torch.randn(param.shape, generator=generator).to(param.dtype)
        if param.grad is None:
            param.grad = grad
        else:  # into the same tensor, as a backward after zero_grad(set_to_none=False) does
            param.grad.copy_(grad)


def _tensor_elements(value) -> int:
    import torch

    if torch.is_tensor(value):
        return value.numel()
    if isinstance(value, dict):
        return sum(_tensor_elements(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_elements(v) for v in value)
    return 0


def _flat(model):
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def sgd_trajectory(dtype: str, momentum: float = MOMENTUM) -> list:
    """torch's SGD on one process, at the rates of ZERO_LRS: the weights after each step
    ("float64": the reference)."""
    import torch

    model = _zero_model().to(getattr(torch, dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    weights = []
    for index in range(ZERO_STEPS):
        _set_gradients(model, index)
        for group in optimizer.param_groups:
            group["lr"] = ZERO_LRS[index]
        optimizer.step()
        weights.append(_flat(model))
    return weights


def folded_trajectory() -> list:
    """The weights of a rate folded into the buffer: buf = 0.9 * buf + lr * grad; p -= buf."""
    import torch

    model = _zero_model().double()
    buffers = [torch.zeros_like(p) for p in model.parameters()]
    weights = []
    with torch.no_grad():
        for index in range(ZERO_STEPS):
            _set_gradients(model, index)
            for param, buf in zip(model.parameters(), buffers):
                buf.mul_(MOMENTUM).add_(param.grad, alpha=ZERO_LRS[index])
                param.sub_(buf)
            weights.append(_flat(model))
    return weights


def zero_tolerance() -> float:
    """8 times the float32 SGD's own distance from the float64 one after the last step,
    and at least 4 float32 steps of the largest weight."""
    exact, single = sgd_trajectory("float64"), sgd_trajectory("float32")
    return max(8 * float((single[-1] - exact[-1]).abs().max()),
               8 * FLOAT32_UNIT * float(exact[-1].abs().max()))


def zero_rank_task(namespace: dict, rank: int, world_size: int) -> dict:
    model = _zero_model()
    # Largest first, as ZeroRedundancyOptimizer sorts them: i % world_size then spreads bytes.
    params = sorted(model.parameters(), key=lambda p: p.numel(), reverse=True)
    order = [next(i for i, q in enumerate(model.parameters()) if q is p) for p in params]
    state: dict = {}
    step = learner(namespace, "zero1_step")
    weights, events, phase = [], [], ["before"]
    with watched("broadcast", events, phase):
        for index in range(ZERO_STEPS):
            _set_gradients(model, index)
            phase[0] = f"step {index}"
            step(params, state, ZERO_LRS[index])
            phase[0] = "returned"
            weights.append(_flat(model))
    kept = {i: _tensor_elements(value) for i, value in state.items()} if isinstance(
        state, dict) else {}
    grads = {p.grad.data_ptr() for p in params if p.grad is not None}
    return {"weights": weights, "kept": _tensor_elements(state), "kept_by_key": kept,
            "sizes": [p.numel() for p in params], "order": order,
            "aliased": _holds_tensor(state, grads), "unwaited": _unwaited(events)}


def _unwaited(events: list) -> int:
    """Asynchronous broadcasts not waited on in the call that launched them."""
    launches = [event for event in events if event[0] == "launch"]
    waited = {(event[1], event[2]) for event in events if event[0] == "wait"}
    return sum(1 for launch, (_, _, asynchronous, phase) in enumerate(launches)
               if asynchronous and (launch, phase) not in waited
               and (launch, "finish") not in waited)


def _holds_tensor(value, pointers: set) -> bool:
    """Whether state holds a tensor whose storage is one of the gradients'."""
    import torch

    if torch.is_tensor(value):
        return value.numel() > 0 and value.data_ptr() in pointers
    if isinstance(value, dict):
        return any(_holds_tensor(v, pointers) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, pointers) for v in value)
    return False


def zero_judge(ranks: List[dict]) -> tuple:
    n = len(ranks)
    for rank, result in enumerate(ranks):
        if result["unwaited"]:
            return failed(f"rank {rank} returned from zero1_step before waiting on "
                          f"broadcasts it launched with async_op=True ({result['unwaited']} "
                          f"over {ZERO_STEPS} calls): until then a parameter may not have "
                          "arrived, and the next forward reads it (right or wrong by luck) "
                          "— wait on every handle (handle.wait()) before the step returns")
    expected = sgd_trajectory("float64")
    tolerance = zero_tolerance()
    final = [r["weights"][-1] for r in ranks]
    if any(float((w - final[0]).abs().max()) > tolerance for w in final):
        return failed("the ranks hold different weights after the steps: each rank updated "
                      "only its own parameters; broadcast every parameter from the rank that "
                      "owns it")
    for step in range(ZERO_STEPS):
        gap = float((ranks[0]["weights"][step] - expected[step]).abs().max())
        if gap > tolerance:
            return failed(f"your weights differ from torch.optim.SGD(momentum=0.9) by {gap:.2g} "
                          f"after step {step + 1} of {ZERO_STEPS}"
                          + _zero_why(ranks[0], step, n))
    sizes = ranks[0]["sizes"]
    for rank, result in enumerate(ranks):
        owned = [i for i in range(len(sizes)) if i % n == rank]
        share = sum(sizes[i] for i in owned)
        if result["kept"] != share:
            return failed(f"rank {rank} keeps {result['kept']} elements of optimizer state; "
                          f"it owns parameters {owned} (i % world_size), {share} elements of "
                          f"{sum(sizes)}: ZeRO-1 keeps only the owner's share on each rank")
    kept = [str(r["kept"]) for r in ranks]
    return passed(f"the weights of torch's SGD with momentum after {ZERO_STEPS} steps, with "
                  f"{', '.join(kept)} elements of state on the {n} ranks instead of "
                  f"{sum(sizes)} on each")


def _zero_why(result: dict, step: int, n: int) -> str:
    if result.get("aliased"):
        return (": your momentum buffer is the .grad tensor itself (state[i] = p.grad) — the "
                "next backward writes into .grad and overwrites the momentum; keep a copy "
                "(p.grad.clone())")
    plain = sgd_trajectory("float64", momentum=0.0)
    if float((result["weights"][step] - plain[step]).abs().max()) < 1e-6:
        return (": they follow SGD without momentum — the momentum buffers must be kept "
                "between calls, in state")
    if float((result["weights"][step] - folded_trajectory()[step]).abs().max()) < 1e-6:
        return (f": the rate went into the buffer (buf = 0.9 * buf + lr * grad) — here lr "
                f"changes from step to step ({', '.join(f'{lr:g}' for lr in ZERO_LRS)}, as a "
                "scheduler's does), and a buffer keeps the old rates: buf = 0.9 * buf + grad, "
                "then param -= lr * buf")
    start = _flat(_zero_model())
    exact = sgd_trajectory("float64")[step]
    stuck = _stuck_parameters(result, start, exact)
    owners = sorted({i % n for i in stuck})
    if stuck and 0 not in owners:
        return (f": parameters {stuck} (owned by rank(s) {owners}) never moved — broadcast "
                "each parameter from the rank that owns it: src = i % world_size")
    return ""


def _stuck_parameters(result: dict, start, exact) -> List[int]:
    """Indices (in params' order) of the parameters still at their starting values."""
    import torch

    model = _zero_model()
    bounds, offset = [], 0
    for p in model.parameters():
        bounds.append((offset, offset + p.numel()))
        offset += p.numel()
    got = result["weights"][-1]
    stuck = []
    for index, position in enumerate(result["order"]):
        low, high = bounds[position]
        if torch.equal(got[low:high], start[low:high]) and not torch.equal(
                exact[low:high], start[low:high]):
            stuck.append(index)
    return stuck


# ---------------------------------------------------------------- 11.row_parallel

ROW_STATEMENT = """\
**Write the forward of a row-parallel linear layer (Megatron-LM's second layer).**

Write `row_parallel_forward(h_local, weight_local, bias)`. A linear layer `y = h Wᵀ + b`
with `k` input features is split over the ranks by its *input* features: rank `r` holds
the columns of `W` for its slice of the features (`weight_local`, shape `(out, k_r)`,
the slices as `torch.tensor_split` cuts `k`: uneven, and possibly empty) and receives
only that slice of the input (`h_local`, shape `(batch, k_r)`: what a column-parallel
layer before it left on this rank). Every rank holds the whole `bias`. Return the whole
output `h Wᵀ + b` (shape `(batch, out)`), the same on every rank, with one
`dist.all_reduce` — the one all-reduce of the layer pair's forward. The checker runs your
cell at 2, 3 and 4 gloo processes, on inputs whose features do not divide by the world
size, a slice that is empty and a batch of one column, compares with the single-process
layer to float32 rounding, counts your collectives, and checks that the tensors it gave
come back unchanged.
"""

ROW_SKELETON = """
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    \"\"\"The whole output h @ W.T + bias, from this rank's slice of h and of W's columns.\"\"\"
    raise NotImplementedError("your code here")
"""

ROW_REFERENCE = """
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    partial = h_local @ weight_local.T  # this slice's share of every output
    dist.all_reduce(partial)  # the shares add up to h @ W.T on every rank
    return partial + bias  # once, after the sum
"""


def _row(body: str) -> str:
    return f"""
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
{body}"""


ROW_WRONG = {
    "the bias on every rank, before the sum": Mistake(_row("""\
    partial = h_local @ weight_local.T + bias
    dist.all_reduce(partial)
    return partial
"""), "the bias is added once"),
    "no all-reduce: this rank's partial sum": Mistake(_row("""\
    return h_local @ weight_local.T + bias
"""), "a partial sum"),
    "the bias on rank 0 only, after the sum": Mistake(_row("""\
    partial = h_local @ weight_local.T
    dist.all_reduce(partial)
    if dist.get_rank() == 0:
        partial += bias
    return partial
"""), "the bias is missing"),
    "averaged, as data parallelism does": Mistake(_row("""\
    partial = h_local @ weight_local.T
    dist.all_reduce(partial)
    return partial / dist.get_world_size() + bias
"""), "the partial products add up"),
    "reduced to rank 0 only": Mistake(_row("""\
    partial = h_local @ weight_local.T
    dist.reduce(partial, dst=0)
    return partial + bias
"""), "leaves the sum on one rank only"),
    "all-reduced in float16 to halve the bytes": Mistake(_row("""\
    partial = (h_local @ weight_local.T).half()
    dist.all_reduce(partial)
    return partial.float() + bias
"""), "16-bit float's rounding"),
    "outputs gathered, as a column-parallel layer would": Mistake(_row("""\
    partial = h_local @ weight_local.T + bias
    pieces = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, partial)
    return torch.cat(pieces, dim=1)
"""), "you gathered the outputs"),
}

# (batch, input features k, outputs): k divides by no world size, or is smaller than it.
ROW_CASES = ((6, 10, 4), (1, 7, 5), (3, 3, 2))
ROW_COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
                   "reduce_scatter", "reduce_scatter_tensor", "broadcast")


def _row_inputs(case: tuple, seed: int):
    import torch

    batch, features, outputs = case
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, features, generator=generator),
            torch.randn(outputs, features, generator=generator),
            torch.randn(outputs, generator=generator))


def row_rank_task(namespace: dict, rank: int, world_size: int) -> list:
    import torch

    mine = learner(namespace, "row_parallel_forward")
    results = []
    for index, case in enumerate(ROW_CASES):
        h, weight, bias = _row_inputs(case, index)
        columns = torch.tensor_split(torch.arange(case[1]), world_size)[rank]
        seen: List[tuple] = []
        given = (h[:, columns].clone(), weight[:, columns].clone(), bias.clone())
        kept = [tensor.clone() for tensor in given]
        with called(ROW_COLLECTIVES, seen):
            got = mine(*given)
        results.append({"got": got.detach().clone() if torch.is_tensor(got) else got,
                        "seen": seen, "columns": len(columns),
                        "changed": [name for name, now, before in zip(
                            ("h_local", "weight_local", "bias"), given, kept)
                            if not torch.equal(now, before)]})
    return results


def row_tolerance(h, weight, bias):
    """Per element: a dot product of k terms summed in any grouping over the ranks, and
    the bias: k + 1 roundings, γ_{k+1} relative to |h| |W|ᵀ + |b| (Higham 2002, §3.1)."""
    return gamma(h.shape[1] + 1) * (h.double().abs() @ weight.double().abs().T
                                   + bias.double().abs())


def row_judge(ranks: List[list]) -> tuple:
    n = len(ranks)
    for index, case in enumerate(ROW_CASES):
        h, weight, bias = _row_inputs(case, index)
        exact = h.double() @ weight.double().T + bias.double()
        tolerance = row_tolerance(h, weight, bias)
        for rank, cases in enumerate(ranks):
            result = cases[index]
            message = (_row_calls(result["seen"], case) or
                       _row_values(result["got"], exact, tolerance, h, weight, bias, rank, n))
            if message:
                return failed(f"batch {case[0]}, {case[1]} input features over {n} ranks "
                              f"(rank {rank} holds {result['columns']}): {message}")
    changed = next(((rank, cases) for rank, cases in enumerate(ranks)
                    for result in cases if result.get("changed")), None)
    if changed:
        rank, cases = changed
        name = next(result["changed"][0] for result in cases if result.get("changed"))
        return failed(f"the right output, but rank {rank}'s call changed the {name} it was "
                      f"given: the layer's {name} is the caller's (the bias and weights are "
                      "the model's, used again at the next forward) — compute into new "
                      "tensors (bias / world_size, not bias /= world_size)")
    return passed(f"the single-process layer's output on every rank, in {len(ROW_CASES)} "
                  "cases (uneven and empty slices, a batch of one), with one all-reduce each")


def _row_calls(seen: List[tuple], case: tuple):
    names = [name for name, _ in seen]
    if "all_reduce" not in names:
        if "reduce" in names:
            return ("dist.reduce leaves the sum on one rank only: every rank needs the "
                    "layer's output (the next layer runs on all of them) — all_reduce it")
        if "all_gather" in names or "all_gather_into_tensor" in names:
            return ("you gathered the outputs, as after a column-parallel layer: a row-parallel "
                    "layer sums its ranks' partial products — all-reduce them (gathered, every "
                    "rank holds world-size copies of the output before it sums them)")
        return None  # the values say what is missing
    reduces = [numel for name, numel in seen if name == "all_reduce"]
    if len(seen) != 1:
        return (f"your cell called {', '.join(names)}: the forward of a row-parallel layer "
                "is one all-reduce of the partial output")
    if reduces[0] != case[0] * case[2]:
        return (f"your all-reduce held {reduces[0]} elements; the partial output holds "
                f"batch × out = {case[0] * case[2]}")
    return None


def _row_values(got, exact, tolerance, h, weight, bias, rank: int, n: int):
    import torch

    if not torch.is_tensor(got) or tuple(got.shape) != tuple(exact.shape):
        shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
        return (f"rank {rank} returned {shape}, the layer's output is {tuple(exact.shape)}: "
                "a row-parallel layer sums its ranks' partial products (each of the whole "
                "output's shape), it does not concatenate them")
    if got.dtype != h.dtype:
        return (f"rank {rank} returned {got.dtype}, the layer's inputs are {h.dtype}: the "
                "next layer expects the dtype it was given — keep the output in float32")
    gap = (got.double() - exact).abs()
    if float((gap - tolerance).max()) <= 0:
        return None
    where = f"rank {rank}'s output differs from the layer's by {float(gap.max()):.3g}"
    return where + _row_why(got.double(), exact, bias.double(), n)


def _row_why(got, exact, bias, n: int) -> str:
    import torch

    def close(a, b):
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))

    if close(got, exact + (n - 1) * bias):
        return (f": the bias counted {n} times — every rank added it before the sum; the bias "
                "is added once, after the all-reduce")
    if close(got, exact - bias):
        return (": the bias is missing — every rank adds it to the summed output, once, "
                "after the all-reduce")
    if close(got, (exact - bias) / n + bias):
        return (f": the sum divided by {n} — the partial products add up to the output; do "
                "not average them as data parallelism averages gradients")
    if bool(torch.allclose(got, exact, rtol=2 ** -7, atol=2 ** -7 * float(exact.abs().max()))):
        return (": off by a 16-bit float's rounding (float16 keeps 11 bits, bfloat16 8) — the "
                "product or the all-reduce ran in half precision; keep the partial output in "
                "float32, the layer's dtype")
    return (": it is not the sum over the ranks — a partial sum of this rank's features "
            "only? all-reduce the partial output, so that every rank holds the sum")


EXERCISES = [
    Exercise("11.accumulate", ACCUMULATE_STATEMENT, ACCUMULATE_SKELETON, ACCUMULATE_REFERENCE,
             ACCUMULATE_WRONG, accumulate_judge, names=("accumulated_step",)),
    Exercise("11.zero1_step", ZERO_STATEMENT, ZERO_SKELETON, ZERO_REFERENCE, ZERO_WRONG,
             zero_judge, rank_task=zero_rank_task, names=("zero1_step",),
             forbidden=("torch.distributed.optim",)),
    Exercise("11.row_parallel", ROW_STATEMENT, ROW_SKELETON, ROW_REFERENCE, ROW_WRONG,
             row_judge, rank_task=row_rank_task, names=("row_parallel_forward",),
             forbidden=("torch.distributed.tensor",)),
]
