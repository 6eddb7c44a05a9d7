"""The datasets kosmoss knows how to make: what decides a dataset's content (its
*request*: the source's description and the shard size), the named presets, and the
command that prepares a dataset again. The store (:mod:`.store`) writes and checks
requests; :mod:`.presets` turns a ``--dataset`` value into a prepared dataset."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ..core import paths
from .sources import ColumnSource, SyntheticSource

METADATA_FILE = "metadata.json"
VOLATILE_SOURCE_KEYS = ("plugin_version",)
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


def request_of(source: ColumnSource, shard_size: int) -> dict:
    """What decides a dataset's content: the source's description and the shard size
    (synthetic shard ``k`` is seeded by ``(seed, k)``)."""
    return _plain({"source": source.describe(), "shard_size": shard_size})


def stored_request(metadata: dict) -> dict:
    return _plain({"source": metadata.get("source", {}), "shard_size": metadata.get("shard_size")})


def request_difference(metadata: dict, request: dict) -> str:
    """'' when a dataset's metadata holds ``request``, else what differs, e.g.
    ``seed 1 (asked 2)``."""
    held, asked = _flatten(stored_request(metadata)), _flatten(_plain(request))
    return ", ".join(f"{key} {_show(held.get(key))} (asked {_show(asked.get(key))})"
                     for key in sorted(set(held) | set(asked)) if held.get(key) != asked.get(key))


def _plain(request: dict) -> dict:
    # JSON round trip: tuples become lists, as they are once read back from metadata.json
    plain = json.loads(json.dumps(request))
    for key in VOLATILE_SOURCE_KEYS:
        plain.get("source", {}).pop(key, None)
    return plain


def _flatten(tree: dict) -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value))
        else:
            flat["source" if key == "name" else key] = value
    return flat


def _show(value) -> str:
    return "-" if value is None else json.dumps(value)


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
    elif folder.name in PRESETS:  # a preset's folder takes that preset only
        words = [folder.name]
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


def again(folder: Path) -> str:
    """The advice that ends an error about a broken dataset: the exact command, if the
    command line can make its request."""
    command = preparation_command(folder)
    if command is None:
        return f"prepare it again (with --force, or delete {folder} first)"
    return f"prepare it again: `{command}`"
