"""``--resume RUN``: continue a stopped run with its own settings, from its newest
checkpoint that can be read.

    python trainup_cpu.py --resume 20261122-101500-3f2a1c              # as it was started
    python trainup_cpu.py --resume 20261122-101500-3f2a1c --max-steps 2000  # and further
    python trainup_cpu.py --resume ~/.kosmoss/runs/<id>/checkpoints/epoch=3-step=52.ckpt

The stopped run's settings come from its record (``run.json``, else ``result.json``): a
flag not typed takes the stopped run's value; a typed flag that would change the training
itself (batch, learning rate, model, data, seed, ...) is a one-line error
naming both values; a typed flag that only extends or reshapes the work (``--max-steps``,
``--max-epochs``, the engine or the world size, ...) is an override, printed. A finished run is
continued only when asked to train further; a run whose processes still live is refused.
Everything here is read, nothing written.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

from ..core.errors import ConfigError
from ..core.files import read_json_object
from ..launch import records
from . import lightning_private as private
from .config import RunConfig, run_folder
from .flags import flag_names
from .preemption import CHECKPOINT as PREEMPTED

# Settings that make the training what it is: a resume never changes them.
FIXED = ("batch_size", "lr", "scale_lr", "base_batch_size", "warmup_steps", "dataset", "seed",
         "hidden", "precision")
NORMALISATION = ("x_mean", "x_std", "y_mean", "y_std")  # LitMLP's buffers, from the data
# Fixed in content, not in place: data staged elsewhere (a job's scratch folder, a moved
# home) resumes when its statistics are the checkpoint's normalisation (check_data).
MOVABLE = ("dataset",)
# Settings a resume takes from the stopped run unless a flag says otherwise (then printed).
# The engine and the world size too: the global batch is fixed, so a checkpoint moves
# between DDP and Horovod, or to more ranks, and trains on the same way.
# K too: several steps per loop step train bit for bit as one (kosmoss.run.chunks).
# --compile and --cuda-graphs too: a resumed run trains as fast, and as bit for bit, as it did.
CARRIED = ("max_epochs", "max_steps", "val_every_n_epochs", "mode", "num_workers",
           "collective_timeout_s", "gpu_ids", "num_processes", "num_nodes", "strategy",
           "steps_per_execution", "progress", "result_json", "require_gpu", "compile",
           "cuda_graphs", "hosts", "link_rate")
# What the launcher and the machine decide each time (trainup_gpu.py, a GPU or none), and
# the resume itself: never taken from the record.
DECIDED_AGAIN = ("machine_gpu", "gpu_index", "use_gpu", "resume", "given")


@dataclass(frozen=True)
class ResumePoint:
    run_id: str
    run_dir: Path
    checkpoint: Path
    step: int
    model: Tuple[Optional[int], Tuple[int, ...], Optional[int]]  # the checkpoint's in, hidden, out
    config: RunConfig  # the stopped run's settings, with the overrides
    notes: Tuple[str, ...]  # the overrides, said before training
    stored: dict  # the run's record as found
    # The normalisation the checkpoint's weights were trained with (LitMLP's buffers), as
    # float32 arrays by name: the data it was trained on, summed up.
    normalisation: Dict[str, object] = field(default_factory=dict)

    def check_model(self, n_x: int, hidden: Tuple[int, ...], n_y: int) -> None:
        """The dataset (and layers) must be those the checkpoint was trained on."""
        if self.model != (n_x, tuple(hidden), n_y) and None not in self.model:
            raise ConfigError("dataset", f"{{field}} {self.config.dataset}: {n_x} features in, "
                              f"{n_y} out, but the checkpoint of run {self.run_id} has "
                              f"{self.model[0]} in, {self.model[2]} out; resume with the "
                              "dataset it was trained on")

    def check_data(self, statistics) -> None:
        """The dataset must hold the data the checkpoint was trained on: the same statistics
        as its normalisation buffers. A folder prepared again with other data (another seed
        or source, --force) trained on silently, the old normalisation on the new data."""
        import numpy as np

        ours = {"x_mean": statistics.x_mean, "x_std": statistics.x_scale(),
                "y_mean": statistics.y_mean, "y_std": statistics.y_scale()}
        for name, saved in self.normalisation.items():
            mine = np.asarray(ours[name], dtype=np.float32)
            # Not bit for bit: the same data sharded otherwise sums in another order. A mean
            # is compared on its feature's scale (a mean near 0 has no relative precision).
            scale = ours[name.replace("mean", "std")] if "mean" in name else np.abs(mine)
            if saved.shape != mine.shape or np.any(np.abs(saved - mine) > 1e-5 * scale):
                raise ConfigError("dataset", f"{{field}} {self.config.dataset}: it holds other "
                                  f"data than run {self.run_id} was trained on (its {name} "
                                  "differs from the checkpoint's); resume with that data, or "
                                  "start a new run")

    def check_can_continue(self, world_size: int) -> None:
        """In the process that starts the attempt (the ranks it starts see the run running):
        the run is not running any more, and a finished run is asked for more. The world size
        may change (the global batch does not)."""
        resume = self.config.resume
        if self.stored.get("state") == records.RUNNING and \
                records.settle_if_gone(self.run_dir) is None:
            launcher = (self.stored.get("launcher") or {}).get("pid")
            raise ConfigError("resume", f"{{field}} {resume}: the run is still running (launcher "
                              f"pid {launcher}); stop it first (kosmoss ghosts --kill ends "
                              "ghosts), then resume")
        if self.stored.get("state") == records.FINISHED:
            _check_asked_further(resume, self.stored.get("config") or {}, self.config)


def find(config: RunConfig) -> ResumePoint:
    """The resume point of ``config.resume``: the run, its checkpoint and its settings."""
    run_dir, named = run_folder(config.resume)
    stored = _stored_run(run_dir, config.resume)
    merged, notes = merge(config, _base_made_explicit(stored), config.resume)
    checkpoint, content = readable_checkpoint(run_dir, named, config.resume)
    _check_limits_ahead(merged, content, _given(config), stored.get("config") or {}, run_dir.name)
    hparams = content.get("hyper_parameters") or {}
    model = (hparams.get("in_channels"), tuple(hparams.get("hidden_channels") or ()),
             hparams.get("out_channels"))
    weights = content.get("state_dict") or {}
    normalisation = {name: weights[name].float().numpy() for name in NORMALISATION
                     if name in weights}
    recorded = (stored.get("config") or {}).get("dataset")
    if not normalisation and recorded is not None and merged.dataset != recorded:
        raise ConfigError("dataset", f"{{field}} {merged.dataset}: the checkpoint of run "
                          f"{run_dir.name} keeps no normalisation to check other data against; "
                          f"resume with --dataset {recorded}")
    return ResumePoint(run_dir.name, run_dir, checkpoint, int(content["global_step"]), model,
                       merged, notes, stored, normalisation)


def _base_made_explicit(stored: dict) -> dict:
    """The stopped run's settings with the batch its rate was scaled from written out: left
    unset it is the per-device batch, which a resume on another world size would change, and
    the rate printed and kept in the checkpoint's hyper-parameters with it, while the optimizer
    state restored trains on at the stopped run's rate."""
    config = dict(stored.get("config") or {})
    world, batch = stored.get("world_size"), config.get("batch_size")
    if config.get("base_batch_size") is None and world and batch:
        config["base_batch_size"] = batch // world
    return config


