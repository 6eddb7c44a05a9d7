"""Named synthetic datasets, and turning a ``--dataset`` value into a prepared dataset.

A preset keeps its name (``--dataset tiny``) whatever is in its folder, so the folder's
metadata.json is compared with the preset's request before it is used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..core import paths
from ..core.errors import UsageError, name_too_long
from .catalog import DEFAULT_PRESET, PRESETS, Preset, request_difference
from .store import PreparedDataset, open_dataset, prepare

# The catalogue's presets, for `presets.PRESETS` (lesson 1) and the commands.
__all__ = ["DEFAULT_PRESET", "PRESETS", "Preset", "check_name", "looks_like_path", "prepare_preset",
           "resolve"]


def looks_like_path(spec: str) -> bool:
    # Names never contain a slash; "./small" reaches a folder that shadows a preset.
    return "/" in spec or spec.startswith((".", "~"))


def check_name(name: str, flag: str = "--name") -> str:
    """A dataset name is one visible folder under ``$KOSMOSS_HOME/data``: nothing that
    climbs out of it or hides among the working folders."""
    if not name or "/" in name or "\\" in name or ".." in name or name.startswith(".") \
            or "\0" in name:
        raise UsageError(f"{flag} {name}: a dataset name is one folder name under "
                         "$KOSMOSS_HOME/data (no '/', '..' or leading '.'); "
                         "use --out DIR to write elsewhere")
    return name


def resolve(
    spec: str,
    *,
    prepare_missing: bool = True,
    verify: bool = True,
    trust_unchanged: bool = False,
    log: Optional[Callable[[str], None]] = None,
    flag: str = "--dataset",
) -> PreparedDataset:
    """A preset name (prepared on first use), a dataset name under ``$KOSMOSS_HOME/data``
    or a dataset folder -> a checked dataset."""
    try:
        if looks_like_path(spec):
            return open_dataset(Path(spec).expanduser(), verify=verify,
                                trust_unchanged=trust_unchanged)
        folder = paths.data_root() / spec
        if folder.exists():
            dataset = open_dataset(folder, verify=verify, trust_unchanged=trust_unchanged)
            if spec in PRESETS:
                _check_preset(dataset, PRESETS[spec])
            return dataset
        if spec not in PRESETS:
            raise UsageError(f"unknown preset {spec!r}: choose one of {', '.join(PRESETS)}, "
                             "the name of a dataset in $KOSMOSS_HOME/data or a dataset folder")
        if prepare_missing:
            return prepare_preset(PRESETS[spec], log=log)
        return open_dataset(folder, verify=verify, trust_unchanged=trust_unchanged)
    except UsageError as err:
        said = str(err)  # a folder's own error starts with its path: said once, not twice
        said = said[len(spec) + 2:] if said.startswith(f"{spec}: ") else said
        raise type(err)(f"{flag} {spec}: {said}") from None
    except OSError as err:  # a name or path over the file system's limits: shown shortened
        too_long = name_too_long(err)
        if too_long is None:
            raise
        raise UsageError(f"{flag}: {too_long}") from None


def _check_preset(dataset: PreparedDataset, preset: Preset) -> None:
    difference = request_difference(dataset.metadata, preset.request())
    if difference:
        raise UsageError(f"{dataset.path} holds another dataset than the preset {preset.name}: "
                         f"{difference}; replace it: `kosmoss data prepare {preset.name} --force`")


def prepare_preset(
    preset: Preset, *, force: bool = False, log: Optional[Callable[[str], None]] = None
) -> PreparedDataset:
    dest = paths.data_root() / preset.name
    if log:
        log(f"preparing dataset {preset.name!r}: {preset.n_columns} synthetic columns -> {dest}")
    return prepare(preset.source(), dest, preset.shard_size, force=force, log=log)
