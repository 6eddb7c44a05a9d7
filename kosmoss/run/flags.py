"""The flags of trainup_cpu.py (and, with what a GPU adds, trainup_gpu.py), and the one
place where a configuration field is named as a flag (errors speak the caller's words)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet

from ..core import paths
from ..core.errors import ConfigError
from ..data import MODES, presets
from ..data.presets import DEFAULT_PRESET
from ..data.splits import split_sizes
from ..devices.policy import MachineGpu
from ..scaling.arithmetic import LR_RULES
from .config import HOSTS, PRECISIONS, STRATEGIES, RunConfig, check_batch_fits, validate

DEFAULTS = RunConfig()
# Every field whose flag is not simply --field-with-dashes.
FLAG_NAMES = {"scale_lr": "--scale-lr", "collective_timeout_s": "--collective-timeout",
              "progress": "--no-progress"}


def flag_names(process_flag: str = "--num-processes") -> Dict[str, str]:
    """Field -> flag for a launcher (trainup_gpu.py calls the processes per node --gpus)."""
    names = {field: "--" + field.replace("_", "-") for field in RunConfig.__dataclass_fields__}
    return {**names, **FLAG_NAMES, "num_processes": process_flag}


@dataclass(frozen=True)
class Default:
    """A flag's default, told apart from the same value typed: a resume keeps the stopped
    run's value for every flag not typed (kosmoss.run.resume)."""
    value: Any

    def __str__(self) -> str:  # what --help shows for %(default)s
        return str(self.value)


def unwrap(value: Any) -> Any:
    return value.value if isinstance(value, Default) else value


def given_fields(args: argparse.Namespace) -> FrozenSet[str]:
    """The fields whose flags were typed (a None default cannot be typed)."""
    return frozenset(name for name, value in vars(args).items()
                     if value is not None and not isinstance(value, Default))


def in_flag_terms(error: Exception, process_flag: str = "--num-processes") -> str:
    """An error's one line as the launcher's user reads it."""
    if isinstance(error, ConfigError):
        return error.in_terms_of(flag_names(process_flag))
    return str(error)


def add_run_flags(parser: argparse.ArgumentParser, *, processes: bool = True) -> None:
    """Every flag that is not GPU-specific: trainup_cpu.py runs every CPU set-up with these."""
    add = parser.add_argument
    add("--batch-size", type=int, default=Default(DEFAULTS.batch_size),
        help="global batch, split evenly over all processes (default %(default)s)")
    if processes:
        add("--num-processes", type=int, default=None,
            help="processes (ranks) per node; >1 runs DDP (default 1, or what torchrun says)")
    add("--num-nodes", type=int, default=None,
        help="nodes; without a cluster launcher they are simulated on this host")
    add("--hosts", choices=HOSTS, default=Default(DEFAULTS.hosts),
        help="simulated nodes: loopback (processes sharing 127.0.0.1) or netns (each node a "
             "host in its own network namespace, as root; docs/hosts.md) (default %(default)s)")
    add("--link-rate", default=None, metavar="RATE",
        help="with --hosts netns: every host's link, e.g. 100mbit, 1gbit, 10gbit, none "
             "(default none: unshaped)")
    add("--strategy", choices=STRATEGIES, default=Default(DEFAULTS.strategy),
        help="distributed engine: ddp (gloo on CPU, NCCL for one rank per GPU) or horovod "
             "(under horovodrun; see docs/horovod.md)")
    add("--precision", choices=PRECISIONS, default=Default(DEFAULTS.precision),
        help="bf16-mixed: bfloat16 autocast (the tensor cores' format; runs on CPU too)")
    add("--lr", type=float, default=Default(DEFAULTS.lr),
        help="learning rate tuned for --base-batch-size (default %(default)s)")
    add("--scale-lr", choices=LR_RULES, default=Default(DEFAULTS.scale_lr),
        help="scale --lr with k = global batch / base batch (default %(default)s)")
    add("--base-batch-size", type=int, default=None,
        help="batch --lr was tuned for (default: the per-device batch)")
    add("--warmup-steps", type=int, default=Default(DEFAULTS.warmup_steps),
        help="ramp the rate linearly from --lr to the scaled rate over N steps (default 0)")
    add("--max-epochs", type=int, default=Default(DEFAULTS.max_epochs),
        help="(default %(default)s)")
    add("--val-every-n-epochs", type=int, default=Default(DEFAULTS.val_every_n_epochs),
        metavar="N", help="validate after every Nth epoch, and the final weights always; "
                          "checkpoints come with validations, so a killed run resumes from "
                          "the last one. Where an epoch is a step or a few, validating each "
                          "leaves the GPU idle between steps (default %(default)s)")
    add("--max-steps", type=int, default=Default(DEFAULTS.max_steps),
        help="stop after this many optimizer steps; -1: no limit (default %(default)s)")
    add("--dataset", default=Default(DEFAULT_PRESET),
        help="preset name (tiny, small, large; prepared on first use) or dataset folder "
             "(default %(default)s)")
    add("--seed", type=int, default=Default(DEFAULTS.seed), help="(default %(default)s)")
    add("--result-json", type=Path, default=None,
        help="also write result.json here (it is always in the run directory)")
    add("--hidden", type=int, nargs="+", default=Default(list(DEFAULTS.hidden)),
        help="hidden layer sizes (default: 100 100 100)")
    add("--mode", choices=MODES, default=Default(DEFAULTS.mode),
        help="auto: controlled when every process on this host can hold a copy in half the "
             "free RAM, else efficient; efficient: memory-mapped shards (one page cache for "
             "every rank); controlled: shards copied into one tensor in RAM (one gather a "
             "batch); device: copied to the GPU, which then gathers its own batches "
             "(default %(default)s)")
    add("--num-workers", type=int, default=None,
        help="data workers per process (default: sized from the cores per process)")
    add("--steps-per-execution", type=int, default=None, metavar="K",
        help="optimizer steps per step of Lightning's loop; 1: one a batch (default: 8 for one "
             "process of the ddp engine reading its batches in-process, no data workers; "
             "else 1)")
    add("--compile", action=argparse.BooleanOptionalAction, default=Default(False),
        help="torch.compile the network (inductor); the compile time is untimed; a resume "
             "keeps the run's own (--no-compile drops it)")
    add("--collective-timeout", dest="collective_timeout_s", type=float, default=None,
        metavar="SECONDS", help="fail a collective that waits longer (default 120 on CPU, "
                                "600 on GPU)")
    add("--no-progress", dest="progress", action="store_false", default=Default(True),
        help="no progress bar")
    add("--resume", metavar="RUN", default=None,
        help="continue a stopped run with its own settings: its run id, its folder, or one of "
             "its checkpoints (under Slurm a requeued job resumes by itself)")


