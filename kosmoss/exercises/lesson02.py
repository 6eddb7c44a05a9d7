"""Lesson 02 (Lightning basics): predict in W m-2 from a checkpoint alone; say how many
optimizer steps ``trainer.fit`` takes (checked against a real Trainer).

    kosmoss check 02
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator

from .core import Exercise, Mistake, failed, is_integer, learner, number_hint, passed

# ---------------------------------------------------------------- 02.predict_wm2

PREDICT_STATEMENT = """\
**Predict fluxes in W m-2 from a checkpoint alone.**

Write `predict_wm2(checkpoint_path, x)`: load the `LitMLP` saved at `checkpoint_path`
(no dataset, no statistics at hand: they are in the checkpoint's buffers) and return its
prediction for the columns `x` (a float32 tensor, one flattened column per row; a batch
may hold a single column) as a tensor in W m-2, of shape (columns, targets), computed
without tracking gradients and leaving `x` as it was. The checker saves a small model with
known statistics and compares your fluxes with the model's, to float32 rounding.
"""

PREDICT_SKELETON = """
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    \"\"\"Fluxes in W m-2 predicted for the columns x by the LitMLP saved at checkpoint_path.\"\"\"
    raise NotImplementedError("your code here")
"""

PREDICT_REFERENCE = """
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu")
    model.eval()
    with torch.no_grad():
        return model(x)
"""

PREDICT_WRONG = {
    "normalised output": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path)
    with torch.no_grad():
        return model.net(model.normalize_x(x))
""", "normalised outputs"),
    "tracks gradients": Mistake("""
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    return LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu")(x)
""", "torch.no_grad()"),
    "a model with the checkpoint's settings but not its weights": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    saved = torch.load(checkpoint_path, weights_only=False)
    model = LitMLP(**saved["hyper_parameters"])
    with torch.no_grad():
        return model(x)
""", "load_from_checkpoint"),
    "normalises x before the model does": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path)
    with torch.no_grad():
        return model(model.normalize_x(x))
""", "normalised twice"),
    "predicts in bfloat16": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path).to(torch.bfloat16)
    with torch.no_grad():
        return model(x.to(torch.bfloat16)).float()
""", "the rounding of a 16-bit float"),
    "returns numpy": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path)
    with torch.no_grad():
        return model(x).numpy()
""", "return the tensor"),
    "normalises x in place": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    with torch.no_grad():
        x.sub_(model.x_mean).div_(model.x_std)
        return model.net(x) * model.y_std + model.y_mean
""", "x changed in place"),
    "autograd switched off for good": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    torch.set_grad_enabled(False)
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    return model(x)
""", "autograd is left switched off"),
    "squeezes the batch": Mistake("""
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path)
    with torch.no_grad():
        return model(x).squeeze()
""", "a batch of a single column"),
}

PREDICT_BATCHES = (5, 1)  # columns per call: a batch of one is an edge
# (which checkpoint, rows) per call: a second checkpoint catches a model kept across calls
PREDICT_CALLS = tuple((seed, rows) for seed in range(2) for rows in PREDICT_BATCHES)


