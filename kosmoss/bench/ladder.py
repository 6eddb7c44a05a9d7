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
- ``graphs-k8``: + 8 steps per graph replay;
- ``bf16-store``: + the inputs held on the GPU already normalised, in bfloat16: no
  per-step normalisation and cast of the batch, half the bytes gathered. Exact: autocast
  would cast the same normalised float32 values to the same bfloat16 ones.

Off the ladder: ``compile-fp32`` (the CPU bench's compile row) and ``tf32`` (the eager
fp32 loop with TF32 matmuls: float32's own tensor-core path).

The limit (:func:`device_limits`, :func:`sample_costs`): a step must read every sample's
inputs and targets once from the GPU's memory (``bytes_per_sample`` ÷ memory bandwidth)
and do its arithmetic (``flop_per_sample`` ÷ the dense bf16 tensor-core peak); the larger
of the two times bounds samples/s. The bandwidth is read from the device (NVML: memory
clock × bus width), the peaks from NVIDIA's datasheets; both printed with their source.
Each rung also has a limit of its own (:func:`rung_bound`): its arithmetic's peak (fp32
matmuls run on CUDA cores, at about a fifteenth of bf16's tensor-core peak on an H100)
and the bytes its inputs take (half for ``bf16-store``).

Every rung trains on the same batches in the same order as the raw loop
(:func:`kosmoss.bench.baselines.limit_setup`), and its validation loss stays within the
bf16 tolerance of the eager fp32 loop's (tests/bench/test_ladder.py).

    python -m kosmoss.bench.ladder --dataset PATH --device cuda --batch-size 16384 --steps 300
    python -m kosmoss.bench.ladder ... --rungs resident,graphs --out ladder.json
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core.commandline import OneLineParser, run_command
from ..core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
from ..core.errors import UsageError
from ..core.files import atomic_write_json
from ..data.splits import split_sizes
from ..data.store import open_dataset
from ..run.graphs import bf16_inputs
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


def sample_costs(n_x: int, hidden: Sequence[int], n_y: int,
                 input_bytes: int = 4) -> Dict[str, float]:
    """What one training sample costs at least: the bytes of its inputs (``input_bytes``
    each: 4 as prepared, 2 stored in bf16) and float32 targets read once, and the
    multiply-adds × 2 of forward (every layer) and backward (each weight's gradient, and the
    gradient of every layer's input but the first's)."""
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    return {"bytes_per_sample": float(input_bytes * n_x + 4 * n_y),
            "forward_flop_per_sample": float(forward),
            "flop_per_sample": float(forward + backward),
            "parameters": float(sum(i * o + o for i, o in layers))}


class Sheet(NamedTuple):
    """A GPU's dense peaks (FLOP/s) per matmul format and its memory bandwidth (bytes/s)."""

    fp32: float  # CUDA cores: float32 matmuls at torch's default precision ("highest")
    tf32: float
    bf16: float
    bandwidth: float
    source: str


# NVIDIA's datasheets, dense figures (the sheets print TF32 and BF16 "with sparsity", twice
# these). Lightning's get_available_flops holds the same figures for these chips but finds
# no entry for a device named "NVIDIA H200", and lists the H200's sparse ones: hence a table
# here (tests/bench/test_ladder.py checks it against Lightning's where both have a chip).
_A100_80GB = Sheet(19.5e12, 156e12, 312e12, 2.039e12, "NVIDIA A100 datasheet: 19.5 TFLOPS "
                   "FP32, 156 TF32, 312 BF16 dense; 2,039 GB/s")
DATASHEETS = {
    "H200": Sheet(67e12, 494.5e12, 989.5e12, 4.8e12, "NVIDIA H200 SXM datasheet: 67 TFLOPS "
                  "FP32, 494.5 TF32, 989.5 BF16 dense; 4.8 TB/s"),
    "H100 80GB HBM3": Sheet(66.9e12, 494.7e12, 989.4e12, 3.35e12, "NVIDIA H100 SXM datasheet: "
                            "67 TFLOPS FP32, 494.7 TF32, 989.4 BF16 dense; 3.35 TB/s"),
    "H100 PCIe": Sheet(51.2e12, 378e12, 756e12, 2.0e12, "NVIDIA H100 PCIe datasheet: 51 TFLOPS "
                       "FP32, 378 TF32, 756 BF16 dense; 2 TB/s"),
    "A100-SXM4-80GB": _A100_80GB,
    "A100-SXM4-40GB": _A100_80GB._replace(  # the same chip, less and slower memory
        bandwidth=1.555e12, source=_A100_80GB.source.replace("2,039", "1,555")),
    "L4": Sheet(30.3e12, 60e12, 121e12, 0.3e12, "NVIDIA L4 datasheet: 30.3 TFLOPS FP32, 60 "
                "TF32, 121 BF16 dense; 300 GB/s"),
}


def datasheet(device_name: str) -> Optional[Sheet]:
    return next((v for k, v in DATASHEETS.items() if k in device_name), None)


def device_limits(device: torch.device) -> Optional[Dict[str, object]]:
    """Memory bandwidth and dense peaks of a CUDA device, with where each came from;
    None on a CPU (the ladder's limit is a GPU's)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    sheet = datasheet(name)
    bandwidth, source = _nvml_bandwidth(device), "NVML: max memory clock × bus width × 2"
    if bandwidth is None and sheet:
        bandwidth, source = sheet.bandwidth, sheet.source
    peaks = {k: getattr(sheet, k) for k in ("fp32", "tf32", "bf16")} if sheet else None
    return {"device": name, "memory_bandwidth_bytes_s": bandwidth, "bandwidth_source": source,
            "peak_bf16_flop_s": sheet.bf16 if sheet else None, "peak_flop_s": peaks,
            "peak_source": sheet.source if sheet else f"{name}: not in kosmoss's datasheet table"}


def peak(limits: Dict[str, object], arithmetic: str) -> Optional[float]:
    """The dense peak of one matmul format; limits recorded before the other formats were
    kept (they held bf16's alone) find theirs in the datasheet of the device they name."""
    if arithmetic == "bf16" and limits.get("peak_bf16_flop_s"):
        return limits["peak_bf16_flop_s"]
    peaks = limits.get("peak_flop_s")
    if peaks:
        return peaks.get(arithmetic)
    sheet = datasheet(str(limits.get("device", "")))
    return getattr(sheet, arithmetic) if sheet else None


def _nvml_bandwidth(device: torch.device) -> Optional[float]:
    try:
        from nvitop.api import libnvml

        handle = libnvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        clock_mhz = libnvml.nvmlDeviceGetMaxClockInfo(handle, libnvml.NVML_CLOCK_MEM)
        bus_bits = libnvml.nvmlDeviceGetMemoryBusWidth(handle)
        return 2.0 * clock_mhz * 1e6 * bus_bits / 8  # double data rate
    except Exception:  # no NVML, or a call it lacks: the datasheet decides
        return None


def bound(costs: Dict[str, float], limits: Optional[Dict[str, object]],
          arithmetic: str = "bf16") -> Dict[str, object]:
    """samples/s no step can beat with matmuls in ``arithmetic``, and what sets it."""
    if not limits:
        return {"limit_samples_per_s": None, "bound_by": None}
    by_memory = (limits["memory_bandwidth_bytes_s"] or 0) / costs["bytes_per_sample"] or None
    flop_s = peak(limits, arithmetic)
    by_compute = flop_s / costs["flop_per_sample"] if flop_s else None
    candidates = {k: v for k, v in (("memory", by_memory), (f"{arithmetic} compute", by_compute))
                  if v}
    if not candidates:
        return {"limit_samples_per_s": None, "bound_by": None}
    what = min(candidates, key=candidates.get)
    return {"limit_samples_per_s": candidates[what], "bound_by": what,
            "memory_bound_samples_per_s": by_memory, "compute_bound_samples_per_s": by_compute}


def rung_bound(step: Rung, costs: Dict[str, float], stored_costs: Dict[str, float],
               limits: Optional[Dict[str, object]]) -> Dict[str, object]:
    """A rung's own limit: the peak of the format its matmuls run in, the bytes its inputs
    take. An fp32 rung cannot pass the CUDA cores' fp32 peak, however it is fed."""
    return bound(stored_costs if step.bf16_store else costs, limits, step.arithmetic)


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
        if step.bf16_store:  # normalised once, in bf16: the values autocast would make
            self.x = bf16_inputs(limit.x, model.x_mean, model.x_std)
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
        if not self.rung.bf16_store:  # the same in-place normalisation as LitMLP's
            xb = xb.sub_(self.x_mean).div_(self.x_std)
        with torch.autocast(**self.autocast):
            prediction = self.net(xb)
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
    if step.bf16_store and not step.bf16:
        raise UsageError(f"rung {step.name}: bf16_store stores what bf16 autocast would cast")
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if step.tf32 else "highest")
    try:
        return _run_rung(limit, step, batch_size, steps, device, sampler_seed)
    finally:  # a process-wide setting: the next rung starts from torch's own
        torch.set_float32_matmul_precision(precision)


def _run_rung(limit: Limit, step: Rung, batch_size: int, steps: int, device: torch.device,
              sampler_seed: int) -> Dict[str, object]:
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
            "step_time_cv": clock.step_cv, "arithmetic": step.arithmetic,
            **{f"uses_{k}": v for k, v in asdict(step).items() if k not in ("name", "removes")}}


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
               log: Callable[[str], None] = print,
               also: Sequence[Rung] = ()) -> Dict[str, object]:
    """Every rung at the first batch size, the last rung at the others ("max": the largest
    power of two the training split holds), then the rungs ``also`` (off the ladder, rows
    marked ``off_ladder``) at the first; the limit beside."""
    prepared = open_dataset(dataset, verify=False)
    n_train = split_sizes(prepared.n_samples)[0]
    batches = [largest_batch(n_train) if b == "max" else int(b) for b in batch_sizes]
    too_large = [b for b in batches if b > n_train]
    if too_large:
        raise UsageError(f"--batch-size {too_large[0]}: larger than the {n_train:,} training "
                         "samples; give a smaller one or max")
    costs = sample_costs(prepared.n_x, DEFAULT_HIDDEN, prepared.n_y)
    stored_costs = sample_costs(prepared.n_x, DEFAULT_HIDDEN, prepared.n_y, input_bytes=2)
    limits = device_limits(device)
    limit_row = bound(costs, limits)
    plan = [(r, batches[0]) for r in rungs] + [(rungs[-1], b) for b in batches[1:]]
    plan += [(r, batches[0]) for r in also]
    rows = []
    for step, batch in plan:
        limit = limit_setup(prepared, batch, device, seed)
        try:
            row = run_rung(limit, step, batch, steps, device)
        except Exception as err:  # one rung that breaks (a capture, a compile) ends no other
            if len(plan) == 1:
                raise
            rows.append({"rung": step.name, "batch_size": batch, "samples_per_s": None,
                         "off_ladder": step in also,
                         "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"})
            log(f"{step.name:12s} batch {batch:>7,}: failed: {rows[-1]['error']}")
            continue
        row["off_ladder"] = step in also
        if limit_row["limit_samples_per_s"] and row["samples_per_s"]:
            row["of_limit"] = row["samples_per_s"] / limit_row["limit_samples_per_s"]
            own = rung_bound(step, costs, stored_costs, limits)
            row["rung_limit_samples_per_s"], row["rung_bound_by"] = (
                own["limit_samples_per_s"], own["bound_by"])
            row["of_rung_limit"] = row["samples_per_s"] / own["limit_samples_per_s"]
        rows.append(row)
        log(f"{step.name:12s} batch {batch:>7,}: {row['samples_per_s'] or 0:>14,.0f} samples/s"
            + (f" ({row['of_limit']:.1%} of the limit, {row['of_rung_limit']:.1%} of its own: "
               f"{row['rung_bound_by']})" if "of_limit" in row else "")
            + f", val_loss {row['val_loss']:.5f}, set-up {row['setup_s']:.1f} s")
        del limit
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"device": str(device), "limits": limits, "costs": costs,
            "stored_costs": stored_costs, **limit_row,
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
    parser.add_argument("--also", default="",
                        help="off-the-ladder rungs measured after it at the first batch, e.g. "
                             "tf32 (comma-separated)")
    parser.add_argument("--out", help="write the figures here as JSON (one rung at one batch: "
                                      "as a bench row)")
    args = parser.parse_args(argv)

    def command() -> None:
        rungs = checked_rungs(args.rungs, args.device)
        also = checked_rungs(args.also, args.device, flag="--also") if args.also else []
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
        if args.out:
            checked_out(Path(args.out))  # before minutes of GPU time, not after
        figures = run_ladder(dataset, rungs, args.batch_size, args.steps, device, args.seed,
                             also=also)
        if args.out:
            single = len(figures["rows"]) == 1
            try:
                atomic_write_json(args.out, as_result(figures) if single else figures)
            except OSError as err:
                raise UsageError(f"--out {args.out}: could not be written ({err.strerror}); "
                                 "the rows are printed above") from None

    return run_command(parser.prog, command, {})


