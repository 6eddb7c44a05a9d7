"""``kosmoss data prepare`` and ``kosmoss data info``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .. import paths
from ..cli_support import OneLineParser, command_main
from ..data import presets
from ..data.sources import SyntheticSource
from ..data.store import open_dataset, prepare
from ..errors import UsageError

HELP = "prepare and inspect datasets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
    prep = actions.add_parser("prepare", help="write a dataset (synthetic or MAELSTROM)")
    prep.add_argument("preset", nargs="?", default=presets.DEFAULT_PRESET,
                      help=f"one of {', '.join(presets.PRESETS)} (default %(default)s); "
                           "ignored with --columns or --source maelstrom")
    prep.add_argument("--columns", type=int, help="explicit number of synthetic columns")
    prep.add_argument("--levels", type=int, default=137, help="model levels (default 137)")
    prep.add_argument("--seed", type=int, default=42)
    prep.add_argument("--shard-size", type=int, default=4096, help="columns per shard")
    prep.add_argument("--name", help="dataset name under $KOSMOSS_HOME/data")
    prep.add_argument("--out", type=Path, help="write to this folder instead")
    prep.add_argument("--source", choices=("synthetic", "maelstrom"), default="synthetic")
    prep.add_argument("--date", default="20200101", help="maelstrom: forecast start date")
    prep.add_argument("--timestep", type=int, default=0, help="maelstrom: timestep")
    prep.add_argument("--patch", type=int, nargs="+", default=[0], help="maelstrom: patches")
    prep.add_argument("--force", action="store_true", help="replace an existing dataset")
    prep.set_defaults(command=prepare_command)
    info = actions.add_parser("info", help="what datasets there are, or one in detail")
    info.add_argument("dataset", nargs="?", help="preset name or folder (default: list all)")
    info.add_argument("--verify", action="store_true", help="also check every checksum")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(command=info_command)


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help=HELP, description=HELP)
    add_arguments(parser)


def _source_and_dest(args: argparse.Namespace):
    if args.source == "maelstrom":
        from ..data.maelstrom import MaelstromSource

        source = MaelstromSource(date=args.date, timestep=args.timestep, patch=args.patch)
        name = args.name or f"maelstrom-{args.date}-{args.timestep}"
        return source, name, args.shard_size
    if args.columns is not None:
        if args.columns < 1:
            raise UsageError(f"--columns {args.columns}: must be >= 1")
        if args.levels < 2:
            raise UsageError(f"--levels {args.levels}: must be >= 2")
        if args.shard_size < 1:
            raise UsageError(f"--shard-size {args.shard_size}: must be >= 1")
        source = SyntheticSource(args.columns, seed=args.seed, levels=args.levels)
        return source, args.name or f"synthetic-{args.columns}", args.shard_size
    if args.preset not in presets.PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}: choose one of "
                         f"{', '.join(presets.PRESETS)} or give --columns N")
    preset = presets.PRESETS[args.preset]
    return preset.source(), args.name or preset.name, preset.shard_size


def prepare_command(args: argparse.Namespace) -> None:
    source, name, shard_size = _source_and_dest(args)
    dest = args.out or paths.data_root() / name
    console = Console(stderr=True)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"preparing {name}", total=source.n_columns)
            dataset = prepare(
                source, Path(dest), shard_size, force=args.force,
                on_shard=lambda done, total: progress.update(task, completed=done),
            )
    except ImportError as err:  # the optional [maelstrom] extra is missing
        raise UsageError(f"--source {args.source}: {err}") from None
    print(f"{dataset.path}: {dataset.n_samples} columns, x {dataset.n_x} / y {dataset.n_y} "
          f"features, {len(dataset.shards)} shards")


def _describe(dataset) -> dict:
    meta = dataset.metadata
    size = sum(f.stat().st_size for f in dataset.path.iterdir() if f.is_file())
    return {"path": str(dataset.path), "name": meta["name"], "n_samples": dataset.n_samples,
            "n_x": dataset.n_x, "n_y": dataset.n_y, "levels": meta["schema"]["levels"],
            "shards": len(dataset.shards), "dtype": meta["dtype"], "bytes": size,
            "source": meta["source"], "created": meta["created"]}


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


def info_command(args: argparse.Namespace) -> None:
    if args.dataset:
        items = [_describe(presets.resolve(args.dataset, prepare_missing=False,
                                           verify=args.verify, flag="dataset"))]
    else:
        items = _all_datasets()
    if args.json:
        print(json.dumps(items, indent=2))
        return
    table = Table(title=f"datasets in {paths.data_root()}" if not args.dataset else None)
    for column in ("name", "columns", "levels", "x / y", "shards", "size", "source"):
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
