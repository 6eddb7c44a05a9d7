"""An experiment kept as it was run (docs/bench/2026-11-27-evening.md): the host time a
training step waits for in kosmoss's sampler (kosmoss.data.loading.RankBatchSampler), its
epoch's order drawn and each batch put in ascending order, as the sampler does it now
against what it did before (every batch through np.sort), in alternating rounds of one
process; per step = an epoch's time / its batches, best of the rounds.

    python docs/bench/2026-11-27-sampler-per-step.py --rows 131072 --batch-size 131072 16384 8192

A GPU step at these batches takes 0.7-3.7 ms on an H200 (docs/gpu/2026-11-27-h200-ladder.md)
and cannot start before the host has handed it its batch.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from kosmoss.data.loading import RankBatchSampler


class SortedEveryBatch(RankBatchSampler):
    """The sampler as it was: an epoch's order drawn, then np.sort on each batch."""

    def __iter__(self):
        skip, self._resume_at = self.skips, None
        return (np.sort(batch) for batch in self.batches()[skip:])


def per_step_ms(sampler: RankBatchSampler, epoch: int) -> float:
    sampler.set_epoch(epoch)
    started = time.perf_counter()
    batches = list(sampler)
    return (time.perf_counter() - started) / len(batches) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=131072, help="training rows")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[131072, 16384, 8192])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"{args.rows:,} training rows; ms of host time a step, best of {args.rounds} rounds")
    for batch in args.batch_size:
        before = SortedEveryBatch(np.arange(args.rows), batch, seed=1)
        now = RankBatchSampler(np.arange(args.rows), batch, seed=1)
        best = {"before": float("inf"), "now": float("inf")}
        for epoch in range(args.rounds):
            best["before"] = min(best["before"], per_step_ms(before, epoch))
            best["now"] = min(best["now"], per_step_ms(now, epoch))
        print(f"batch {batch:>7,}: before {best['before']:.3f} ms, now {best['now']:.3f} ms, "
              f"before / now = {best['before'] / best['now']:.2f}")


if __name__ == "__main__":
    main()
