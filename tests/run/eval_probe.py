"""Validate one checkpoint on N gloo ranks (Lightning starts them) and write the metrics
rank 0 reports: the exact-evaluation test compares them across world sizes.

    python tests/run/eval_probe.py --dataset DIR --checkpoint C --devices 2 --out m.json
"""
import argparse
import json

import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy

from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.engines.ddp import DDPEngine
from kosmoss.model import LitMLP


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--dataset", "--checkpoint", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    model = LitMLP.load_from_checkpoint(args.checkpoint)
    strategy = DDPStrategy(process_group_backend="gloo") if args.devices > 1 else "auto"
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy,
                         use_distributed_sampler=False, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    datamodule = FlattenedDataModule(args.dataset, batch_size=args.batch_size, seed=42)
    (metrics,) = trainer.validate(model, datamodule=datamodule, verbose=False)
    if trainer.is_global_zero:
        with open(args.out, "w") as out:
            json.dump({**metrics, "world_size": trainer.world_size}, out)
    # As every kosmoss run ends: a rank exiting with gloo's threads alive may abort.
    DDPEngine().shutdown()


if __name__ == "__main__":
    main()
