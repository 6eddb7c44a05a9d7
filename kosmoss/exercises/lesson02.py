"""Lesson 02 (Lightning basics): predict in W m-2 from a checkpoint alone; say how many
optimizer steps ``trainer.fit`` takes (checked against a real Trainer).

    kosmoss check 02
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator

from .core import Exercise, failed, learner, passed

# ---------------------------------------------------------------- 02.predict_wm2

PREDICT_STATEMENT = """\
**Predict fluxes in W m-2 from a checkpoint alone.**

Write `predict_wm2(checkpoint_path, x)`: load the `LitMLP` saved at `checkpoint_path`
(no dataset, no statistics at hand: they are in the checkpoint's buffers) and return its
prediction for the columns `x` (a float tensor, one flattened column per row) in W m-2,
without tracking gradients. The checker saves a small model with known statistics and
compares your fluxes with the model's.
"""

PREDICT_SKELETON = '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    """Fluxes in W m-2 predicted for the columns x by the LitMLP saved at checkpoint_path."""
    raise NotImplementedError("your code here")
'''

PREDICT_REFERENCE = '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu")
    model.eval()
    with torch.no_grad():
        return model(x)
'''

PREDICT_WRONG = {
    "normalised output": '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path)
    with torch.no_grad():
        return model.net(model.normalize_x(x))
''',
}


@contextlib.contextmanager
def _checkpoint() -> Iterator[tuple]:
    """A small LitMLP with statistics far from 0 and 1, saved as Lightning saves one."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import pytorch_lightning as pl
    import torch

    from ..data.stats import Statistics
    from ..model import LitMLP

    rng = np.random.default_rng(0)
    stats = Statistics(rng.normal(size=9), rng.uniform(0.5, 2, 9), rng.normal(200, 80, 4),
                       rng.uniform(20, 60, 4))
    torch.manual_seed(0)
    model = LitMLP(9, hidden_channels=(6,), out_channels=4, stats=stats).eval()
    with tempfile.TemporaryDirectory(prefix="kosmoss-check-") as folder:
        path = Path(folder) / "model.ckpt"
        torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                    "pytorch-lightning_version": pl.__version__}, path)
        yield str(path), model


def predict_judge(namespace: dict) -> tuple:
    import torch

    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(1))
    with _checkpoint() as (path, model):
        got = learner(namespace, "predict_wm2")(path, x.clone())
    if not isinstance(got, torch.Tensor):
        return failed(f"predict_wm2 returned a {type(got).__name__}: return the tensor of fluxes")
    with torch.no_grad():
        expected = model(x)
        normalised = model.net(model.normalize_x(x))
    if got.shape != expected.shape:
        return failed(f"your fluxes have shape {tuple(got.shape)}, expected "
                      f"{tuple(expected.shape)}")
    gap = float((got.detach() - expected).abs().max())
    if gap > 1e-4:
        why = ""
        if torch.allclose(got.detach(), normalised, atol=1e-5):
            why = (": these are the network's normalised outputs — de-normalise them "
                   "(× y_std + y_mean), as LitMLP.forward does")
        return failed(f"your fluxes differ from the model's by up to {gap:.3g} W m-2{why}")
    note = "" if not got.requires_grad else " (but they track gradients: use torch.no_grad())"
    return passed(f"your fluxes equal the model's in W m-2{note}")


# ---------------------------------------------------------------- 02.optimizer_steps

STEPS_STATEMENT = """\
**Say how many optimizer steps `trainer.fit` takes.**

Write `optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1)`: the
`trainer.global_step` after `fit` on one process, with `n_train` training columns in
batches of `batch_size` (the last batch of an epoch may be smaller; none is dropped),
`epochs` epochs, and one optimizer step every `accumulate_grad_batches` batches (and at
the end of every epoch). The checker runs a real Lightning `Trainer` on tiny data for
several set-ups and compares.
"""

STEPS_SKELETON = '''
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    """trainer.global_step after fit."""
    raise NotImplementedError("your code here")
'''

STEPS_REFERENCE = '''
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    batches = math.ceil(n_train / batch_size)
    return math.ceil(batches / accumulate_grad_batches) * epochs
'''

STEPS_WRONG = {
    "drops the last partial batch": '''
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return n_train // batch_size * epochs // accumulate_grad_batches
''',
}

STEPS_CASES = ((10, 4, 2, 1), (10, 3, 1, 2), (9, 3, 2, 2), (7, 2, 3, 3), (12, 4, 1, 1))


@functools.lru_cache(maxsize=None)
def measured_steps(n_train: int, batch_size: int, epochs: int, accumulate: int) -> int:
    """``trainer.global_step`` of a real fit on ``n_train`` one-number samples."""
    import logging
    import warnings

    import pytorch_lightning as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_index):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.zeros(n_train, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)
    quiet = logging.getLogger("pytorch_lightning")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # no banners in the learner's output
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs,
                                 accumulate_grad_batches=accumulate, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False,
                                 enable_model_summary=False)
            trainer.fit(Tiny(), loader)
    finally:
        quiet.setLevel(level)
    return trainer.global_step


def steps_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "optimizer_steps")
    for case in STEPS_CASES:
        expected, got = measured_steps(*case), mine(*case)
        if got != expected:
            n, b, e, a = case
            return failed(f"for {n} columns, batches of {b}, {e} epoch(s), accumulating {a}: "
                          f"yours says {got!r}, the Trainer took {expected} steps "
                          f"({math.ceil(n / b)} batches per epoch)")
    return passed(f"matches a real Trainer in {len(STEPS_CASES)} set-ups")


EXERCISES = [
    Exercise("02.predict_wm2", PREDICT_STATEMENT, PREDICT_SKELETON, PREDICT_REFERENCE,
             PREDICT_WRONG, predict_judge, names=("predict_wm2",)),
    Exercise("02.optimizer_steps", STEPS_STATEMENT, STEPS_SKELETON, STEPS_REFERENCE,
             STEPS_WRONG, steps_judge, names=("optimizer_steps",)),
]
