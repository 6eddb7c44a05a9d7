"""Named synthetic datasets, and turning a ``--dataset`` value into a prepared dataset."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..errors import UsageError
from .sources import SyntheticSource
from .store import PreparedDataset, open_dataset, prepare


@dataclass(frozen=True)
class Preset:
    name: str
    n_columns: int
    shard_size: int
    purpose: str
    levels: int = 137
    seed: int = 42

    def source(self) -> SyntheticSource:
        return SyntheticSource(self.n_columns, seed=self.seed, levels=self.levels)


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
            return open_dataset(folder, verify=verify, trust_unchanged=trust_unchanged)
        if spec not in PRESETS:
            raise UsageError(f"unknown preset {spec!r}: choose one of {', '.join(PRESETS)}, "
                             "the name of a dataset in $KOSMOSS_HOME/data or a dataset folder")
        if prepare_missing:
            return prepare_preset(PRESETS[spec], log=log)
        return open_dataset(folder, verify=verify, trust_unchanged=trust_unchanged)
    except UsageError as err:
        raise type(err)(f"{flag} {spec}: {err}") from None


def prepare_preset(
    preset: Preset, *, force: bool = False, log: Optional[Callable[[str], None]] = None
) -> PreparedDataset:
    dest = paths.data_root() / preset.name
    if log:
        log(f"preparing dataset {preset.name!r}: {preset.n_columns} synthetic columns -> {dest}")
    return prepare(preset.source(), dest, preset.shard_size, force=force)