def _stored_run(run_dir: Path, resume: str) -> dict:
    """run.json (written when the run started, so a killed run has it); result.json for a
    run recorded before run.json kept the settings. A run.json that cannot be read is
    refused: it says whether the run finished, and a resume that cannot tell would train a
    finished run for no step and write its result.json over the real one."""
    run_file = run_dir / records.RUN_FILE
    try:
        stored = read_json_object(run_file)
    except FileNotFoundError:
        stored = {}
    except (OSError, ValueError) as error:
        raise ConfigError("resume", f"{{field}} {resume}: its {run_file} cannot be read "
                          f"({error}); it holds the run's state and settings: put it back, "
                          "or start a new run") from None
    if not stored.get("config"):
        try:
            result = read_json_object(run_dir / "result.json")
        except (OSError, ValueError):
            result = {}
        stored = {**stored, "config": result.get("config"),
                  "world_size": stored.get("world_size", result.get("world_size"))}
    return stored


def merge(config: RunConfig, stored: dict, resume: str) -> Tuple[RunConfig, Tuple[str, ...]]:
    """The stopped run's settings, the typed flags on top where allowed."""
    given = _given(config)
    changes, notes = {}, []
    for name in FIXED + CARRIED:
        if name not in stored:
            continue
        theirs, mine = _as_field(name, stored[name]), getattr(config, name)
        if name not in given or mine == theirs:
            changes[name] = theirs
        elif name in MOVABLE:  # the data moved: find() checks it against the checkpoint
            notes.append(f"resume: {flag_names()[name]} {_show(mine)} (the stopped run had "
                         f"{_show(theirs)}): checked to hold the data it trained on")
        elif name in FIXED:
            said = "default {field}" if theirs is None else f"{{field}} {_show(theirs)}"
            raise ConfigError(name, f"{{field}} {_show(mine)} contradicts the resumed run's "
                              f"{said} (run {Path(resume).name}): drop "
                              "{field} to keep it, or start a new run without --resume")
        else:
            notes.append(f"resume: {flag_names()[name]} {_show(mine)} (the stopped run had "
                         f"{_show(theirs)})")
    merged = replace(config, **changes)
    if merged.hosts != "netns" and merged.link_rate is not None and "link_rate" not in given:
        # The rate shapes the hosts' links: leaving the hosts leaves it behind.
        notes.append(f"resume: --link-rate {merged.link_rate} dropped with --hosts "
                     f"{merged.hosts} (no link to shape)")
        merged = replace(merged, link_rate=None)
    return merged, tuple(notes)


