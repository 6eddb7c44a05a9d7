"""An experiment kept as it was run (docs/bench/2026-11-27-night.md): the host time a
training step waits for in kosmoss's sampler (kosmoss.data.loading.RankBatchSampler), three
ways of drawing each epoch's order, all giving the same order to the element:

- gathered: ``indices[rng.permutation(n)]`` when the epoch's first batch is asked for (as it was);
- shuffled: a copy of the indices shuffled in place, when asked;
- ahead: shuffled in a thread while the epoch before trains (as it is now).

Between two batches the main thread stands in for a GPU step's host side: it spins in
Python for ``--step-ms``, holding the GIL (the worst case for the thread; numpy releases the
GIL while it shuffles). Per step = the main thread's time in the sampler over an epoch ÷
its batches, median of the epochs; and the slowest first step of an epoch.

    python docs/bench/2026-11-27-order-draw.py --rows 131072 --batch-size 16384 8192
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kosmoss.data import loading
from kosmoss.data.loading import RankBatchSampler


class GatheredOrder(RankBatchSampler):
    """The order as it was drawn: a permutation of 0..n-1, then a gather."""

    def _epoch_order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch])
        return self.indices[rng.permutation(len(self.indices))]


WAYS = {"gathered": (GatheredOrder, False), "shuffled": (RankBatchSampler, False),
        "ahead": (RankBatchSampler, True)}


def spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def epoch_in_sampler(sampler: RankBatchSampler, epoch: int, step_s: float) -> tuple:
    """(ms in the sampler a step, ms of the epoch's first step) for one epoch; the first
    step includes making the epoch's iterator, as Lightning does at the epoch's start."""
    sampler.set_epoch(epoch)
    inside, first, batches = 0.0, None, None
    while True:
        started = time.perf_counter()
        batches = iter(sampler) if batches is None else batches
        batch = next(batches, None)
        took = time.perf_counter() - started
        if batch is None:
            return inside / len(sampler) * 1e3, first * 1e3
        first = took if first is None else first
        inside += took
        spin(step_s)


def measure(way: str, rows: int, batch: int, epochs: int, step_s: float) -> tuple:
    kind, ahead = WAYS[way]
    loading.DRAW_AHEAD_FROM = 1 if ahead else 1 << 62
    sampler = kind(np.arange(rows), batch, seed=1)
    figures = [epoch_in_sampler(sampler, epoch, step_s) for epoch in range(epochs)][1:]
    return statistics.median(f[0] for f in figures), max(f[1] for f in figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=131072, help="training rows")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16384, 8192])
    parser.add_argument("--epochs", type=int, default=31, help="epochs a way, the first left out")
    parser.add_argument("--step-ms", type=float, default=0.72,
                        help="host time a step outside the sampler (an H200's bf16 step at 16,384)")
    args = parser.parse_args()
    indices = np.arange(args.rows)
    draws = {way: [] for way in ("gathered", "shuffled")}
    for epoch in range(args.epochs):
        for way in draws:
            sampler = WAYS[way][0](indices, 1024, seed=1)
            sampler.set_epoch(epoch)
            started = time.perf_counter()
            sampler._epoch_order()
            draws[way].append((time.perf_counter() - started) * 1e3)
    print(f"{args.rows:,} training rows; an epoch's order, best of {args.epochs}: gathered "
          f"{min(draws['gathered']):.2f} ms, shuffled {min(draws['shuffled']):.2f} ms")
    print(f"a {args.step_ms} ms step between batches; ms in the sampler a step (median of "
          f"{args.epochs - 1} epochs), and the slowest first step of an epoch")
    for batch in args.batch_size:
        got = {way: measure(way, args.rows, batch, args.epochs, args.step_ms / 1e3)
               for way in WAYS}
        print(f"batch {batch:>7,}: " + ", ".join(
            f"{way} {step:.3f} ms (first {first:.2f})" for way, (step, first) in got.items())
            + f"; gathered / ahead = {got['gathered'][0] / got['ahead'][0]:.2f}")


if __name__ == "__main__":
    main()
