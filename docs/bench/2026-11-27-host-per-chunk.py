"""An experiment, not product code, kept as it was run (docs/bench/2026-11-27.md): how
much host time kosmoss's --cuda-graphs path spends per replayed chunk — Lightning's loop,
kosmoss's chunk bookkeeping, the index copy — with a graph whose replay does nothing, on
CPU. A GPU replay that takes longer than this keeps the GPU busy while the host prepares
the next chunk; one that takes less leaves the GPU waiting on the host.

    python docs/bench/2026-11-27-host-per-chunk.py --steps 4000 --k 1 8

The dataset's training split holds a whole number of chunks (no eager chunk at an epoch's
end) and validation is off: what is timed is the replayed chunks alone, after 200 steps.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl

from kosmoss.data.sources import SyntheticSource
from kosmoss.data.store import prepare
from kosmoss.run import graphs
from kosmoss.run.chunks import StepsInChunks
from kosmoss.run.datamodule import RunDataModule

BATCH = 64
ROWS = 5120  # 4,096 training rows: 64 batches of 64, whole chunks for K = 1, 2, 4, 8 ...
SKIPPED_STEPS = 200


class NullGraph(graphs.EagerGraph):
    """Captures once (the losses tensor exists), then replays nothing."""

    def capture(self, steps) -> None:
        self.steps = steps
        steps()

    def replay(self) -> None:
        pass


class Clock(pl.Callback):
    def __init__(self) -> None:
        self.start = self.end = None

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step >= SKIPPED_STEPS and self.start is None:
            self.start = (time.perf_counter(), trainer.global_step)

    def on_train_end(self, trainer, *args) -> None:
        self.end = (time.perf_counter(), trainer.global_step)


def host_ms_per_chunk(data, k: int, steps: int) -> float:
    pl.seed_everything(0, verbose=False)
    model = StepsInChunks(data.n_x, (16,), data.n_y, stats=data.statistics())
    clock = Clock()
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, max_epochs=-1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0,
                         use_distributed_sampler=False,
                         callbacks=[graphs.GraphsOnTheDevice(BATCH, k, NullGraph), clock])
    module = RunDataModule(data, batch_size=BATCH, seed=1, mode="controlled",
                           steps_per_execution=k, chunked=True)
    trainer.fit(model, datamodule=module)
    assert model.eager_chunks == 0, "a chunk ran eagerly: the split must hold whole chunks"
    seconds, done = clock.end[0] - clock.start[0], clock.end[1] - clock.start[1]
    return 1e3 * seconds / done * k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    data = prepare(SyntheticSource(ROWS, seed=3, levels=6),
                   Path(tempfile.mkdtemp()) / "host-per-chunk", shard_size=ROWS)
    for k in args.k:
        ms = host_ms_per_chunk(data, k, args.steps)
        print(f"K = {k}: {ms:.3f} ms of host time per replayed chunk "
              f"({ms / k:.3f} ms per optimizer step)")


if __name__ == "__main__":
    main()