def add_gpu_flags(parser: argparse.ArgumentParser) -> None:
    """What trainup_gpu.py adds to the flags of trainup_cpu.py."""
    add = parser.add_argument
    add("--gpus", "--num-processes", dest="num_processes", type=int, default=None,
        help="processes per node, one per GPU (default 1, or what the launcher says)")
    add("--gpu-ids", type=_id_list, default=None,
        help="CUDA ids for the local ranks, e.g. 2,3: local rank r uses ids[r]")
    add("--require-gpu", action="store_true",
        help="fail (exit 2) instead of falling back to CPU when there is no GPU")
    add("--cuda-graphs", action=argparse.BooleanOptionalAction, default=Default(False),
        help="replay each chunk's K steps (batch gather, forward, backward, Adam) from one CUDA "
             "graph: one GPU process, the data on the GPU (docs/gpu.md); a resume keeps the "
             "run's own (--no-cuda-graphs drops it)")


def _id_list(text: str):
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers, e.g. 0,1") from None


def config_from_args(parsed: argparse.Namespace, *, machine: MachineGpu,
                     use_gpu: bool) -> RunConfig:
    """The run's request from the flags; the machine's say (offer / force / pick a GPU)
    from the entry point's default and the environment (MachineGpu.from_environment)."""
    args = argparse.Namespace(**{name: unwrap(value) for name, value in vars(parsed).items()})
    given = given_fields(parsed) & set(RunConfig.__dataclass_fields__)
    gpu_ids = getattr(args, "gpu_ids", None)
    processes = args.num_processes if args.num_processes is not None or not gpu_ids \
        else len(gpu_ids)
    return RunConfig(
        batch_size=args.batch_size, num_processes=processes, num_nodes=args.num_nodes,
        lr=args.lr, scale_lr=args.scale_lr, base_batch_size=args.base_batch_size,
        warmup_steps=args.warmup_steps, max_epochs=args.max_epochs, max_steps=args.max_steps,
        val_every_n_epochs=args.val_every_n_epochs,
        dataset=args.dataset, seed=args.seed, result_json=args.result_json,
        hidden=tuple(args.hidden), mode=args.mode, num_workers=args.num_workers,
        progress=args.progress, resume=args.resume, precision=args.precision,
        strategy=args.strategy, collective_timeout_s=args.collective_timeout_s,
        steps_per_execution=args.steps_per_execution, compile=args.compile,
        cuda_graphs=getattr(args, "cuda_graphs", False), hosts=args.hosts,
        link_rate=args.link_rate, gpu_ids=gpu_ids, require_gpu=getattr(args, "require_gpu", False),
        machine_gpu=machine.setting, gpu_index=machine.index, use_gpu=use_gpu,
        given=given | ({"num_processes"} if "gpu_ids" in given else frozenset()),
    )


def checked_config(args: argparse.Namespace, *, machine: MachineGpu, use_gpu: bool) -> RunConfig:
    """:func:`config_from_args`, validated here: a bad value is a one-line error before
    torch and Lightning are imported (seconds)."""
    config = config_from_args(args, machine=machine, use_gpu=use_gpu)
    validate(config)
    check_dataset_named(config)
    return config


def check_dataset_named(config: RunConfig) -> None:
    """--dataset names a preset, a dataset under $KOSMOSS_HOME/data or a complete dataset
    folder, and --batch-size fits in its training rows: a typo is one line in a fraction of a
    second, not after Lightning's import (five seconds here, on every rank). The run checks
    it again, whole (sizes, checksums)."""
    if config.resume:  # the stopped run's dataset: its resume checks it
        return
    name = config.dataset
    if name in presets.PRESETS and not (paths.data_root() / name).exists():
        return  # a preset not prepared yet: the run prepares it
    found = presets.resolve(name, prepare_missing=False, verify=False)
    check_batch_fits(name, split_sizes(found.n_samples)[0], config.batch_size)
