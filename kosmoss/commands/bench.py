"""``kosmoss bench``: what does scaling buy here? Set-ups measured side by side.

    kosmoss bench --quick                      # a few minutes on a 2-core laptop
    kosmoss bench                              # the full matrix (GPU rows where there is one)
    kosmoss bench --only raw-cpu kosmoss-cpu --repeats 3 --out /tmp/bench
    kosmoss bench --list                       # the set-ups, and why one would be skipped

Writes bench.json, bench.csv and bench.png into --out (default: a new folder under
$KOSMOSS_HOME/runs/), each row's result JSON under rows/, its output under logs/ and its
run directory under runs/.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import List, Optional

from rich.console import Console
from rich.table import Table

from ..core import files
from ..core.commandline import command_main
from ..core.errors import Interrupted, RunFailed, UsageError

HELP = ("measure set-ups side by side: the raw PyTorch loop (the limit), 1 process, DDP, "
        "simulated nodes, the loaders, and GPU, bf16 and Horovod where present")


@dataclass(frozen=True)
class Mode:
    """Defaults of --quick and of the full matrix (each flag may override them)."""

    dataset: Optional[str]  # None: small, or large where there is a GPU
    batch_size: int
    gpu_batch_size: int
    steps: int
    repeats: int
    timeout_s: float


QUICK = Mode("tiny", 256, 512, 30, 2, 300.0)
FULL = Mode(None, 1024, 16384, 200, 5, 1800.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--quick", action="store_true",
        help=f"dataset {QUICK.dataset}, {QUICK.steps} steps, {QUICK.repeats} repeats: about 6 "
             "minutes on 2 CPU cores for every CPU row, predictions included (less with "
             "--only); default: the full matrix, for GPU machines")
    add("--out", type=Path, default=None, metavar="DIR",
        help="write bench.json/.csv/.png here: a new or empty folder, or an earlier bench's "
             "(default: a new folder under $KOSMOSS_HOME/runs)")
    add("--json", action="store_true", help="print bench.json to stdout instead of the table")
    add("--list", action="store_true",
        help="list the set-ups and why any would be skipped; run none")
    add("--only", nargs="+", metavar="ID", default=None, help="run only these set-ups (see --list)")
    add("--dataset", default=None, metavar="NAME|PATH",
        help="preset (tiny, small, large; prepared on first use), dataset name or folder "
             f"(default: {QUICK.dataset} with --quick; else small, or large with a GPU)")
    add("--steps", type=int, default=None, metavar="N",
        help=f"timed steps per run, after one warm-up step (default {QUICK.steps} with --quick, "
             f"else {FULL.steps})")
    add("--repeats", type=int, default=None, metavar="N",
        help=f"runs per set-up; medians are reported (default {QUICK.repeats} with --quick, "
             f"else {FULL.repeats})")
    add("--batch-size", type=int, default=None, metavar="N",
        help=f"global batch of the CPU rows and loaders (default {QUICK.batch_size} with --quick, "
             f"else {FULL.batch_size})")
    add("--gpu-batch-size", type=int, default=None, metavar="N",
        help=f"global batch of the GPU rows (default {QUICK.gpu_batch_size} with --quick, else "
             f"{FULL.gpu_batch_size})")
    parser.set_defaults(command=bench_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("bench", help=HELP, description=HELP))


def bench_command(args: argparse.Namespace) -> None:
    from ..bench import setups as matrix

    chosen = selected(args.only)
    _check_counts(args)
    if args.list:
        show_list(chosen, matrix.probe(chosen))
        return
    out_dir = output_folder(args.out)
    _run(args, chosen, out_dir)


def _run(args, chosen, out_dir: Path) -> None:
    from ..bench.runner import ThreadProbes, assemble, predict_rows, run_matrix
    from ..devices import environment

    progress = Console(stderr=True, highlight=False)

    def echo(message: str) -> None:
        progress.print(message, markup=False)

    plan, machine = make_plan(args, chosen, echo)
    out_dir.mkdir(parents=True, exist_ok=True)
    echo(f"kosmoss bench: {len(chosen)} set-up(s), dataset {plan.dataset}, {plan.repeats} "
         f"repeat(s) of {plan.steps} timed steps; output in {out_dir}")
    probes = ThreadProbes(chosen, plan)
    rows, prediction, stopped = None, None, None
    try:
        rows = run_matrix(chosen, plan, machine, out_dir, echo, between_rounds=probes.measure)
        prediction = predict_rows(chosen, rows, plan, out_dir, echo, probes.found)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: what was measured is written all the same
        stopped = stop if isinstance(stop, Interrupted) else Interrupted()
        rows = getattr(stop, "rows", rows)  # run_matrix's BenchStopped holds the rows so far
    bench = assemble(chosen, rows, plan, out_dir, environment.describe(), args.quick, prediction,
                     stopped_by=str(stopped) if stopped else None)
    written = _print_and_write(args, bench, out_dir, echo)
    if stopped is not None:
        stopped.kept = f"the repeats measured before it are in {written[0]}"
        raise stopped
    failed = [row["id"] for row in bench["rows"] if row["status"] == "failed"]
    if failed:
        raise RunFailed(f"set-up(s) {', '.join(failed)} failed (reasons in {written[0]}, "
                        f"output in {out_dir / 'logs'}); the other rows were measured")


def _print_and_write(args, bench: dict, out_dir: Path, echo) -> list:
    from ..bench import report

    if args.json:
        print(files.json_text(bench), end="")
    else:
        _console().print(report.table(bench))
    with files.writing_into(out_dir):
        written = report.write_all(bench, out_dir)
    echo("wrote " + ", ".join(str(path) for path in written))
    return written


def make_plan(args: argparse.Namespace, chosen, echo):
    """The dataset (a preset is prepared on first use), the counts, and this machine;
    a batch that cannot run is a UsageError here, before anything is written."""
    import torch

    from ..bench.setups import Plan, probe
    from ..data import presets
    from ..data.splits import split_sizes

    mode = QUICK if args.quick else FULL
    spec = args.dataset or mode.dataset or ("large" if torch.cuda.is_available() else "small")
    machine = probe(chosen)
    batches = {"cpu": _pick(args.batch_size, mode.batch_size),
               "gpu": _pick(args.gpu_batch_size, mode.gpu_batch_size)}
    check_batches_split(batches, chosen, gpu_rows_run=machine.cuda)  # before a preset's prepared
    prepared = presets.resolve(spec, log=echo, verify=False)
    plan = Plan(
        dataset=prepared.path.resolve(), n_samples=prepared.n_samples,
        n_train=split_sizes(prepared.n_samples)[0],
        bytes_per_sample=4 * (prepared.n_x + prepared.n_y),
        batch_size=batches["cpu"], gpu_batch_size=batches["gpu"],
        steps=_pick(args.steps, mode.steps), repeats=_pick(args.repeats, mode.repeats),
        timeout_s=mode.timeout_s,
    )
    check_batches(plan, chosen, gpu_rows_run=machine.cuda, dataset=spec)
    return plan, machine


def _pick(value: Optional[int], default: int) -> int:
    return default if value is None else value


def selected(only: Optional[List[str]]):
    """The set-ups named by --only (in the matrix's order), or all of them."""
    from ..bench.setups import BY_ID, MATRIX

    if only is None:
        return list(MATRIX)
    unknown = [name for name in only if name not in BY_ID]
    if unknown:
        raise UsageError(f"--only {' '.join(unknown)}: no such set-up; choose from "
                         f"{', '.join(BY_ID)} (see --list)")
    return [setup for setup in MATRIX if setup.id in only]


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats),
                        ("--batch-size", args.batch_size),
                        ("--gpu-batch-size", args.gpu_batch_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be >= 1")


BATCH_FLAGS = {"cpu": "--batch-size", "gpu": "--gpu-batch-size"}


def _rows_on(device: str, chosen, gpu_rows_run: bool):
    return [s for s in chosen if s.device == device and (device == "cpu" or gpu_rows_run)]


def check_batches_split(batches: dict, chosen, *, gpu_rows_run: bool) -> None:
    """Each global batch must split evenly over its rows' ranks."""
    for device, batch in batches.items():
        for setup in _rows_on(device, chosen, gpu_rows_run):
            if batch % setup.ranks:
                raise UsageError(f"{BATCH_FLAGS[device]} {batch}: must divide by {setup.ranks}, "
                                 f"the ranks of {setup.id}")


def check_batches(plan, chosen, *, gpu_rows_run: bool, dataset: str) -> None:
    """Each global batch must split evenly over its rows' ranks and fit the training split."""
    batches = {"cpu": plan.batch_size, "gpu": plan.gpu_batch_size}
    check_batches_split(batches, chosen, gpu_rows_run=gpu_rows_run)
    for device, batch in batches.items():
        flag, rows = BATCH_FLAGS[device], _rows_on(device, chosen, gpu_rows_run)
        if rows and batch > plan.n_train:
            raise UsageError(f"{flag} {batch} is larger than the {plan.n_train:,} training "
                             f"samples of dataset {dataset}: use a smaller batch or a larger "
                             "--dataset")


def output_folder(out: Optional[Path]) -> Path:
    """Where to write; checked before anything runs. Nothing of the user's is overwritten:
    an existing folder must be empty or an earlier bench's."""
    from ..core import paths

    if out is None:
        default = paths.runs_root() / f"bench-{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
        files.check_writable(default, "KOSMOSS_HOME", "set KOSMOSS_HOME or give --out DIR")
        return default
    return files.output_folder(out, "bench.json", "bench's")


def show_list(chosen, machine) -> None:
    from ..bench.setups import skip_reason

    table = Table(title="kosmoss bench set-ups")
    for name in ("id", "set-up", "here"):
        table.add_column(name)
    for setup in chosen:
        reason = skip_reason(setup, machine, None)
        table.add_row(setup.id, setup.label, f"skipped: {reason}" if reason else "runs")
    _console().print(table)


def _console() -> Console:
    # Piped (a notebook, a log file), rich would squeeze 12 columns into 80 characters.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def main(argv=None) -> int:
    return command_main("kosmoss bench", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