def _given(config: RunConfig) -> FrozenSet[str]:
    if config.given is not None:
        return config.given
    defaults = RunConfig()  # a call from code: what differs from the defaults was meant
    return frozenset(f.name for f in fields(RunConfig)
                     if getattr(config, f.name) != getattr(defaults, f.name))


def _as_field(name: str, value):
    if name in ("hidden", "gpu_ids") and value is not None:
        return tuple(value)  # JSON has lists where the configuration has tuples
    if name == "result_json" and value is not None:
        return Path(value)
    return value


def _show(value) -> str:
    if value is None:
        return "the default"  # a flag left unset: None in the record
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "()"
    return str(value)


def _check_asked_further(resume: str, stored: dict, merged: RunConfig) -> None:
    """A finished run is modified only when the resume asks for more training."""
    steps, epochs = stored.get("max_steps", -1), stored.get("max_epochs", 0)
    more_steps = steps != -1 and (merged.max_steps == -1 or merged.max_steps > steps)
    further = merged.max_epochs > epochs or more_steps
    if not further:
        raise ConfigError("resume", f"{{field}} {resume}: the run finished; to train it further "
                          "give a larger --max-epochs or --max-steps than it had "
                          f"({stored.get('max_epochs')} epochs, max steps "
                          f"{stored.get('max_steps')})")


