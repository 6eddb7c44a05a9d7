"""How close does the kosmoss training path get to the limit, and how much faster is its
loader than the original course's? Every figure is a ratio measured in this one run.

    python benchmarks/throughput.py                    # dataset 'small', batches 256 and 1024
    python benchmarks/throughput.py --dataset tiny --samples 5000 --repeats 1   # a smoke run

1. training: a raw PyTorch loop over tensors already in memory (the limit: same model,
   batch, Adam, threads) against the full kosmoss path (Trainer + FlattenedDataModule
   reading the shards, memory-mapped and in RAM), each timed after a warm-up, median of
   --repeats;
2. loader: the original course's loader (one memmap opened per sample) against
   FlattenedDataset's batched reads, same shuffled order, no training.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, Dataset

from kosmoss.data import presets
from kosmoss.data.loading import MODES, FlattenedDataset, RankBatchSampler, split_indices
from kosmoss.model import LitMLP
from kosmoss.run import RunConfig, run
from kosmoss.run.train import SPLITS

console = Console(highlight=False, width=None if sys.stdout.isatty() else 100)


class PerSampleMemmapDataset(Dataset):
    """The original course's loader: every sample opens its shard as a memmap."""

    def __init__(self, prepared):
        self.folder, self.shards = prepared.path, prepared.shards
        self.offsets = np.cumsum([0] + [s.rows for s in self.shards])

    def __len__(self):
        return int(self.offsets[-1])

    def __getitem__(self, index):
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        row = index - self.offsets[shard]
        x = np.load(self.folder / self.shards[shard].x_file, mmap_mode="r")[row]
        y = np.load(self.folder / self.shards[shard].y_file, mmap_mode="r")[row]
        return torch.tensor(x), torch.tensor(y)


def time_loader(loader, batches: int) -> float:
    """Samples/s over ``batches`` batches, after one warm-up batch."""
    iterator = (batch for _ in iter(int, 1) for batch in loader)  # epoch after epoch
    next(iterator)
    samples, start = 0, time.perf_counter()
    for _ in range(batches):
        x, _ = next(iterator)
        samples += len(x)
    return samples / (time.perf_counter() - start)


def loader_rates(prepared, batch: int, batches: int) -> dict:
    train = split_indices(prepared.n_samples, SPLITS, seed=0)[0]
    sampler = RankBatchSampler(train, batch, seed=0)
    order = np.concatenate(list(sampler)).tolist()
    course = DataLoader(PerSampleMemmapDataset(prepared), batch_size=batch, sampler=order)
    kosmoss = DataLoader(FlattenedDataset(prepared), sampler=sampler, batch_size=None)
    slow_batches = max(3, batches // 20)  # the per-sample loader is slow: fewer batches
    return {"course_per_sample": time_loader(course, slow_batches),
            "kosmoss_batched": time_loader(kosmoss, batches)}


def raw_loop_rate(prepared, batch: int, steps: int, warmup: int, lr: float) -> float:
    """The limit: tensors in memory, nothing but forward, backward and the optimizer."""
    train = split_indices(prepared.n_samples, SPLITS, seed=0)[0]
    x, y = FlattenedDataset(prepared, mode="controlled").read(train)
    model = LitMLP(prepared.n_x, (100, 100, 100), prepared.n_y, lr=lr,
                   stats=prepared.statistics())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    order = torch.cat([torch.randperm(len(x), generator=generator)
                       for _ in range(1 + (steps + warmup) * batch // len(x))])
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
        # Sorted like kosmoss's batches, and index_select (2-3x faster than x[idx] here):
        # the limit gets every trick the loader uses.
        idx = order[step * batch:(step + 1) * batch].sort().values
        xb, yb = torch.index_select(x, 0, idx), torch.index_select(y, 0, idx)
        prediction = model.net(model.normalize_x(xb))
        loss = torch.nn.functional.mse_loss(prediction, model.normalize_y(yb))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * batch / (time.perf_counter() - start)


def kosmoss_rate(dataset: str, batch: int, steps: int, warmup: int, lr: float,
                 mode: str = "efficient") -> float:
    config = RunConfig(dataset=dataset, batch_size=batch, max_steps=warmup + steps,
                       max_epochs=10_000, lr=lr, progress=False, mode=mode)
    return run(config, echo=lambda message: None)["train_samples_per_s"]


def measure_training(args, prepared, batch: int) -> dict:
    steps = max(10, args.samples // batch)
    rates = {"raw": [], **{mode: [] for mode in MODES}}
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit all alike
        rates["raw"].append(raw_loop_rate(prepared, batch, steps, args.warmup, args.lr))
        for mode in MODES:
            rates[mode].append(kosmoss_rate(args.dataset, batch, steps, args.warmup, args.lr, mode))
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "batch_size": batch, "steps": steps,
        "raw_loop_samples_per_s": median["raw"],
        "kosmoss_samples_per_s": median["efficient"],
        "kosmoss_controlled_samples_per_s": median["controlled"],
        "training_ratio": median["efficient"] / median["raw"],
        "training_ratio_controlled": median["controlled"] / median["raw"],
        "paired_ratios": [k / r for k, r in zip(rates["efficient"], rates["raw"])],
        "all_samples_per_s": rates,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=presets.DEFAULT_PRESET)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[256, 1024],
                        help="global batch sizes to compare (default: 256 1024)")
    parser.add_argument("--samples", type=int, default=100_000,
                        help="samples per timed measurement (steps = samples / batch)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    prepared = presets.resolve(args.dataset, log=console.print)
    training = [measure_training(args, prepared, batch) for batch in args.batch_size]
    loaders = loader_rates(prepared, args.batch_size[0], max(10, args.samples // args.batch_size[0]))
    figures = {
        "dataset": str(prepared.path), "n_samples": prepared.n_samples,
        "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
        "training": training,
        "loader_batch_size": args.batch_size[0],
        "loader_course_samples_per_s": loaders["course_per_sample"],
        "loader_kosmoss_samples_per_s": loaders["kosmoss_batched"],
        "loader_ratio": loaders["kosmoss_batched"] / loaders["course_per_sample"],
    }
    show(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def show(f: dict) -> None:
    table = Table(title=f"{f['n_samples']} columns, {f['torch_threads']} torch threads, "
                        f"median of {f['repeats']}")
    for column in ("measurement", "batch", "samples/s", "ratio", "target"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for t in f["training"]:
        batch = str(t["batch_size"])
        table.add_row("raw PyTorch loop, tensors in RAM", batch,
                      f"{t['raw_loop_samples_per_s']:,.0f}", "1.00", "")
        table.add_row("kosmoss Trainer, memmap shards", batch,
                      f"{t['kosmoss_samples_per_s']:,.0f}", f"{t['training_ratio']:.2f}", ">= 0.90")
        table.add_row("kosmoss Trainer, shards in RAM", batch,
                      f"{t['kosmoss_controlled_samples_per_s']:,.0f}",
                      f"{t['training_ratio_controlled']:.2f}", ">= 0.90", end_section=True)
    batch = str(f["loader_batch_size"])
    table.add_row("loader: course, per sample", batch,
                  f"{f['loader_course_samples_per_s']:,.0f}", "1", "")
    table.add_row("loader: kosmoss, batched", batch,
                  f"{f['loader_kosmoss_samples_per_s']:,.0f}", f"{f['loader_ratio']:.0f}", ">= 50")
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
