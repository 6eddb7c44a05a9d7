"""Where N-rank DDP loses against one process on the same cores (or the same GPU), one
change at a time.

    python -m kosmoss.bench.ddp_anatomy --dataset DIR --batch-size 1024 --steps 200
    python -m kosmoss.bench.ddp_anatomy --device cuda --dataset DIR --batch-size 16384

With ``--device cuda`` every rank works on GPU 0, as kosmoss's simulated nodes sharing one
GPU do (gloo, CUDA tensors): lines 1-4 split the same way the shared-GPU bench row's step
(``nodes-gpu-2x1``) does, what the ranks cost each other on the GPU included.

Every variant is the bench's raw loop (:func:`kosmoss.bench.baselines.raw_loop`: data in
RAM, in-place normalisation, the MLP, MSE, Adam) at the same global batch, so that the
gaps between consecutive lines are the cost of one thing each:

1. ``1 process``: all the cores as torch threads (the ``raw-cpu`` row);
2. ``N ranks, no communication``: each rank its share of the batch on its share of the
   cores, nothing exchanged: what splitting the batch and the cores costs by itself;
3. ``+ one flat all-reduce``: the gradients summed in one gloo collective after backward;
4. ``+ DDP``: torch's DistributedDataParallel as kosmoss runs it (torch's buckets, 25 MiB
   and a first one of 1 MiB, rebuilt after the first step; ``gradient_as_bucket_view``):
   its hooks, its buckets (the table shows their sizes after the rebuild) and the overlap
   of their all-reduce with backward on gloo's thread;
5. variants of 4: ``static_graph``; 1 GiB buckets; two threads per rank (more threads
   than cores);
6. the kosmoss rows (Lightning's loop, the loader) are the bench's ``kosmoss-cpu`` and
   ``ddp-cpu-2``: run ``kosmoss bench`` beside this for them.

The variants are interleaved over ``--repeats`` rounds and the table gives each one's
median samples/s and its ratio to the 1-process line of the same round.
"""
from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from ..core.commandline import OneLineParser
from ..devices.cpus import available_cores
from ..run.lightning_private import ddp_logging_data


@dataclass(frozen=True)
class Variant:
    name: str
    ranks: int
    comm: str  # none | flat | ddp
    ddp_options: tuple = ()  # (key, value) pairs for DistributedDataParallel
    threads_per_rank: Optional[int] = None  # default: the cores split over the ranks


def variants(ranks: int, device: str = "cpu") -> List[Variant]:
    view = (("gradient_as_bucket_view", True),)  # as kosmoss.engines.ddp runs DDP
    gpu = device == "cuda"
    chosen = [
        Variant("1 process, the GPU" if gpu else "1 process, every core", 1, "none"),
        Variant(f"{ranks} ranks{' sharing the GPU' if gpu else ''}, no communication", ranks,
                "none"),
        Variant("+ one flat all-reduce after backward", ranks, "flat"),
        Variant("+ DDP as kosmoss runs it", ranks, "ddp", view),
        Variant("DDP, static_graph", ranks, "ddp", view + (("static_graph", True),)),
        Variant("DDP, 1 GiB buckets", ranks, "ddp", view + (("bucket_cap_mb", 1024),)),
    ]
    # Threads per rank matter to CPU arithmetic only.
    return chosen if gpu else chosen + [Variant("DDP, 2 threads per rank", ranks, "ddp", view,
                                                threads_per_rank=2)]


