"""Distributed runs that fail on purpose, for lesson 10 ("when it hangs or crashes"):
each makes one fault for real on 2 CPU ranks over gloo, so that the diagnosis tools have
something true to find.

    python -m kosmoss.exercises.faulty_run patient RUN --slow-rank 1 --slow-ms 40 --sleep-when F
        2-rank Lightning DDP with kosmoss's Heartbeat and StartupCheck, recorded in RUN
        as kosmoss records its runs: rank 1 is 40 ms slower per step (a straggler for
        `kosmoss watch`); once F exists it writes RUN/sleeping-rank-1 and sleeps in
        training_step (rank 0 waits in DDP's all-reduce: `kosmoss stacks`)
    python -m kosmoss.exercises.faulty_run patient RUN_DIR --absent-rank 1 --startup-timeout 5
        rank 1 never leaves its data setup: the start-up check names it and rank 0 exits 1
    python -m kosmoss.exercises.faulty_run mismatch RANK PORT [--timeout S]
        one plain torch.distributed rank of 2 (start both): rank 0 calls all_reduce then
        broadcast, rank 1 the other way round; run it with TORCH_DISTRIBUTED_DEBUG=DETAIL
        to have the mismatch named instead of a timeout

Lightning starts rank 1 by running the same command again with LOCAL_RANK set.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

RANK = int(os.environ.get("LOCAL_RANK", 0))


def patient(args: argparse.Namespace) -> None:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from ..diagnose.hang import StartupCheck, is_collective_timeout, write_stacks
    from ..diagnose.heartbeat import Heartbeat
    from ..launch import records

    class Patient(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            if RANK == args.slow_rank:
                time.sleep(args.slow_ms / 1000)  # the fault: this rank works longer
                if args.sleep_when and args.sleep_when.exists():
                    (args.run_dir / f"sleeping-rank-{RANK}").touch()
                    while True:  # the fault: stuck in its own code, never reaches backward
                        time.sleep(0.5)
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Data(pl.LightningDataModule):
        def setup(self, stage):
            if RANK == args.absent_rank:  # the fault: stuck loading its data
                parent = os.getppid()
                (args.run_dir / f"absent-rank-{RANK}").touch()
                while os.getppid() == parent:  # until rank 0, its launcher, is gone
                    time.sleep(0.2)
                os._exit(3)
            x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
            self.data = TensorDataset(x, x.sum(1, keepdim=True))

        def train_dataloader(self):
            return DataLoader(self.data, batch_size=32, shuffle=True)

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
        trainer.fit(Patient(), datamodule=Data())
    except Exception as err:
        print(f"rank {RANK}: {type(err).__name__}: {str(err).splitlines()[0][:300]}", flush=True)
        if is_collective_timeout(err):
            print(f"rank {RANK}: stacks of the run in {write_stacks(args.run_dir)}", flush=True)
        records.finish("failed", str(err)[:300])
        sys.exit(1)


def mismatch(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=2, timeout=timedelta(seconds=args.timeout))
    began = time.monotonic()
    tensor = torch.ones(4)
    try:
        if args.rank == 0:  # the fault: the ranks call the same collectives in another order
            dist.all_reduce(tensor)
            dist.broadcast(tensor, src=0)
        else:
            dist.broadcast(tensor, src=0)
            dist.all_reduce(tensor)
        print(f"rank {args.rank}: no error", flush=True)
    except RuntimeError as err:
        print(f"rank {args.rank} after {time.monotonic() - began:.1f} s: "
              f"{str(err).splitlines()[0]}", flush=True)
        sys.exit(1)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kosmoss.exercises.faulty_run")
    modes = parser.add_subparsers(dest="mode", required=True)
    run = modes.add_parser("patient")
    run.add_argument("run_dir", type=Path)
    run.add_argument("--slow-rank", type=int, default=-1)
    run.add_argument("--slow-ms", type=float, default=0.0)
    run.add_argument("--sleep-when", type=Path)
    run.add_argument("--absent-rank", type=int, default=-1)
    run.add_argument("--startup-timeout", type=float, default=60.0)
    run.add_argument("--collective-timeout", type=float, default=300.0)
    run.set_defaults(command=patient)
    pair = modes.add_parser("mismatch")
    pair.add_argument("rank", type=int)
    pair.add_argument("port", type=int)
    pair.add_argument("--timeout", type=float, default=10.0)
    pair.set_defaults(command=mismatch)
    args = parser.parse_args(argv)
    args.command(args)


if __name__ == "__main__":
    main()