def _check_limits_ahead(merged: RunConfig, content: dict, given: FrozenSet[str], stored: dict,
                        run_id: str) -> None:
    """A --max-steps or --max-epochs below where the checkpoint stands is refused before
    the run's record takes it: Lightning raised for epochs (then every bare resume did, the
    record holding the low limit), and a step limit ended the stopped run at once, finished."""
    step, done = int(content.get("global_step", 0)), int(content.get("epoch", 0))
    loops = private.fit_loop_state(content)
    loader = private.loader_states(loops)[0] if loops else {}
    # Inside epoch ``done`` (not at the end of the one before, whose loader says done - 1).
    partial = loader.get("epoch") == done and (loader.get("batches_done") or 0) > 0
    for name, at, inside in (("max_steps", step, False), ("max_epochs", done, partial)):
        limit = getattr(merged, name)
        if limit is None or limit == -1 or at < limit or (at == limit and not inside):
            continue  # at it exactly: nothing left, the run finishes
        theirs = "no limit" if stored.get(name) == -1 else stored.get(name)
        keep = f", or drop it to keep the run's {theirs}" if name in given and \
            name in stored else ""
        raise ConfigError(name, f"{{field}} {limit}: run {run_id} is past it, its checkpoint at "
                          f"step {step} with {done} epoch(s) done"
                          f"{' and part of the next' if partial else ''}; give a larger "
                          f"{{field}}{keep}")


def readable_checkpoint(run_dir: Path, named: Optional[Path], resume: str) -> Tuple[Path, dict]:
    """The checkpoint to resume from and its content: the one named, else the furthest of
    the run's checkpoints of any kind (``preempted.ckpt`` saved at a stop, ``last.ckpt``,
    the best ones: a write that failed on a full disk leaves the others); on a tie the
    preempted one, then last.ckpt. One that cannot be read is a one-line error naming one
    that can (its step cannot be known: it may be the furthest)."""
    candidates = [named] if named else _all_checkpoints(run_dir)
    if not candidates:
        raise ConfigError("resume", f"{{field}} {resume}: no checkpoint (*.ckpt) in "
                          f"{run_dir / 'checkpoints'}; nothing to resume: start the run again")
    loaded = []
    for path in candidates:
        try:
            loaded.append((path, load(path)))
        except FileNotFoundError:
            if path == named:
                raise ConfigError("resume", f"{{field}} {resume}: no such checkpoint file "
                                  "(it was removed)") from None
            continue  # a live run's ModelCheckpoint replaced it since the listing
        except Exception as err:  # torch raises many kinds for a truncated or damaged file
            raise _unreadable(resume, run_dir, path, err) from None
    if not loaded:
        raise ConfigError("resume", f"{{field}} {resume}: its checkpoints changed while they "
                          "were read (is the run still running?); try again")
    return max(loaded, key=lambda item: int(item[1]["global_step"]))  # max keeps the first


def _unreadable(resume: str, run_dir: Path, path: Path, err: Exception) -> ConfigError:
    first = str(err).split(". ")[0].splitlines()[0] if str(err) else ""
    reason = f"{type(err).__name__}: {first}"[:120]
    fallback = next((other for other in _all_checkpoints(run_dir)
                     if other != path and _readable(other)), None)
    how = (f"resume from an older checkpoint with --resume {fallback}" if fallback else
           "no other checkpoint of this run can be read: start a new run")
    return ConfigError("resume", f"{{field}} {resume}: checkpoints/{path.name} cannot be read "
                       f"({reason}); {how}")


def load(path: Path) -> dict:
    """A checkpoint's content, on CPU (whichever device saved it)."""
    import torch

    content = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(content, dict) or "global_step" not in content:
        raise ValueError("not a Lightning checkpoint")
    return content


def checkpoint_step(path: Path) -> int:
    return int(load(path)["global_step"])


def _readable(path: Path) -> bool:
    try:
        load(path)
        return True
    except Exception:
        return False


def _resumable(run_dir: Path) -> List[Path]:
    folder = run_dir / "checkpoints"
    return [p for p in (folder / PREEMPTED, folder / "last.ckpt") if p.is_file()]


def _all_checkpoints(run_dir: Path) -> List[Path]:
    """Every checkpoint of the run: the resumable ones, then the best, newest first
    (a write's temporary file, ``.NAME.tmp-PID``, is none)."""
    folder = run_dir / "checkpoints"
    best = sorted((p for p in folder.glob("*.ckpt") if p.is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    resumable = _resumable(run_dir)
    return resumable + [p for p in best if p not in resumable]
