"""Named synthetic datasets, and turning a ``--dataset`` value into a prepared dataset.

A preset keeps its name (``--dataset tiny``) whatever is in its folder, so the folder's
metadata.json is compared with the preset's request before it is used.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from .. import paths
from ..errors import UsageError
from .sources import SyntheticSource
from .store import (METADATA_FILE, PreparedDataset, open_dataset, prepare, request_difference,
                    request_of, stored_request)

DEFAULT_LEVELS, DEFAULT_SEED, DEFAULT_SHARD_SIZE = 137, 42, 4096


@dataclass(frozen=True)
class Preset:
    name: str
    n_columns: int
    shard_size: int
    purpose: str
    levels: int = DEFAULT_LEVELS
    seed: int = DEFAULT_SEED

    def source(self) -> SyntheticSource:
        return SyntheticSource(self.n_columns, seed=self.seed, levels=self.levels)

    def request(self) -> dict:
        return request_of(self.source(), self.shard_size)


PRESETS = {
    p.name: p
    for p in (
        Preset("tiny", 2_048, 512, "tests and quick lessons (38 MB, about a second)"),
        Preset("small", 32_768, 4_096, "the default: a 2-core laptop prepares it in seconds (610 MB)"),
        Preset("large", 1_048_576, 65_536, "GPU benchmarks (20 GB)"),
    )
}
DEFAULT_PRESET = "small"


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
        raise type(err)(f"{flag} {spec}: {err}") from None


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


def preparation_command(folder: Path) -> Optional[str]:
    """The ``kosmoss data prepare ... --force`` line that writes ``folder`` again from the
    request in its metadata.json; None where the command line cannot make that request."""
    folder = Path(folder)
    try:
        request = stored_request(json.loads((folder / METADATA_FILE).read_text()))
    except (OSError, ValueError, AttributeError):
        return None
    words = _request_words(request)
    if words is None:
        return None
    preset = words[0] if words[0] in PRESETS else None
    if folder.parent.resolve() != paths.data_root().resolve():
        words += ["--out", str(folder)]
    elif folder.name != preset:
        words += ["--name", folder.name]
    return shlex.join(["kosmoss", "data", "prepare", *words, "--force"])


def _request_words(request: dict) -> Optional[List[str]]:
    source, shard_size = request["source"], request["shard_size"]
    for preset in PRESETS.values():
        if request == preset.request():
            return [preset.name]
    if source.get("name") == "synthetic" and set(source) == {"name", "seed", "n_columns", "levels"}:
        return ["--columns", str(source["n_columns"]), "--levels", str(source["levels"]),
                "--seed", str(source["seed"]), "--shard-size", str(shard_size)]
    asked = source.get("request", {})
    if source.get("name") == "maelstrom" and source.get("origin") == "climetlab" \
            and set(asked) == {"dataset", "date", "timestep", "patch"}:
        return ["--source", "maelstrom", "--date", str(asked["date"]), "--timestep",
                str(asked["timestep"]), "--patch", *map(str, asked["patch"]),
                "--shard-size", str(shard_size)]
    return None
