"""``LitMLP``: the radiation-column MLP as a LightningModule.

Normalisation of x and de-normalisation of y are registered buffers built from the
dataset statistics: they follow the module to its device and are saved in checkpoints,
so a checkpoint alone predicts in W m-2.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional, Sequence

import pytorch_lightning as pl
import torch
from torch import nn
from torchmetrics import MeanSquaredError

from .data.stats import Statistics
from .defaults import DEFAULT_HIDDEN, DEFAULT_LR
from .scaling import warmup_factor

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
    (the unscaled base rate, see :mod:`kosmoss.scaling`)."""

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

    def __setattr__(self, name: str, value) -> None:
        # Lightning sets _current_fx_name before and after every hook it calls, 44 times a
        # step; nn.Module.__setattr__ checks it against parameters, buffers and submodules
        # each time. A hook's name is none of them: ~170 µs less a step on the 2-core VM
        # (python -m kosmoss.bench.step_cost, issue 19).
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

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
        # would allocate two batch-sized temporaries per step (issue 19: page faults).
        prediction = self.net(x.sub_(self.x_mean).div_(self.x_std))
        target = self.normalize_y(y)
        loss = nn.functional.mse_loss(prediction, target)
        if stage == "train":
            if self._logs_this_step():  # sync_dist: the mean over every rank, not rank 0's
                self.log("train_loss", loss, prog_bar=self._shows_progress(), sync_dist=True,
                         batch_size=len(x))
            return loss
        self.mse[stage](prediction.float(), target)
        self.rmse_wm2[stage](self.denormalize_y(prediction.float()), y)
        self.log(f"{stage}_loss", self.mse[stage], prog_bar=True)
        self.log(f"{stage}_rmse_wm2", self.rmse_wm2[stage])
        return loss

    def _logs_this_step(self) -> bool:
        # self.log costs ~1 ms per call on CPU, 10-20 % of a step of this small model, and
        # the loggers only write every log_every_n_steps anyway.
        trainer = self._trainer
        if trainer is None:
            return True
        every = trainer.log_every_n_steps  # 0 in Trainer(barebones=True): no logging at all
        # Lightning's loggers write when (steps done + 1) % every == 0: log on those steps,
        # and on the first (the progress bar and callback_metrics have a value at once).
        return every > 0 and (self.global_step == 0 or (self.global_step + 1) % every == 0)

    def _shows_progress(self) -> bool:
        # For a progress bar Lightning turns the last logged loss into a float after every
        # step, logged or not (.item(): on a GPU, a wait for the step's kernels). Without
        # one, nobody reads it.
        trainer = self._trainer
        return trainer is None or trainer.progress_bar_callback is not None

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, "train")

    # Lightning asks inspect.getfullargspec whether training_step takes batch_idx, every
    # step (~37 µs here); a function's __signature__ answers it at once (~10 µs). A subclass
    # that overrides training_step is inspected as usual.
    training_step.__signature__ = inspect.signature(training_step)

    def validation_step(self, batch, batch_idx):
        return self._common_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._common_step(batch, "test")

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        if not self.hparams.warmup_steps:
            return optimizer
        start = self.hparams.warmup_start_lr or self.hparams.lr
        ramp = functools.partial(warmup_factor, warmup_steps=self.hparams.warmup_steps,
                                 start_fraction=start / self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ramp)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
