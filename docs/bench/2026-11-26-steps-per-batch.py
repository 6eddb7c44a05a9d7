"""An experiment, not product code, kept as it was run (it led to kosmoss.run.chunks):
kosmoss's own run (trainup_cpu.py) with K optimizer steps per Lightning batch, against the
bench's raw loop and the run with one step a batch, in interleaved rounds of separate
processes (docs/bench/2026-11-26-midday.md).

    python docs/bench/2026-11-26-steps-per-batch.py --dataset small --batch-size 256 \
        --steps 1000 --rounds 3 --per-batch 8 32

Each Lightning batch is a chunk of K of the data module's batches; LitMLP's step runs them
one by one with manual optimisation (zero_grad, manual_backward, the optimizer's step, the
warm-up schedule's step). The chunk reads each batch when the step takes it: a chunk read
whole before its first step (``--eager``) leaves its batches out of the cache and loses
the gain. What the experiment leaves out, and a product version would need: the logs'
step axis, an exact --max-steps (the last chunk overshoots by up to K-1 steps), the
resume position within an epoch, per-step jitter (step_time_cv counts chunks here), and
runs of more than one process (DDP wants one backward per forward).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def chunked_child(per_batch: int, eager: bool, trainup_args: list) -> None:
    """Run trainup_cpu.py in this process with K steps per Lightning batch."""
    from kosmoss.data import datamodule
    from kosmoss.model import LitMLP
    from kosmoss.run import callbacks, train

    class StepsInChunks(LitMLP):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.automatic_optimization = False
            self.samples_in_chunk = 0

        def training_step(self, chunk, batch_idx):
            optimizer, schedule = self.optimizers(), self.lr_schedulers()
            self.samples_in_chunk = 0
            for batch in chunk:
                self.samples_in_chunk += len(batch[0])
                loss = self._common_step(batch, "train")
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
                if schedule is not None:
                    schedule.step()
            return loss

    class ChunkLoader(datamodule.ResumableBatchLoader):
        def __len__(self) -> int:
            return -(-len(self.sampler) // per_batch)

        def __iter__(self):
            read, batches = self.dataset.__getitem__, iter(self.sampler)
            for first in batches:
                rest = itertools.islice(batches, per_batch - 1)
                if eager:
                    yield [read(first)] + [read(b) for b in rest]
                else:  # each batch read when the step takes it
                    yield itertools.chain([read(first)], map(read, rest))

    shipped_loader = datamodule.FlattenedDataModule.loader

    def loader(self, stage):
        made = shipped_loader(self, stage)
        if stage == "train":
            made.__class__ = ChunkLoader
        return made

    def count_chunk(self, trainer, pl_module, outputs, batch, batch_idx):
        self.clock.step_done(pl_module.samples_in_chunk, pl_module.device)

    datamodule.FlattenedDataModule.loader = loader
    train.LitMLP = StepsInChunks
    callbacks.ThroughputMeter.on_train_batch_end = count_chunk
    sys.argv = [str(REPO / "trainup_cpu.py")] + trainup_args
    runpy.run_path(sys.argv[0], run_name="__main__")


def samples_per_s(command: list, out: Path, key: str) -> float:
    out.unlink(missing_ok=True)  # trainup refuses to overwrite a result
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())[key]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # the chunked run: the rest are trainup's own flags
        eager = sys.argv[3:4] == ["--eager"]
        chunked_child(int(sys.argv[2]), eager, sys.argv[4 if eager else 3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="small")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--eager", action="store_true", help="read a chunk whole first")
    args = parser.parse_args()
    home = Path(os.environ.get("KOSMOSS_HOME", Path.home() / ".kosmoss"))
    dataset = home / "data" / args.dataset if "/" not in args.dataset else Path(args.dataset)
    # kosmoss's own chunks off (they landed after this ran): the experiment chunks itself.
    run = ["--dataset", str(dataset), "--batch-size", str(args.batch_size),
           "--max-steps", str(args.steps + 1), "--seed", "42", "--no-progress",
           "--steps-per-execution", "1"]
    ratios = {k: [] for k in [1] + args.per_batch}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "r.json"
        for _ in range(args.rounds):
            raw = samples_per_s([sys.executable, "-m", "kosmoss.bench.baselines", "raw",
                                 "--dataset", str(dataset), "--batch-size", str(args.batch_size),
                                 "--steps", str(args.steps), "--out", str(out)],
                                out, "samples_per_s")
            line = [f"raw {raw:,.0f} samples/s"]
            for k in ratios:
                command = ([sys.executable, "trainup_cpu.py"] if k == 1 else
                           [sys.executable, __file__, "--child", str(k)]
                           + (["--eager"] if args.eager else []))
                ratio = samples_per_s(command + run + ["--result-json", str(out)], out,
                                      "train_samples_per_s") / raw
                ratios[k].append(ratio)
                line.append(f"K={k} {ratio:.3f}")
            print("  ".join(line), flush=True)
    for k, found in ratios.items():
        print(f"K={k}: median {statistics.median(found):.3f} "
              f"({min(found):.3f}-{max(found):.3f}) of the raw loop")


if __name__ == "__main__":
    main()