def checked_out(path: Path) -> None:
    """--out: a new file in a folder that exists and can be written, or an earlier ladder's
    JSON (replaced); never a folder, a device or FIFO, or a file of the user's."""
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory; give a file path")
    if path.exists() and not path.is_file():
        raise UsageError(f"--out {path}: is not a regular file (a device, a FIFO or a socket); "
                         "give a file path")
    if path.exists() and not _earlier_ladder(path):
        raise UsageError(f"--out {path}: exists and is not a ladder's JSON; give a new path "
                         "(nothing of yours is overwritten)")
    parent = path.absolute().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: folder {parent} does not exist or cannot be written")


def _earlier_ladder(path: Path) -> bool:
    try:
        if path.stat().st_size > 2**24:
            return False
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and ("rows" in found or "rung" in found)


def checked_rungs(names: str, device: str, flag: str = "--rungs") -> List[Rung]:
    try:
        rungs = [rung(name) for name in names.split(",") if name]
    except UsageError as err:
        raise UsageError(str(err).replace("--rungs", flag, 1)) from None
    if not rungs:
        raise UsageError(f"{flag}: name at least one rung")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU here; give --device cpu")
    needs_gpu = [r.name for r in rungs if r.needs_cuda]
    if device == "cpu" and needs_gpu:
        raise UsageError(f"{flag} {','.join(needs_gpu)}: need a CUDA GPU (host-to-device "
                         "copies, CUDA graphs, TF32); leave them out with --device cpu")
    return rungs


if __name__ == "__main__":
    sys.exit(main())