@contextlib.contextmanager
def _checkpoint(seed: int = 0) -> Iterator[tuple]:
    """A small LitMLP with statistics far from 0 and 1, saved as Lightning saves one."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import pytorch_lightning as pl
    import torch

    from ..data.stats import Statistics
    from ..model import LitMLP

    rng = np.random.default_rng(seed)
    stats = Statistics(rng.normal(size=9), rng.uniform(0.5, 2, 9), rng.normal(200, 80, 4),
                       rng.uniform(20, 60, 4))
    torch.manual_seed(seed)
    model = LitMLP(9, hidden_channels=(6,), out_channels=4, stats=stats).eval()
    with tempfile.TemporaryDirectory(prefix="kosmoss-check-") as folder:
        path = Path(folder) / "model.ckpt"
        torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                    "pytorch-lightning_version": pl.__version__}, path)
        yield str(path), model


def predict_tolerance(model, x) -> float:
    """The model's own float32 forward pass against its float64 one: a right answer is a
    float32 forward pass too, in another order of operations at most. Eight times the
    largest deviation, and at least 8 float32 steps of the largest flux."""
    import copy

    import torch

    with torch.no_grad():
        exact, single = copy.deepcopy(model).double()(x.double()), model(x)
    deviation = float((single.double() - exact).abs().max())
    return max(8 * deviation, 8 * torch.finfo(torch.float32).eps * float(exact.abs().max()))


def predict_judge(namespace: dict) -> tuple:
    import torch

    mine = learner(namespace, "predict_wm2")
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)  # for what runs after this check, the notebook's too
        return failed("autograd was switched off before predict_wm2 was even called "
                      "(torch.set_grad_enabled(False) in your cell?), and every later backward "
                      "in the notebook would fail: the checker switched it back on — predict "
                      "inside `with torch.no_grad():`, which switches it back on by itself")
    answered = {}  # the first checkpoint's model, by the batches it was asked
    for seed, rows in PREDICT_CALLS:
        other = " of a second checkpoint" if seed else ""
        with _checkpoint(seed) as (path, model):
            x = torch.randn(rows, 9, generator=torch.Generator().manual_seed(rows))
            tracked: list = []
            given = x.clone()
            with _graphs_built(tracked), _grad_mode_kept() as grad_mode:
                got = mine(path, given)
            message = (_stale_model(got, answered.get(rows), model, x)
                       or _prediction_mistake(got, model, x) or _built_graph(got, tracked)
                       or _changed_input(given, x) or _grad_left_off(grad_mode))
            if message:
                return failed(f"for {rows} column(s){other}: {message}")
            answered.setdefault(rows, model)
    return passed(f"your fluxes equal the model's in W m-2, for batches of "
                  f"{' and '.join(map(str, PREDICT_BATCHES))} column(s), from "
                  f"{len({seed for seed, _ in PREDICT_CALLS})} checkpoints")


def _stale_model(got, first, model, x):
    """A model loaded once and kept across calls answers for the first checkpoint."""
    import torch

    if first is None or not isinstance(got, torch.Tensor):
        return None
    with torch.no_grad():
        stale, expected = first(x), model(x)
    if got.shape != stale.shape or torch.allclose(stale, expected):
        return None
    if torch.allclose(got.detach().to(stale.dtype), stale, atol=predict_tolerance(first, x)):
        return ("these are the first checkpoint's fluxes: load the checkpoint predict_wm2 is "
                "given at every call — a model kept from an earlier call (a cache, a global) "
                "answers for another checkpoint")
    return None


@contextlib.contextmanager
def _grad_mode_kept() -> Iterator[dict]:
    """Whether autograd was on before the learner's code and still on after it; switched
    back as it was either way (the checks after it, and the notebook, need it)."""
    import torch

    mode = {"before": torch.is_grad_enabled()}
    try:
        yield mode
    finally:
        mode["after"] = torch.is_grad_enabled()
        torch.set_grad_enabled(mode["before"])


def _grad_left_off(mode: dict):
    """torch.set_grad_enabled(False) in a function switches autograd off for the whole
    notebook: every training step after it computes no gradient."""
    if not mode["before"] or mode["after"]:
        return None
    return ("your fluxes are right but autograd is left switched off once predict_wm2 has "
            "returned (torch.set_grad_enabled(False)): every later backward in the notebook "
            "fails — compute them inside `with torch.no_grad():`, which switches it back on")


def _changed_input(given, x):
    """A prediction that normalises x in place hands the caller back other columns."""
    import torch

    if given.shape == x.shape and torch.equal(given, x):
        return None
    return ("your fluxes are right but x changed in place (e.g. x.sub_): the caller's "
            "columns are theirs — normalise a new tensor, as the model's forward does")


def _prediction_mistake(got, model, x):
    import torch

    if not isinstance(got, torch.Tensor):
        return f"predict_wm2 returned a {type(got).__name__}: return the tensor of fluxes"
    with torch.no_grad():
        expected = model(x)
        normalised = model.net(model.normalize_x(x))
        twice = model(model.normalize_x(x))
    if got.shape != expected.shape:
        return (f"your fluxes have shape {tuple(got.shape)}, expected {tuple(expected.shape)} "
                "— one row per column, even for a batch of a single column")
    tolerance = predict_tolerance(model, x)
    gap = float((got.detach().double() - expected.double()).abs().max())
    if gap > tolerance:
        return (f"your fluxes differ from the model's by up to {gap:.3g} W m-2 (tolerance "
                f"{tolerance:.1g})" + _prediction_hint(got.detach().to(expected.dtype),
                                                       expected, normalised, twice))
    if got.requires_grad:
        return ("your fluxes are right but track gradients (requires_grad): compute them "
                "under torch.no_grad() — a prediction needs no graph, and keeps none in memory")
    return None


@contextlib.contextmanager
def _graphs_built(tracked: list) -> Iterator[None]:
    """Record the modules whose output tracked gradients while the learner's code ran (a
    forward outside torch.no_grad() builds a graph, whatever is done with its result)."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook

    def hook(module, args, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            tracked.append(type(module).__name__)

    handle = register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _built_graph(got, tracked: list):
    """A forward that built a graph, its result detached afterwards (a result that still
    tracks gradients is told so by _prediction_mistake)."""
    if not tracked or got.requires_grad:
        return None
    return (f"your fluxes are right, but the model's forward ran tracking gradients (the "
            f"output of {tracked[-1]} required grad): .detach() afterwards does not undo the "
            "graph it built — compute them under torch.no_grad()")


def _prediction_hint(got, expected, normalised, twice) -> str:
    import torch

    if torch.allclose(got, normalised, atol=1e-4):
        return (": these are the network's normalised outputs — de-normalise them "
                "(× y_std + y_mean), as LitMLP.forward does")
    if torch.allclose(got, twice, atol=1e-3):
        return ": your input was normalised twice — LitMLP.forward normalises x itself"
    relative = float((got - expected).abs().max()) / float(expected.abs().max())
    if 1e-4 < relative < 0.05:  # 2^-8 (bfloat16) to 2^-11 (float16), grown by the layers
        return (f": off by about {relative:.0e} of the fluxes' size — the rounding of a "
                "16-bit float (bfloat16 keeps 8 bits): predict in float32")
    return (": are the checkpoint's weights and statistics loaded? LitMLP.load_from_checkpoint "
            "restores both")


# ---------------------------------------------------------------- 02.optimizer_steps

STEPS_STATEMENT = """\
**Say how many optimizer steps `trainer.fit` takes.**

Write `optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1)`: the
`trainer.global_step` (an integer) after `fit` on one process, with `n_train` training
columns in batches of `batch_size` (the last batch of an epoch may be smaller; none is
dropped), `epochs` epochs, and one optimizer step every `accumulate_grad_batches`
batches (and at the end of every epoch). The checker runs a real Lightning `Trainer` on
tiny data for several set-ups — batches that do not divide, more accumulation than an
epoch has batches, fewer columns than a batch — and compares.
"""

STEPS_SKELETON = """
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    \"\"\"trainer.global_step after fit.\"\"\"
    raise NotImplementedError("your code here")
"""

STEPS_REFERENCE = """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    batches = math.ceil(n_train / batch_size)
    return math.ceil(batches / accumulate_grad_batches) * epochs
"""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# (name, what it computes, what the learner is told): the mistakes the checker can name.
STEP_MISTAKES = (
    ("drops the last partial batch", lambda n, b, e, a: n // b * e // a,
     "the last, smaller batch of an epoch is not dropped: ceil(n_train / batch_size) batches"),
    ("forgets the step at the end of an epoch", lambda n, b, e, a: _ceil(n, b) // a * e,
     "Lightning also steps at the end of every epoch, with the batches accumulated so far"),
    ("accumulates across epochs", lambda n, b, e, a: _ceil(_ceil(n, b) * e, a),
     "accumulation does not carry over into the next epoch: count the steps per epoch"),
    ("forgets the epochs", lambda n, b, e, a: _ceil(_ceil(n, b), a),
     "that is one epoch's steps: multiply by the epochs"),
    ("counts batches, not steps", lambda n, b, e, a: _ceil(n, b) * e,
     "that counts batches: one optimizer step every accumulate_grad_batches batches"),
)

STEPS_WRONG = {
    name: Mistake(body, says) for name, body, says in (
        ("drops the last partial batch", """
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return n_train // batch_size * epochs // accumulate_grad_batches
""", "the last, smaller batch"),
        ("forgets the step at the end of an epoch", """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(n_train / batch_size) // accumulate_grad_batches * epochs
""", "at the end of every epoch"),
        ("accumulates across epochs", """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(math.ceil(n_train / batch_size) * epochs / accumulate_grad_batches)
""", "does not carry over"),
        ("forgets the epochs", """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(math.ceil(n_train / batch_size) / accumulate_grad_batches)
""", "multiply by the epochs"),
        ("counts batches, not steps", """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(n_train / batch_size) * epochs
""", "one optimizer step every accumulate_grad_batches"),
        ("a float count", """
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(n_train / batch_size / accumulate_grad_batches) * epochs * 1.0
""", "an integer"),
    )
}

STEPS_CASES = ((10, 4, 2, 1), (10, 3, 1, 2), (9, 3, 2, 2), (7, 2, 3, 3), (12, 4, 1, 1),
               (3, 4, 2, 1), (10, 3, 2, 5))


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
    answers = {case: mine(*case) for case in STEPS_CASES}
    for case in STEPS_CASES:
        expected, got = measured_steps(*case), answers[case]
        n, b, e, a = case
        setup = (f"for {n} columns, batches of {b}, {e} epoch(s), accumulating {a}: yours says "
                 f"{got!r}")
        if not is_integer(got):
            return failed(f"{setup}: " + number_hint(
                got, "a count of steps is an integer (no / in the arithmetic)"))
        if got != expected:
            return failed(f"{setup}, the Trainer took {expected} steps ({_ceil(n, b)} "
                          f"batches per epoch)" + _steps_hint(answers))
    return passed(f"matches a real Trainer in {len(STEPS_CASES)} set-ups")


def _steps_hint(answers: dict) -> str:
    for _, formula, hint in STEP_MISTAKES:
        if all(formula(*case) == got for case, got in answers.items()):
            return f": {hint}"
    return ""


EXERCISES = [
    Exercise("02.predict_wm2", PREDICT_STATEMENT, PREDICT_SKELETON, PREDICT_REFERENCE,
             PREDICT_WRONG, predict_judge, names=("predict_wm2",)),
    Exercise("02.optimizer_steps", STEPS_STATEMENT, STEPS_SKELETON, STEPS_REFERENCE,
             STEPS_WRONG, steps_judge, names=("optimizer_steps",),
             forbidden=("pytorch_lightning.trainer", "lightning.pytorch.trainer")),
]
