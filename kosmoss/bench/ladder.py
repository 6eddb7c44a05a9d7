"""The ladder: the raw training loop of kosmoss's MLP made faster one change at a time,
each rung measured and set against what this GPU could do at most.

Rungs, each adding one change to the one before (:data:`RUNGS`):

- ``host``: the data in host memory; each batch gathered there and copied to the GPU
  through pinned memory (what a loader feeding a GPU does);
- ``resident``: both splits resident on the GPU, the batch gathered there (``raw-gpu``);
- ``bf16``: + bfloat16 autocast (the tensor cores' format);
- ``fused``: + fused Adam (one kernel updates every parameter);
- ``compile``: + ``torch.compile`` of the network (inductor fuses its elementwise work);
- ``graphs``: + the whole step (batch gather, forward, backward, Adam) captured once in a
  CUDA graph and replayed: no Python and no kernel launches per step;
- ``graphs-k8``: + 8 steps per graph replay.

The limit (:func:`device_limits`, :func:`sample_costs`): a step must read every sample's
inputs and targets once from the GPU's memory (``bytes_per_sample`` ÷ memory bandwidth)
and do its arithmetic (``flop_per_sample`` ÷ the dense bf16 tensor-core peak); the larger
of the two times bounds samples/s. The bandwidth is read from the device (NVML: memory
clock × bus width), the peak from NVIDIA's datasheets; both printed with their source.

Every rung trains on the same batches in the same order as the raw loop
(:func:`kosmoss.bench.baselines.limit_setup`), and its validation loss stays within the
bf16 tolerance of the eager fp32 loop's (tests/bench/test_ladder.py).

    python -m kosmoss.bench.ladder --dataset PATH --device cuda --batch-size 16384 --steps 300
    python -m kosmoss.bench.ladder ... --rungs resident,graphs --out ladder.json
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core.commandline import OneLineParser, run_command
from ..core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
from ..core.errors import UsageError
from ..data.loading import SPLITS, split_indices
from ..data.store import open_dataset
from ..run.throughput import StepClock
from .baselines import Limit, _validate, limit_setup
from .rungs import RUNG_NAMES, RUNGS, Rung, rung

# How close a rung's losses stay to the eager fp32 loop's on the same batches. Before any
# update, bf16 rounds each operand to 8 significant bits (2^-8 relative) and the loss of a
# batch averages thousands of such terms: well within 1 %. After training, rounding has
# moved the path, not what is learnt: on an H100 (2026-11-26, 301 steps at batch 16,384)
# bf16 ended 11 % below fp32, the compiled kernels 5 % above eager; 25 % bounds both.
FIRST_LOSS_TOLERANCE = 0.01
TRAINED_LOSS_TOLERANCE = 0.25


# ---- the limit


def sample_costs(n_x: int, hidden: Sequence[int], n_y: int) -> Dict[str, float]:
    """What one training sample costs at least: the bytes of its inputs and targets read
    once (float32), and the multiply-adds × 2 of forward (every layer) and backward (each
    weight's gradient, and the gradient of every layer's input but the first's)."""
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    return {"bytes_per_sample": 4.0 * (n_x + n_y), "forward_flop_per_sample": float(forward),
            "flop_per_sample": float(forward + backward),
            "parameters": float(sum(i * o + o for i, o in layers))}


# NVIDIA's datasheets: dense bf16 tensor-core peak and memory bandwidth (SXM boards).
DATASHEETS = {
    "H200": (989e12, 4.8e12, "NVIDIA H200 datasheet: 989 TFLOPS dense BF16, 4.8 TB/s"),
    "H100 80GB HBM3": (989e12, 3.35e12, "NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16, "
                       "3.35 TB/s"),
    "H100 PCIe": (756e12, 2.0e12, "NVIDIA H100 PCIe datasheet: 756 TFLOPS dense BF16, 2 TB/s"),
    "A100-SXM4-80GB": (312e12, 2.039e12, "NVIDIA A100 datasheet: 312 TFLOPS BF16, 2,039 GB/s"),
    "A100-SXM4-40GB": (312e12, 1.555e12, "NVIDIA A100 datasheet: 312 TFLOPS BF16, 1,555 GB/s"),
    "L4": (121e12, 0.3e12, "NVIDIA L4 datasheet: 121 TFLOPS dense BF16, 300 GB/s"),
}


def device_limits(device: torch.device) -> Optional[Dict[str, object]]:
    """Memory bandwidth and dense bf16 peak of a CUDA device, with where each came from;
    None on a CPU (the ladder's limit is a GPU's)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    sheet = next((v for k, v in DATASHEETS.items() if k in name), None)
    bandwidth, source = _nvml_bandwidth(device), "NVML: max memory clock × bus width × 2"
    if bandwidth is None and sheet:
        bandwidth, source = sheet[1], sheet[2]
    return {"device": name, "memory_bandwidth_bytes_s": bandwidth, "bandwidth_source": source,
            "peak_bf16_flop_s": sheet[0] if sheet else None,
            "peak_source": sheet[2] if sheet else f"{name}: not in kosmoss's datasheet table"}


def _nvml_bandwidth(device: torch.device) -> Optional[float]:
    try:
        from nvitop.api import libnvml

        handle = libnvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        clock_mhz = libnvml.nvmlDeviceGetMaxClockInfo(handle, libnvml.NVML_CLOCK_MEM)
        bus_bits = libnvml.nvmlDeviceGetMemoryBusWidth(handle)
        return 2.0 * clock_mhz * 1e6 * bus_bits / 8  # double data rate
    except Exception:  # no NVML, or a call it lacks: the datasheet decides
        return None


def bound(costs: Dict[str, float], limits: Optional[Dict[str, object]]) -> Dict[str, object]:
    """samples/s no step can beat, and what sets it."""
    if not limits:
        return {"limit_samples_per_s": None, "bound_by": None}
    by_memory = (limits["memory_bandwidth_bytes_s"] or 0) / costs["bytes_per_sample"] or None
    by_compute = ((limits["peak_bf16_flop_s"] / costs["flop_per_sample"])
                  if limits["peak_bf16_flop_s"] else None)
    candidates = {k: v for k, v in (("memory", by_memory), ("bf16 compute", by_compute)) if v}
    if not candidates:
        return {"limit_samples_per_s": None, "bound_by": None}
    what = min(candidates, key=candidates.get)
    return {"limit_samples_per_s": candidates[what], "bound_by": what,
            "memory_bound_samples_per_s": by_memory, "compute_bound_samples_per_s": by_compute}


# ---- one rung


class LadderLoop:
    """The raw loop with a rung's changes: the same model, batches and order as
    ``raw-gpu``; ``run(batches)`` makes one optimizer step per batch and returns the loss
    of each as a tensor (read only when asked: no wait per step)."""

    def __init__(self, limit: Limit, step: Rung, device: torch.device):
        self.rung, self.device, self.limit = step, device, limit
        model = limit.model
        self.x, self.y = limit.x, limit.y
        if step.host_data:  # gathered on the host, copied through pinned memory
            self.x, self.y = limit.x.cpu(), limit.y.cpu()
        self.x_mean, self.x_std = model.x_mean, model.x_std
        self.normalize_y = model.normalize_y
        fused = {"fused": True} if step.fused else {}
        self.optimizer = torch.optim.Adam(model.net.parameters(), lr=DEFAULT_LR,
                                          capturable=step.graphs, **fused)
        self.net = torch.compile(model.net) if step.compile else model.net
        self.autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=step.bf16)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.compile_s = 0.0

    def _gather(self, idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.rung.host_data:  # idx is on the host too
            xb = torch.index_select(self.x, 0, idx).pin_memory()
            yb = torch.index_select(self.y, 0, idx).pin_memory()
            return xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
        return torch.index_select(self.x, 0, idx), torch.index_select(self.y, 0, idx)

    def _step(self, idx: torch.Tensor) -> torch.Tensor:
        xb, yb = self._gather(idx)
        with torch.autocast(**self.autocast):  # the same in-place normalisation as LitMLP's
            prediction = self.net(xb.sub_(self.x_mean).div_(self.x_std))
            loss = torch.nn.functional.mse_loss(prediction.float(), self.normalize_y(yb))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def eager(self, idx: torch.Tensor) -> torch.Tensor:
        return self._step(idx)


class GraphedSteps:
    """K steps captured once in a CUDA graph (PyTorch's whole-network capture: warm-up on a
    side stream, then capture; Adam ``capturable``); each replay trains the K batches whose
    indices were copied into its static buffer. The steps before capture (warm-up) are real
    steps of the run, on its first batches."""

    WARMUP_STEPS = 3

    def __init__(self, loop: LadderLoop, batch_size: int, k: int):
        self.loop, self.k = loop, k
        self.static_idx = torch.zeros(k, batch_size, dtype=torch.long, device=loop.device)
        self.static_losses: Optional[torch.Tensor] = None
        self.graph: Optional[torch.cuda.CUDAGraph] = None

    def warm_up(self, idx: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.Stream(self.loop.device)
        stream.wait_stream(torch.cuda.current_stream(self.loop.device))
        with torch.cuda.stream(stream):
            loss = self.loop.eager(idx)
        torch.cuda.current_stream(self.loop.device).wait_stream(stream)
        return loss

    def capture(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.loop.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.static_losses = torch.stack([self.loop._step(self.static_idx[j])
                                              for j in range(self.k)])

    def replay(self, indices: torch.Tensor) -> torch.Tensor:
        self.static_idx.copy_(indices, non_blocking=True)
        self.graph.replay()
        return self.static_losses.clone()  # the next replay overwrites them


def run_rung(limit: Limit, step: Rung, batch_size: int, steps: int, device: torch.device,
             sampler_seed: int = 42) -> Dict[str, object]:
    """``steps`` timed optimizer steps after the warm-up (and the capture, for graphs);
    the figures of a bench row, with the compile and capture time apart."""
    if step.needs_cuda and device.type != "cuda":
        raise UsageError(f"rung {step.name}: needs a CUDA GPU")
    loop, clock = LadderLoop(limit, step, device), StepClock()
    where = torch.device("cpu") if step.host_data else device
    batches = _batches(limit, batch_size, steps + 1, where)
    started = time.perf_counter()
    done, losses = 0, []
    k = step.steps_per_replay
    graphed = GraphedSteps(loop, batch_size, k) if step.graphs else None
    # Every rung makes steps + 1 optimizer steps; the warm-up (untimed: compile, capture)
    # is one step, or enough for a graph (at least 3) that the rest fills whole replays.
    warmup = GraphedSteps.WARMUP_STEPS + (steps + 1 - GraphedSteps.WARMUP_STEPS) % k \
        if graphed else 1
    for idx in batches[:warmup]:
        losses.append(graphed.warm_up(idx) if graphed else loop.eager(idx))
        done += 1
    if graphed:
        graphed.capture()
    _sync(device)
    setup_s = time.perf_counter() - started
    clock.step_done(0, device)  # the interval starts here
    remaining = batches[done:]
    for lo in range(0, len(remaining), k):
        group = remaining[lo:lo + k]
        if graphed:
            losses.extend(graphed.replay(torch.stack(group)).unbind())
        else:
            losses.extend(loop.eager(idx) for idx in group)
        done += len(group)
        clock.step_done(batch_size * len(group), device)
    clock.pause(device)
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=step.bf16)
    point = _validate(limit.model, limit.val_x, limit.val_y, batch_size, autocast, done)
    return {"rung": step.name, "removes": step.removes, "batch_size": batch_size,
            "samples_per_s": clock.samples_per_s, "global_step": done,
            "first_step_unix": clock.first_step_unix, "setup_s": setup_s,
            "val_loss": point["val_loss"], "val_curve": [point],
            "train_losses": [float(loss) for loss in torch.stack(losses).cpu()],
            "step_time_cv": clock.step_cv, **{f"uses_{k}": v for k, v in asdict(step).items()
                                              if k not in ("name", "removes")}}


def _batches(limit: Limit, batch_size: int, count: int, device: torch.device) -> List:
    """The raw loop's batch order, as device index tensors (the sampler's epochs in turn)."""
    out, epoch = [], 0
    while len(out) < count:
        limit.sampler.set_epoch(epoch)
        for batch in limit.sampler:
            if len(batch) == batch_size:  # a graph's static buffer takes full batches only
                out.append(torch.from_numpy(np.asarray(batch)).to(device))
        epoch += 1
    return out[:count]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def largest_batch(n_train: int) -> int:
    """The largest power of two a training split of ``n_train`` holds: every step full."""
    return 1 << (max(1, n_train).bit_length() - 1)


def run_ladder(dataset: Path, rungs: Sequence[Rung], batch_sizes: Sequence[str], steps: int,
               device: torch.device, seed: int = 42,
               log: Callable[[str], None] = print) -> Dict[str, object]:
    """Every rung at the first batch size, the last rung at the others ("max": the largest
    power of two the training split holds); the limit beside."""
    prepared = open_dataset(dataset, verify=False)
    n_train = len(split_indices(prepared.n_samples, SPLITS, seed)[0])
    batches = [largest_batch(n_train) if b == "max" else int(b) for b in batch_sizes]
    too_large = [b for b in batches if b > n_train]
    if too_large:
        raise UsageError(f"--batch-size {too_large[0]}: larger than the {n_train:,} training "
                         "samples; give a smaller one or max")
    costs = sample_costs(prepared.n_x, DEFAULT_HIDDEN, prepared.n_y)
    limits = device_limits(device)
    limit_row = bound(costs, limits)
    plan = [(r, batches[0]) for r in rungs] + [(rungs[-1], b) for b in batches[1:]]
    rows = []
    for step, batch in plan:
        limit = limit_setup(prepared, batch, device, seed)
        try:
            row = run_rung(limit, step, batch, steps, device)
        except Exception as err:  # one rung that breaks (a capture, a compile) ends no other
            if len(plan) == 1:
                raise
            rows.append({"rung": step.name, "batch_size": batch, "samples_per_s": None,
                         "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"})
            log(f"{step.name:12s} batch {batch:>7,}: failed: {rows[-1]['error']}")
            continue
        if limit_row["limit_samples_per_s"] and row["samples_per_s"]:
            row["of_limit"] = row["samples_per_s"] / limit_row["limit_samples_per_s"]
        rows.append(row)
        log(f"{step.name:12s} batch {batch:>7,}: {row['samples_per_s'] or 0:>14,.0f} samples/s"
            + (f" ({row['of_limit']:.1%} of the limit)" if "of_limit" in row else "")
            + f", val_loss {row['val_loss']:.5f}, set-up {row['setup_s']:.1f} s")
        del limit
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"device": str(device), "limits": limits, "costs": costs, **limit_row,
            "steps": steps, "rows": rows}


def as_result(figures: Dict[str, object]) -> Dict[str, object]:
    """One rung at one batch as a bench row reads it (``kosmoss.bench.measure``): the row's
    figures with the limit beside them."""
    (row,) = figures["rows"]
    return {**row, **{key: figures[key] for key in ("limits", "costs", "limit_samples_per_s",
                                                     "bound_by")}}


def main(argv: Optional[List[str]] = None) -> int:
    parser = OneLineParser(prog="python -m kosmoss.bench.ladder",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a prepared dataset folder")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch-size", nargs="+", default=["16384"],
                        help="the ladder at the first; its last rung at each other; max: the "
                             "largest power of two the training split holds")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rungs", default=",".join(r.name for r in RUNGS),
                        help=f"comma-separated, in order, from {', '.join(RUNG_NAMES)}")
    parser.add_argument("--out", help="write the figures here as JSON (one rung at one batch: "
                                      "as a bench row)")
    args = parser.parse_args(argv)

    def command() -> None:
        rungs = checked_rungs(args.rungs, args.device)
        if args.steps < 8:
            raise UsageError(f"--steps {args.steps}: at least 8 (graphs replay 8 steps)")
        bad = [b for b in args.batch_size if b != "max" and not (b.isdigit() and int(b) >= 1)]
        if bad:
            raise UsageError(f"--batch-size {bad[0]}: a whole number >= 1, or max")
        device = torch.device(args.device)
        dataset = Path(args.dataset)
        if not (dataset / "metadata.json").is_file():
            raise UsageError(f"--dataset {dataset}: not a prepared dataset (no metadata.json); "
                             "prepare one with kosmoss data prepare")
        figures = run_ladder(dataset, rungs, args.batch_size, args.steps, device, args.seed)
        if args.out:
            single = len(figures["rows"]) == 1
            Path(args.out).write_text(json.dumps(as_result(figures) if single else figures,
                                                 indent=2))

    return run_command(parser.prog, command, {})


def checked_rungs(names: str, device: str) -> List[Rung]:
    rungs = [rung(name) for name in names.split(",") if name]
    if not rungs:
        raise UsageError("--rungs: name at least one rung")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU here; give --device cpu")
    needs_gpu = [r.name for r in rungs if r.needs_cuda]
    if device == "cpu" and needs_gpu:
        raise UsageError(f"--rungs {','.join(needs_gpu)}: need a CUDA GPU (host-to-device "
                         "copies, CUDA graphs); leave them out with --device cpu")
    return rungs


if __name__ == "__main__":
    sys.exit(main())
