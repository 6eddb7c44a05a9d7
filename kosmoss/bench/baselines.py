"""What the bench holds kosmoss against, each run in a process of its own:

- ``raw``: the limit. The training and validation splits already in memory as tensors
  (on the GPU for a GPU row), then nothing but forward, backward and Adam: the same
  model, batch, learning rate, threads, split and batch order as a kosmoss run, timed
  the way :class:`kosmoss.run.callbacks.ThroughputMeter` times one (first step and
  validation left out), validated after every epoch as kosmoss is;
- ``lightning``: the raw loop's data, model, batches and step, driven by
  ``Trainer(barebones=True)`` through a DataLoader: Lightning's own loop and automatic
  optimisation with nothing kosmoss adds (no callback of kosmoss's, no logger, no
  checkpoint, no memory-mapped shards). Its ratio to ``raw`` is what a stock Lightning
  Trainer with automatic optimisation costs; ``kosmoss`` ÷ ``lightning`` is what kosmoss
  adds on top, less the per-hook Python its own Trainer leaves out;
- ``fabric``: the raw loop itself with its model and Adam set up by Lightning Fabric
  (``Fabric(devices=1)``, 32-true; bf16 stays the loop's own autocast) and its backward
  through ``fabric.backward``: what a training loop of one's own on Fabric, Lightning's
  strategies and precision under it, pays over the limit (the lever left at small batches);
- ``loader-course``: the original course's loader, one memmap opened per sample;
- ``loader-kosmoss``: :class:`FlattenedDataset`'s batched reads of the same batches.

    python -m kosmoss.bench.baselines raw --dataset DIR --batch-size 256 --steps 100 --out r.json
    python -m kosmoss.bench.baselines lightning --dataset DIR --batch-size 256 --steps 100 --out l.json
    python -m kosmoss.bench.baselines fabric --dataset DIR --batch-size 256 --steps 100 --out f.json
"""
from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import List, NamedTuple, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from ..core.commandline import OneLineParser
from ..core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
from ..data.loading import FlattenedDataset, RankBatchSampler, split_indices
from ..data.splits import SPLITS
from ..data.store import PreparedDataset, open_dataset
from ..devices.memory import peak_host_rss_mib
from ..model import LitMLP
from ..run.lean import LeanLitMLP
from ..run.allocator import pin_malloc_thresholds
from ..run.throughput import StepClock

WHAT = ("raw", "lightning", "fabric", "loader-course", "loader-kosmoss")
LOADER_MIN_S = 1.0