def _rank(rank: int, variant: Variant, port: int, dataset: str, batch_size: int, steps: int,
          out: str, device_name: str = "cpu") -> None:
    import torch.distributed as dist

    from ..core.defaults import DEFAULT_HIDDEN, DEFAULT_LR
    from ..data.loading import FlattenedDataset, RankBatchSampler, split_indices
    from ..data.splits import SPLITS
    from ..data.store import open_dataset
    from ..launch.spawn import leave_rank, write_result
    from ..model import LitMLP
    from ..run.allocator import pin_malloc_thresholds
    from ..run.throughput import StepClock

    pin_malloc_thresholds()
    torch.set_num_threads(variant.threads_per_rank or max(1, available_cores() // variant.ranks))
    if variant.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=variant.ranks)
    prepared = open_dataset(Path(dataset), verify=False)
    train_idx = split_indices(prepared.n_samples, SPLITS, 42)[0]
    device = torch.device(device_name)  # cuda: GPU 0 for every rank, as simulated nodes share it
    x, y = (t.to(device) for t in FlattenedDataset(prepared, mode="efficient").read(train_idx))
    torch.manual_seed(42)
    model = LitMLP(prepared.n_x, DEFAULT_HIDDEN, prepared.n_y,
                   stats=prepared.statistics()).to(device)
    net = model.net
    if variant.comm == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(net, **dict(variant.ddp_options))
    optimizer = torch.optim.Adam(net.parameters(), lr=DEFAULT_LR)
    sampler = RankBatchSampler(np.arange(len(train_idx)), batch_size, seed=42)
    clock, step, epoch = StepClock(), 0, 0
    warmup = 5  # DDP rebuilds its buckets after the first step: time the steady state
    while step < steps + warmup:
        sampler.set_epoch(epoch)
        epoch += 1
        for batch in sampler:
            mine = torch.from_numpy(np.asarray(batch)[rank::variant.ranks]).to(device)
            xb, yb = torch.index_select(x, 0, mine), torch.index_select(y, 0, mine)
            loss = torch.nn.functional.mse_loss(net(xb.sub_(model.x_mean).div_(model.x_std)),
                                                model.normalize_y(yb))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if variant.comm == "flat":
                _flat_all_reduce([p.grad for p in net.parameters()], variant.ranks)
            optimizer.step()
            step += 1
            if step <= warmup:
                clock = StepClock()  # restarted: the steps before are the warm-up
            clock.step_done(len(batch), device)
            if step == steps + warmup:
                break
    clock.pause(device)  # on a GPU: the steps still queued behind Python
    if rank == 0:  # rank 0's clock is the figure: whole once its last step is done
        buckets = ddp_logging_data(net).get("rebuilt_bucket_sizes") \
            if variant.comm == "ddp" else None
        write_result(out, {"samples_per_s": clock.samples_per_s, "buckets": buckets})
    if variant.ranks > 1:
        # DDP goes before its process group. torch's Reducer holds the group; as its last
        # owner it destroys the group holding the GIL while gloo's thread waits for the GIL
        # to free its last work: a deadlock, seen here once in a few dozen runs.
        del net
        gc.collect()
        dist.destroy_process_group()
    leave_rank()


def _flat_all_reduce(grads: List[torch.Tensor], ranks: int) -> None:
    import torch.distributed as dist
    from ..run.lightning_private import flatten, unflatten

    flat = flatten(grads)
    dist.all_reduce(flat)
    flat /= ranks
    for grad, summed in zip(grads, unflatten(flat, grads)):
        grad.copy_(summed)


def measure(variant: Variant, dataset: Path, batch_size: int, steps: int,
            device: str = "cpu") -> dict:
    """Samples/s of the whole world (rank 0's clock: DDP keeps the ranks in step), and
    DDP's bucket sizes in bytes after its rebuild."""
    from ..launch.ports import free_port
    from ..launch.spawn import spawn_for_result

    with tempfile.TemporaryDirectory(prefix="kosmoss-anatomy-") as scratch:
        out = str(Path(scratch) / "rank0.json")
        return spawn_for_result(_rank, (variant, free_port(), str(dataset), batch_size, steps,
                                        out, device), variant.ranks, out)


def run(dataset: Path, batch_size: int, steps: int, repeats: int, ranks: int,
        echo=print, device: str = "cpu", first: Optional[int] = None) -> List[dict]:
    chosen = variants(ranks, device)[:first]
    seen: Dict[str, List[float]] = {v.name: [] for v in chosen}
    buckets: Dict[str, Optional[str]] = {}
    for repeat in range(repeats):  # interleaved: a drift in the load hits every line alike
        for variant in chosen:
            measured = measure(variant, dataset, batch_size, steps, device)
            seen[variant.name].append(measured["samples_per_s"])
            buckets[variant.name] = measured["buckets"]
            echo(f"repeat {repeat + 1}/{repeats} {variant.name}: "
                 f"{seen[variant.name][-1]:,.0f} samples/s")
    single = seen[chosen[0].name]
    rows = []
    for variant in chosen:
        ratios = [mine / theirs for mine, theirs in zip(seen[variant.name], single)]
        rows.append({"variant": variant.name, "ranks": variant.ranks,
                     "samples_per_s": statistics.median(seen[variant.name]),
                     "ratio_to_1_process": statistics.median(ratios),
                     "ratio_range": [min(ratios), max(ratios)], "repeats": seen[variant.name],
                     "bucket_bytes": buckets[variant.name]})
    return rows


def render(rows: List[dict]) -> str:
    lines = [f"{'variant':<40} {'ranks':>5} {'samples/s':>10} {'x 1 process':>12} {'range':>10}"
             "  DDP buckets (bytes)"]
    for row in rows:
        low, high = row["ratio_range"]
        lines.append(f"{row['variant']:<40} {row['ranks']:>5} {row['samples_per_s']:>10,.0f} "
                     f"{row['ratio_to_1_process']:>12.2f} {f'{low:.2f}-{high:.2f}':>10}  "
                     f"{row['bucket_bytes'] or ''}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = OneLineParser(prog="python -m kosmoss.bench.ddp_anatomy",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a prepared dataset folder")
    parser.add_argument("--batch-size", type=int, default=1024, help="the global batch")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--variants", type=int, default=None,
                        help="the first N variants only (3: up to the flat all-reduce)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: every rank on GPU 0, as simulated nodes sharing it")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    for flag, value, least in (("--batch-size", args.batch_size, 1), ("--steps", args.steps, 1),
                               ("--repeats", args.repeats, 1), ("--ranks", args.ranks, 2),
                               ("--variants", 1 if args.variants is None else args.variants, 1)):
        if value < least:
            parser.error(f"{flag} {value}: must be at least {least}")
    if args.batch_size % args.ranks:
        parser.error(f"--batch-size {args.batch_size}: must divide by --ranks {args.ranks}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    if not (args.dataset / "metadata.json").is_file():
        parser.error(f"--dataset {args.dataset}: not a prepared dataset (no metadata.json); "
                     "prepare one with `kosmoss data prepare`")
    rows = run(args.dataset, args.batch_size, args.steps, args.repeats, args.ranks,
               device=args.device, first=args.variants)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
