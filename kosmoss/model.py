"""``LitMLP``: the radiation-column MLP as a LightningModule.

Normalisation of x and de-normalisation of y are registered buffers built from the
dataset statistics: they follow the module to its device and are saved in checkpoints,
so a checkpoint alone predicts in W m-2.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import pytorch_lightning as pl
import torch
from torch import nn
from torchmetrics import MeanSquaredError

from .core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
from .data.stats import Statistics
from .scaling.arithmetic import warmup_factor

EVAL_STAGES = ("val", "test")
ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


def mlp(in_channels: int, hidden_channels: Sequence[int], out_channels: int,
        activation: str = "silu") -> nn.Sequential:
    sizes = [in_channels, *hidden_channels]
    layers = []
    for size_in, size_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(size_in, size_out), ACTIVATIONS[activation]()]
    layers.append(nn.Linear(sizes[-1], out_channels))
    return nn.Sequential(*layers)


class LitMLP(pl.LightningModule):
    """Flattened column in, 4 x 138 fluxes out. The default is the course's model:
    3 hidden layers of 100, SiLU. Loss: MSE on normalised targets; RMSE also in W m-2.
    ``lr`` is the rate used; with ``warmup_steps`` it ramps to it from ``warmup_start_lr``
    (the unscaled base rate, see :mod:`kosmoss.scaling.arithmetic`)."""

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Sequence[int] = DEFAULT_HIDDEN,
        out_channels: int = 552,
        lr: float = DEFAULT_LR,
        activation: str = "silu",
        stats: Optional[Statistics] = None,
        warmup_steps: int = 0,
        warmup_start_lr: Optional[float] = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        # Statistics live in buffers (and so in the state dict), not in hyperparameters.
        self.save_hyperparameters(ignore=["stats"])
        self.net = mlp(in_channels, list(hidden_channels), out_channels, activation)
        self._register_stats(in_channels, out_channels, stats)
        # Sums and counts (torchmetrics states reduced with "sum"): exact under DDP whatever
        # the world size, unlike a mean of per-rank means weighted by an all-reduced batch size.
        self.mse = nn.ModuleDict({s: MeanSquaredError() for s in EVAL_STAGES})
        self.rmse_wm2 = nn.ModuleDict({s: MeanSquaredError(squared=False) for s in EVAL_STAGES})

    def _register_stats(self, n_x: int, n_y: int, stats: Optional[Statistics]) -> None:
        # Without stats (e.g. load_from_checkpoint) the buffers are placeholders that the
        # checkpoint's state dict then fills in.
        values = {
            "x_mean": stats.x_mean if stats else torch.zeros(n_x),
            "x_std": stats.x_scale() if stats else torch.ones(n_x),
            "y_mean": stats.y_mean if stats else torch.zeros(n_y),
            "y_std": stats.y_scale() if stats else torch.ones(n_y),
        }
        for name, value in values.items():
            self.register_buffer(name, torch.as_tensor(value, dtype=torch.float32).clone())

    def normalize_x(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean) / self.x_std

    def normalize_y(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean) / self.y_std

    def denormalize_y(self, y_normalized: torch.Tensor) -> torch.Tensor:
        return y_normalized * self.y_std + self.y_mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Physical inputs -> fluxes in W m-2."""
        return self.denormalize_y(self.net(self.normalize_x(x)))

    def _common_step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch
        # In place: the loader made this batch for this step alone, and (x - mean) / std
        # would allocate two batch-sized temporaries per step (page faults: docs/bench/2026-11-22.md).
        prediction = self.net(x.sub_(self.x_mean).div_(self.x_std))
        target = self.normalize_y(y)
        loss = nn.functional.mse_loss(prediction, target)
        if stage == "train":
            # sync_dist: the mean over every rank, not rank 0's
            self.log("train_loss", loss, prog_bar=True, sync_dist=True, batch_size=len(x))
            return loss
        self.mse[stage](prediction.float(), target)
        self.rmse_wm2[stage](self.denormalize_y(prediction.float()), y)
        self.log(f"{stage}_loss", self.mse[stage], prog_bar=True)
        self.log(f"{stage}_rmse_wm2", self.rmse_wm2[stage])
        return loss

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self._common_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._common_step(batch, "test")

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)

    def configure_optimizers(self):
        return self.with_warmup(torch.optim.Adam(self.parameters(), lr=self.hparams.lr))

    def with_warmup(self, optimizer: torch.optim.Optimizer):
        """``optimizer``, with the rate's linear warm-up when ``warmup_steps`` asks for one."""
        if not self.hparams.warmup_steps:
            return optimizer
        start = self.hparams.warmup_start_lr or self.hparams.lr
        ramp = functools.partial(warmup_factor, warmup_steps=self.hparams.warmup_steps,
                                 start_fraction=start / self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ramp)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
