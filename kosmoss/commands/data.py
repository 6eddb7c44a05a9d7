"""``kosmoss data prepare`` and ``kosmoss data info``.

    kosmoss data prepare tiny                       # a preset, $KOSMOSS_HOME/data/tiny
    kosmoss data prepare --columns 300 --seed 1     # -> data/synthetic-300col-137lev-seed1
    kosmoss data prepare --source maelstrom --date 20200101 --patch 0 2
    kosmoss data prepare tiny --force               # replace a (broken) kosmoss dataset
    kosmoss data info [NAME|PATH] [--verify] [--json]

The default name of a dataset spells out its request, so two requests never share a
folder; a name given with ``--name`` is checked against the metadata.json already there.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from importlib.util import find_spec
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..core import paths
from ..core.commandline import OneLineParser, command_main
from ..core.errors import UsageError
from ..data import presets
from ..data.catalog import DEFAULT_LEVELS, DEFAULT_SEED, DEFAULT_SHARD_SIZE
from ..data.sources import SyntheticSource
from ..data.store import clean_leftovers, open_dataset, prepare

HELP = "prepare and inspect datasets"
SYNTHETIC_FLAGS = {"columns": "--columns", "levels": "--levels", "seed": "--seed"}
MAELSTROM_FLAGS = {"date": "--date", "timestep": "--timestep", "patch": "--patch"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
    prep = actions.add_parser("prepare", help="write a dataset (synthetic or MAELSTROM)")
    prep.add_argument("preset", nargs="?",
                      help=f"one of {', '.join(presets.PRESETS)} (default "
                           f"{presets.DEFAULT_PRESET}); --levels, --seed, --shard-size change it")
    prep.add_argument("--columns", type=int, help="explicit number of synthetic columns")
    prep.add_argument("--levels", type=int, help=f"model levels (default {DEFAULT_LEVELS})")
    prep.add_argument("--seed", type=int, help=f"synthetic seed (default {DEFAULT_SEED})")
    prep.add_argument("--shard-size", type=int,
                      help=f"columns per shard (default: the preset's, else {DEFAULT_SHARD_SIZE})")
    prep.add_argument("--name", help="dataset name under $KOSMOSS_HOME/data (default: "
                                     "spelled out from the request; a preset's name holds "
                                     "that preset only)")
    prep.add_argument("--out", type=Path, help="write to this folder instead")
    prep.add_argument("--source", choices=("synthetic", "maelstrom"), default="synthetic")
    prep.add_argument("--date", help="maelstrom: forecast start date YYYYMMDD (default 20200101)")
    prep.add_argument("--timestep", type=int, help="maelstrom: timestep (default 0)")
    prep.add_argument("--patch", type=int, nargs="+", help="maelstrom: patches (default 0)")
    prep.add_argument("--force", action="store_true",
                      help="replace an existing kosmoss dataset (never any other folder)")
    prep.set_defaults(command=prepare_command)
    info = actions.add_parser("info", help="what datasets there are, or one in detail")
    info.add_argument("dataset", nargs="?", help="preset name or folder (default: list all)")
    info.add_argument("--verify", action="store_true", help="also check every checksum")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(command=info_command)


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help=HELP, description=HELP)
    add_arguments(parser)


# ---------------------------------------------------------------- what was asked


def _refuse(args: argparse.Namespace, flags: dict, why: str) -> None:
    for attribute, flag in flags.items():
        if getattr(args, attribute) is not None:
            raise UsageError(f"{flag}: {why}")


def _at_least(value, minimum: int, flag: str):
    if value is not None and value < minimum:
        raise UsageError(f"{flag} {value}: must be >= {minimum}")
    return value


def _request(args: argparse.Namespace):
    """(source, default name, shard size) of what the flags ask for."""
    _at_least(args.shard_size, 1, "--shard-size")
    if args.source == "maelstrom":
        return _maelstrom_request(args)
    _refuse(args, MAELSTROM_FLAGS, "only with --source maelstrom")
    _at_least(args.columns, 1, "--columns")
    _at_least(args.levels, 2, "--levels")
    _at_least(args.seed, 0, "--seed")  # numpy's generators take no negative seed
    if args.columns is not None:
        if args.preset is not None:
            raise UsageError(f"--columns and preset {args.preset!r}: give one of them")
        return _synthetic_request(args.columns, args.levels, args.seed, args.shard_size)
    return _preset_request(args)


def _synthetic_request(columns, levels, seed, shard_size):
    levels = DEFAULT_LEVELS if levels is None else levels
    seed = DEFAULT_SEED if seed is None else seed
    shard_size = shard_size or DEFAULT_SHARD_SIZE
    name = f"synthetic-{columns}col-{levels}lev-seed{seed}" + _shard_suffix(shard_size)
    return SyntheticSource(columns, seed=seed, levels=levels), name, shard_size


def _preset_request(args: argparse.Namespace):
    name = args.preset or presets.DEFAULT_PRESET
    if name not in presets.PRESETS:
        raise UsageError(f"unknown preset {name!r}: choose one of "
                         f"{', '.join(presets.PRESETS)} or give --columns N")
    preset = presets.PRESETS[name]
    given = {"lev": args.levels, "seed": args.seed, "shard": args.shard_size}
    defaults = {"lev": preset.levels, "seed": preset.seed, "shard": preset.shard_size}
    changed = {key: value for key, value in given.items() if value not in (None, defaults[key])}
    if not changed:
        return preset.source(), preset.name, preset.shard_size
    asked = {**defaults, **changed}
    source = SyntheticSource(preset.n_columns, seed=asked["seed"], levels=asked["lev"])
    suffix = "".join(f"-{key}{value}" for key, value in changed.items())
    return source, f"{preset.name}{suffix}", asked["shard"]


def _maelstrom_request(args: argparse.Namespace):
    from ..data.maelstrom import INSTALL_HINT, PLUGIN, MaelstromSource

    _refuse(args, SYNTHETIC_FLAGS, "synthetic data only; MAELSTROM columns come as they are")
    if args.preset is not None:
        raise UsageError(f"preset {args.preset!r}: synthetic data only; drop it with "
                         "--source maelstrom")
    date = args.date or "20200101"
    if not re.fullmatch(r"\d{8}", date):
        raise UsageError(f"--date {date}: give the forecast start date as YYYYMMDD")
    timestep = _at_least(args.timestep, 0, "--timestep") or 0
    patches = args.patch or [0]
    for patch in patches:
        _at_least(patch, 0, "--patch")
    shard_size = args.shard_size or DEFAULT_SHARD_SIZE
    if not (find_spec("climetlab") and find_spec(PLUGIN.replace("-", "_"))):
        # before anything is written: the data is only read once preparation has begun
        raise UsageError(f"--source maelstrom: maelstrom data needs climetlab and {PLUGIN}: "
                         f"{INSTALL_HINT}")
    source = MaelstromSource(date=date, timestep=timestep, patch=patches)
    name = (f"maelstrom-{date}-t{timestep}-p{'-'.join(map(str, patches))}"
            + _shard_suffix(shard_size))
    return source, name, shard_size


def _shard_suffix(shard_size: int) -> str:
    return "" if shard_size == DEFAULT_SHARD_SIZE else f"-shard{shard_size}"


def _destination(args: argparse.Namespace, default_name: str) -> Path:
    if args.out is not None:
        if args.name is not None:
            raise UsageError(f"--name {args.name} and --out {args.out}: give one of them")
        _not_a_presets_folder(Path(args.out), default_name, f"--out {args.out}")
        return args.out
    dest = paths.data_root() / presets.check_name(args.name or default_name)
    _not_a_presets_folder(dest, default_name, f"--name {args.name}")
    return dest


def _not_a_presets_folder(dest: Path, default_name: str, flag: str) -> None:
    """A preset's folder holds that preset only: anything else there, `--dataset tiny`
    refuses (or, were it the same shape, would train on unasked)."""
    root = paths.data_root().resolve()
    if dest.resolve().parent == root and dest.name in presets.PRESETS \
            and dest.name != default_name:
        raise UsageError(f"{flag}: the folder of the preset {dest.name}, which this request "
                         f"is not; give `kosmoss data prepare {dest.name}` for the preset, or "
                         "another name")


# ---------------------------------------------------------------- commands


def prepare_command(args: argparse.Namespace) -> None:
    source, default_name, shard_size = _request(args)
    dest = _destination(args, default_name)
    console = Console(stderr=True)
    # Off when stderr is not a terminal: its last refresh would add a blank line to errors.
    bar = Progress(console=console, transient=True, disable=not console.is_terminal)
    try:
        with bar as progress:
            task = progress.add_task(f"preparing {dest.name}", total=None)
            dataset = prepare(
                source, dest, shard_size, force=args.force,
                log=lambda line: progress.console.print(line, soft_wrap=True, markup=False,
                                                        highlight=False),
                on_shard=lambda done, total: progress.update(task, completed=done, total=total),
            )
    except ImportError as err:  # the optional [maelstrom] extra is missing
        raise UsageError(f"--source {args.source}: {err}") from None
    summary = (f"{dataset.n_samples} columns, x {dataset.n_x} / y {dataset.n_y} features, "
               f"{len(dataset.shards)} shards")
    if dataset.reused:
        print(f"{dataset.path}: reused, already prepared from this request ({summary}); "
              "--force prepares it again")
    else:
        print(f"{dataset.path}: {summary}")


def _describe(dataset) -> dict:
    meta = dataset.metadata
    size = sum(f.stat().st_size for f in dataset.path.iterdir() if f.is_file())
    return {"path": str(dataset.path), "name": meta["name"], "n_samples": dataset.n_samples,
            "n_x": dataset.n_x, "n_y": dataset.n_y, "levels": meta["schema"]["levels"],
            "shards": len(dataset.shards), "dtype": meta["dtype"], "bytes": size,
            "constant_x": int(dataset.statistics().x_constant().sum()),
            # Features holding a NaN or inf value: a run on the dataset is refused.
            "not_numbers_xy": list(dataset.statistics().not_numbers()),
            "source": meta["source"], "shard_size": meta.get("shard_size"),
            "created": meta["created"]}


def _all_datasets() -> list:
    root = paths.data_root()
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else []
    found = []
    for folder in folders:
        try:
            found.append(_describe(open_dataset(folder, verify=False)))
        except UsageError as err:
            found.append({"path": str(folder), "name": folder.name, "error": str(err)})
    return found


def _report_leftovers(spec) -> None:
    # A preparation killed outright leaves its working folder: say so, and free the space.
    if spec is None:
        lines = clean_leftovers(paths.data_root())
    else:
        folder = Path(spec).expanduser() if presets.looks_like_path(spec) \
            else paths.data_root() / spec
        lines = clean_leftovers(folder.parent, folder.name)
    for line in lines:
        print(f"kosmoss data: {line}", file=sys.stderr)


def info_command(args: argparse.Namespace) -> None:
    _report_leftovers(args.dataset)
    if args.dataset:
        items = [_describe(presets.resolve(args.dataset, prepare_missing=False,
                                           verify=args.verify, flag="dataset"))]
    else:
        items = _all_datasets()
    if args.json:
        print(json.dumps(items, indent=2))
        return
    table = Table(title=f"datasets in {paths.data_root()}" if not args.dataset else None)
    table.add_column("name", overflow="fold")  # default names spell out the request: long
    for column in ("columns", "levels", "x / y", "shards", "size", "source"):
        table.add_column(column)
    for item in items:
        if "error" in item:
            table.add_row(item["name"], "-", "-", "-", "-", "-", f"unusable: {item['error']}")
            continue
        table.add_row(item["name"], str(item["n_samples"]), str(item["levels"]),
                      f"{item['n_x']} / {item['n_y']}", str(item["shards"]),
                      f"{item['bytes'] / 1e6:,.0f} MB", item["source"].get("name", "?"))
    Console().print(table)


def main(argv=None) -> int:
    return command_main("kosmoss data", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