class PerSampleMemmapDataset(Dataset):
    """The original course's loader: every sample opens its shard as a memmap."""

    def __init__(self, prepared: PreparedDataset):
        self.folder, self.shards = prepared.path, prepared.shards
        self.offsets = np.cumsum([0] + [s.rows for s in self.shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index):
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        row = index - self.offsets[shard]
        x = np.load(self.folder / self.shards[shard].x_file, mmap_mode="r")[row]
        y = np.load(self.folder / self.shards[shard].y_file, mmap_mode="r")[row]
        return torch.tensor(x), torch.tensor(y)


class Limit(NamedTuple):
    """What the raw loop and the Lightning loop start from, built the same way for both."""

    x: torch.Tensor
    y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    model: LitMLP
    sampler: RankBatchSampler


def limit_setup(prepared: PreparedDataset, batch_size: int, device: torch.device,
                seed: int) -> Limit:
    """Both splits in memory as tensors on ``device``, the model seeded as a kosmoss run
    seeds it, and the sampler of a kosmoss run's batch order."""
    train_idx, val_idx, _ = split_indices(prepared.n_samples, SPLITS, seed)
    data = FlattenedDataset(prepared, mode="efficient")  # read once: no copy in RAM first
    x, y = (t.to(device) for t in data.read(train_idx))
    val_x, val_y = (t.to(device) for t in data.read(val_idx))
    torch.manual_seed(seed)
    # As the run path trains it (kosmoss.run.lean): the Lightning row's step costs what
    # kosmoss's does, and its train_loss is not logged under barebones.
    model = LeanLitMLP(prepared.n_x, DEFAULT_HIDDEN, prepared.n_y, lr=DEFAULT_LR,
                       stats=prepared.statistics()).to(device)
    # Positions in x follow train_idx (sorted), so this is the batch order of a kosmoss run.
    sampler = RankBatchSampler(np.arange(len(train_idx)), batch_size, seed=seed)
    return Limit(x, y, val_x, val_y, model, sampler)


def raw_loop(prepared: PreparedDataset, batch_size: int, steps: int, device: torch.device,
             bf16: bool, seed: int, fabric: bool = False) -> dict:
    """``steps`` timed steps after one warm-up step; returns the figures. ``fabric``: the
    model and optimizer set up by Lightning Fabric, backward through it."""
    x, y, val_x, val_y, model, sampler = limit_setup(prepared, batch_size, device, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=DEFAULT_LR)
    net, backward = model.net, torch.Tensor.backward
    if fabric:
        net, optimizer, backward = on_fabric(model.net, optimizer, device)
    clock, curve, step = StepClock(), [], 0
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)
    for epoch in range(steps + 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        # One copy of the epoch's indices to the device, not one per step.
        order = torch.from_numpy(np.concatenate(batches)).to(device)
        bounds = np.cumsum([0] + [len(b) for b in batches])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            idx = order[lo:hi]
            xb, yb = torch.index_select(x, 0, idx), torch.index_select(y, 0, idx)
            with torch.autocast(**autocast):  # the same in-place normalisation as LitMLP's step
                loss = torch.nn.functional.mse_loss(net(xb.sub_(model.x_mean).div_(model.x_std)),
                                                    model.normalize_y(yb))
            optimizer.zero_grad(set_to_none=True)
            backward(loss)
            optimizer.step()
            step += 1
            clock.step_done(int(hi - lo), device)
            if step == steps + 1:
                break
        clock.pause(device)
        curve.append(_validate(model, val_x, val_y, batch_size, autocast, step))
        if step == steps + 1:
            break
    return _loop_figures(clock, curve, step)


def on_fabric(net: torch.nn.Module, optimizer, device: torch.device):
    """The module and optimizer as Fabric wraps them, and Fabric's backward."""
    import warnings

    from lightning_fabric import Fabric

    # This row runs on this host by design, inside an allocation or not.
    warnings.filterwarnings("ignore", "The `srun` command is available")
    runner = Fabric(accelerator="cuda" if device.type == "cuda" else "cpu", devices=1,
                    precision="32-true")
    wrapped, optimizer = runner.setup(net, optimizer)
    return wrapped, optimizer, runner.backward


def _loop_figures(clock: StepClock, curve: List[dict], step: int) -> dict:
    return {"samples_per_s": clock.samples_per_s, "first_step_unix": clock.first_step_unix,
            "page_faults_per_step": clock.faults_per_step, "step_time_cv": clock.step_cv,
            "val_curve": curve, "val_loss": curve[-1]["val_loss"], "global_step": step}


class RowsInMemory(Dataset):
    """The limit's tensors behind a DataLoader: ``dataset[positions]`` is a whole batch,
    one ``index_select`` each for x and y, as the raw loop gathers it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, positions: np.ndarray):
        rows = torch.from_numpy(positions).to(self.x.device)
        return torch.index_select(self.x, 0, rows), torch.index_select(self.y, 0, rows)


class LimitClock(pl.Callback):
    """The raw loop's clock and validation inside Lightning's loop: every step counted but
    the first; after every epoch the clock pauses and the raw loop's validation runs."""

    def __init__(self, limit: Limit, batch_size: int, autocast: dict):
        self.limit, self.batch_size, self.autocast = limit, batch_size, autocast
        self.clock, self.curve = StepClock(), []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.step_done(len(batch[0]), pl_module.device)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.clock.pause(pl_module.device)
        self.curve.append(_validate(pl_module, self.limit.val_x, self.limit.val_y,
                                    self.batch_size, self.autocast, trainer.global_step))


def lightning_loop(prepared: PreparedDataset, batch_size: int, steps: int, device: torch.device,
                   bf16: bool, seed: int) -> dict:
    """The raw loop's step, data and clock inside ``Trainer(barebones=True)``."""
    limit = limit_setup(prepared, batch_size, device, seed)
    # batch_size=None: the sampler yields whole batches (as kosmoss's loader does); Lightning
    # calls its set_epoch, so the order is the raw loop's.
    loader = DataLoader(RowsInMemory(limit.x, limit.y), sampler=limit.sampler, batch_size=None)
    timer = LimitClock(limit, batch_size,
                       dict(device_type=device.type, dtype=torch.bfloat16, enabled=bf16))
    trainer = pl.Trainer(barebones=True, accelerator="gpu" if device.type == "cuda" else "cpu",
                         devices=1, max_steps=steps + 1, max_epochs=-1, callbacks=[timer],
                         precision="bf16-mixed" if bf16 else "32-true",
                         use_distributed_sampler=False)
    # LeanLitMLP's training step is the raw loop's (barebones: log_every_n_steps=0, no log).
    trainer.fit(limit.model, train_dataloaders=loader)
    return _loop_figures(timer.clock, timer.curve, trainer.global_step)


@torch.no_grad()
def _validate(model, x: torch.Tensor, y: torch.Tensor, batch_size: int, autocast: dict,
              step: int) -> dict:
    """Mean loss over the validation split: every element once, as LitMLP's metric sums it."""
    total = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        with torch.autocast(**autocast):
            prediction = model.net(model.normalize_x(xb))
        loss = torch.nn.functional.mse_loss(prediction.float(), model.normalize_y(yb))
        total += float(loss) * len(xb)
    return {"step": step, "unix_time": time.time(), "val_loss": total / len(x)}


def loader_rate(prepared: PreparedDataset, which: str, batch_size: int, batches: int,
                seed: int) -> dict:
    """Samples/s of one loader over the training split's shuffled batches, no training."""
    train = split_indices(prepared.n_samples, SPLITS, seed)[0]
    sampler = RankBatchSampler(train, batch_size, seed=seed)
    if which == "loader-course":
        order = np.concatenate(list(sampler)).tolist()
        loader = DataLoader(PerSampleMemmapDataset(prepared), batch_size=batch_size, sampler=order)
        batches = max(3, batches // 20)  # ~100x slower: fewer batches, the same rate
    else:
        loader = DataLoader(FlattenedDataset(prepared, mode="efficient"), sampler=sampler,
                            batch_size=None)  # batched reads from the same mapped shards
    batch_iter = (batch for _ in iter(int, 1) for batch in loader)  # epoch after epoch
    next(batch_iter)  # warm-up: worker-free loaders still open files and fill caches
    first_batch_unix, samples, done, start = time.time(), 0, 0, time.perf_counter()
    # At least LOADER_MIN_S of reading: 30 fast batches are over in 40 ms, within the noise.
    while done < batches or time.perf_counter() - start < LOADER_MIN_S:
        samples += len(next(batch_iter)[0])
        done += 1
    rate = samples / (time.perf_counter() - start)
    return {"samples_per_s": rate, "first_step_unix": first_batch_unix, "batches": done}


LOOPS = {"raw": raw_loop, "lightning": lightning_loop, "fabric": partial(raw_loop, fabric=True)}


def measure(what: str, dataset: Path, batch_size: int, steps: int, device: str, bf16: bool,
            seed: int) -> dict:
    target = torch.device(device)
    prepared = open_dataset(dataset, verify=False)
    if what in LOOPS:
        figures = LOOPS[what](prepared, batch_size, steps, target, bf16, seed)
    else:
        figures = loader_rate(prepared, what, batch_size, steps, seed)
    gpu = torch.cuda.max_memory_allocated(target) / 2**20 if target.type == "cuda" else 0.0
    return {**figures, "what": what, "device": device, "bf16": bf16, "batch_size": batch_size,
            "torch_threads": torch.get_num_threads(), "peak_host_rss_mib": [peak_host_rss_mib()],
            "peak_gpu_mib": [gpu]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = OneLineParser(prog="python -m kosmoss.bench.baselines",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=WHAT)
    parser.add_argument("--dataset", type=Path, required=True, help="a prepared dataset folder")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="timed steps (or batches)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True, help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    pin_malloc_thresholds()  # as kosmoss's runs do (kosmoss.run.pipeline): the same allocator
    figures = measure(args.what, args.dataset, args.batch_size, args.steps, args.device,
                      args.bf16, args.seed)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
