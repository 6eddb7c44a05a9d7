"""A kernel's fit with Lightning's notebook launcher on a machine of CORES cores, as a
lesson makes it: the kernel first computes on two threads, then forks RANKS CPU ranks.
``python notebook_launcher.py CORES RANKS guarded|bare``: bare, with 2 cores a rank or
more, the ranks hang (tests/lessons/test_helpers.py); prints the kernel's threads after."""
import contextlib
import os
import sys

import pytorch_lightning as pl
import torch

from kosmoss.lessons import one_thread_per_forked_rank

cores, ranks, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ.pop("OMP_NUM_THREADS", None)
torch.set_num_threads(2)
torch.randn(256, 256) @ torch.randn(256, 256)  # the kernel's OpenMP pool, in use
# Lightning counts the cores with sched_getaffinity; the ranks inherit this stand-in.
os.sched_getaffinity = lambda pid: set(range(cores))


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(256, 256)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 256)),
                                   batch_size=16)
trainer = pl.Trainer(accelerator="cpu", devices=ranks, strategy="ddp_notebook", max_steps=3,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
with one_thread_per_forked_rank() if how == "guarded" else contextlib.nullcontext():
    trainer.fit(Tiny(), data)
print("fit returned; threads", torch.get_num_threads(), "OMP_NUM_THREADS",
      os.environ.get("OMP_NUM_THREADS"))
