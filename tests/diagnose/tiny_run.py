"""A 2-rank Lightning DDP run on CPU (gloo) with kosmoss's diagnose callbacks and one fault
made for real, recorded in RUN_DIR the way kosmoss records its runs (kosmoss.launch.records):

    python tests/diagnose/tiny_run.py RUN_DIR --slow-rank 1 --slow-ms 40 --sleep-when FILE
        rank 1 does 40 ms more CPU work per step (a straggler); once FILE exists, it writes
        RUN_DIR/sleeping-rank-1 and sleeps in training_step (rank 0 waits in all_reduce)
    python tests/diagnose/tiny_run.py RUN_DIR --absent-rank 1 --startup-timeout 5
        rank 1 never leaves its data setup: the start-up check names it, rank 0 writes the
        stacks of the run and exits 1

Independent of kosmoss.run (the lead wires the same callbacks into every run).
"""
import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from kosmoss.diagnose.hang import StartupCheck, is_collective_timeout, write_stacks
from kosmoss.diagnose.heartbeat import Heartbeat
from kosmoss.launch import records

RANK = int(os.environ.get("LOCAL_RANK", 0))


def cpu_work(seconds: float) -> None:
    """Spin for ``seconds`` of this process's CPU time. Not a sleep: a straggler does more
    work, and on a loaded machine its extra work stretches as every rank's step does, so
    it stays the same share of a step (a 40 ms sleep vanished in loaded steps' noise)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class TinyModel(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if RANK == self.args.slow_rank:
            cpu_work(self.args.slow_ms / 1000)
            if self.args.sleep_when and self.args.sleep_when.exists():
                (self.args.run_dir / f"sleeping-rank-{RANK}").touch()
                while True:
                    time.sleep(0.5)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TinyData(pl.LightningDataModule):
    def __init__(self, args):
        super().__init__()
        self.args = args

    def setup(self, stage):
        if RANK == self.args.absent_rank:  # stuck loading its data, until rank 0 is gone
            parent = os.getppid()
            (self.args.run_dir / f"absent-rank-{RANK}").touch()
            while os.getppid() == parent:
                time.sleep(0.2)
            os._exit(3)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 16, generator=generator)
        self.data = TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=32, shuffle=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--sleep-when", type=Path)
    parser.add_argument("--absent-rank", type=int, default=-1)
    parser.add_argument("--startup-timeout", type=float, default=60.0)
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    records.start(args.run_dir, kind="lightning", global_rank=RANK)
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_epochs=1000, logger=False,
        strategy=DDPStrategy(process_group_backend="gloo",
                             timeout=timedelta(seconds=args.collective_timeout)),
        callbacks=[Heartbeat(args.run_dir), StartupCheck(args.startup_timeout)],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(TinyModel(args), datamodule=TinyData(args))
    except Exception as err:
        if not is_collective_timeout(err):
            raise
        stacks = write_stacks(args.run_dir)
        print(f"rank {RANK}: {err}\nrank {RANK}: stacks of the run in {stacks}", flush=True)
        records.finish("failed", str(err)[:300])
        sys.exit(1)


if __name__ == "__main__":
    main()
