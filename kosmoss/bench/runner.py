"""The whole bench: every selected set-up, repeats interleaved, then the figures, then
the predicted figures of the multi-rank rows.

Interleaving (repeat 1 of every row, then repeat 2, ...) makes a drift in the machine's
load hit every row alike instead of one row's whole series.

Prediction (:func:`predict_rows`): for each measured multi-rank DDP row, a short
``kosmoss comm`` run of the row's topology (its ranks and simulated nodes, gloo, the
row's device, sizes around the model's gradient buckets) and the 1-rank row measured in
this bench feed :func:`kosmoss.scaling.projection.predict`.
"""
from __future__ import annotations

import json
import shlex
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..core.errors import Interrupted
from . import figures
from .measure import measure_once, row_environment, run_logged
from .setups import Machine, Plan, Setup, last_line, skip_reason

TARGET_DEFINITION = (
    f"val_loss <= {figures.TARGET_MARGIN} x the final val_loss of the device's 1-process "
    "kosmoss row (kosmoss-cpu, kosmoss-gpu; median over repeats); time from launching a "
    "row's command to the end of the first validation below it (validation after every epoch)"
)


def run_matrix(setups: Sequence[Setup], plan: Plan, machine: Machine, out_dir: Path,
               echo: Callable[[str], None],
               between_rounds: Optional[Callable[[], None]] = None) -> Dict[str, dict]:
    """Measure every set-up that can run here ``plan.repeats`` times; rows by id.
    ``between_rounds`` runs after each round of repeats (the prediction's probes)."""
    skipped = {s.id: skip_reason(s, machine, plan) for s in setups}
    runnable = [s for s in setups if not skipped[s.id]]
    measurements: Dict[str, List[dict]] = {s.id: [] for s in runnable}
    for setup in setups:
        if skipped[setup.id]:
            echo(f"skip {setup.id}: {skipped[setup.id]}")
    stopped = None
    try:
        for repeat in range(plan.repeats):
            for setup in runnable:
                done = measurements[setup.id]
                if any(m.get("error") for m in done):
                    continue  # it failed once: its figures would not mean much
                measurement = measure_once(setup, plan, out_dir, repeat)
                done.append(measurement)
                echo(f"repeat {repeat + 1}/{plan.repeats} {setup.id}: {_progress(measurement)}")
            if between_rounds is not None:
                between_rounds()
    except KeyboardInterrupt as stop:  # the repeats measured so far are the user's: keep them
        stopped = stop if isinstance(stop, Interrupted) else Interrupted()
        for setup in runnable:
            if not measurements[setup.id]:
                skipped[setup.id] = f"not measured: the bench was stopped by {stopped}"
    rows = {s.id: figures.build_row(s, plan.batch_for(s), measurements.get(s.id, []),
                                    skipped=skipped[s.id]) for s in setups}
    if stopped is not None:
        raise BenchStopped(rows, stopped.signal_number)
    return rows


class BenchStopped(Interrupted):
    """The bench was stopped part-way: ``rows`` holds the repeats measured before."""

    def __init__(self, rows: Dict[str, dict], signal_number: int):
        super().__init__(signal_number)
        self.rows = rows


def _progress(measurement: dict) -> str:
    if measurement.get("error"):
        return f"failed, {measurement['error']}"
    speed = measurement.get("samples_per_s")
    return (f"{speed:,.0f} samples/s" if speed else "no steady-state steps") + \
        f" ({measurement['wall_s']:.0f} s)"


def command_line() -> str:
    """How the bench was started, as a user would type it again."""
    program = Path(sys.argv[0]).name
    program = "python -m kosmoss" if program == "__main__.py" else shlex.quote(program)
    return " ".join([program, shlex.join(sys.argv[1:])])


COMM_SIZES = (256 * 1024, 1024**2, 4 * 1024**2, 8 * 1024**2)  # and the model's buckets
COMM_REPEATS = 60  # single all-reduces after compute: their mean is what a step pays
COMM_TIMEOUT_S = 300.0
ANATOMY_STEPS = 300  # raw-loop steps per line of the shared-GPU split (a few ms each)
PREDICTION_MODEL = (
    "kosmoss.scaling.projection: per-rank compute = the framework's fixed cost (the 1-rank row's "
    "step - the raw loop's, plus the Lightning loop that row ran once per K steps and a "
    "rank runs every step: its loop_step_s x (1 - 1/K); once a step, scaled by neither "
    "batch nor share) + the rest of "
    "the 1-rank row's step x (per-rank batch / global batch) x (reference share / rank "
    "share), optimizer measured here and scaled by the share; shares: on CPU the cores each "
    "has as they perform now (thread_speedup: the 1-rank row's threads against each rank's, "
    "measured after the rows), on GPU 1/ranks of the GPU the ranks share; + the all-reduce "
    "of DDP's buckets (alpha-beta fit of the mean times of this bench's kosmoss comm run of "
    "the row's topology, each all-reduce after a training step of the MLP lasting the "
    "per-rank compute time: --compute-s), exposed after backward (no overlap on CPU: the ranks "
    "fill every core); + the ranks' wait for the slowest, measured by that comm run at the "
    "gradients' size; + DDP's own cost a step on CPU besides the transfer (its hooks and "
    "buckets, timed on a 1-rank gloo group against the bare model: ddp_overhead_s); all "
    "but the fixed cost x the ranks' contention (that comm run's training steps side by "
    "side / alone, alone timed just before and after each size, the median over its "
    "sizes). Ranks sharing one GPU: all but the fixed cost x the raw loop's step on the "
    "ranks ÷ on one process at the whole batch, and the all-reduce's cost in that loop "
    "in place of the buckets' alpha-beta times and the wait (ddp_anatomy's first three lines: "
    "a host-staged gloo all-reduce of CUDA tensors waits for the queued GPU work, which the "
    "GPU's time-slicing between the ranks' contexts delays; measured 2.8 ms a step on an "
    "H200 against 1.4 ms alone, docs/scaling.md)")


class ThreadProbes:
    """How many cores the 1-rank CPU row's threads are worth (thread_speedup), probed after
    every round of repeats: on a host other processes also use, the figure swings with
    their load, so it is taken as close in time to the row's own repeats as the bench can."""

    def __init__(self, setups: Sequence[Setup], plan: Plan):
        self.setups, self.plan = setups, plan
        self.found: Dict[str, List[float]] = {}

    def keys(self) -> List[Tuple[int, int]]:
        from ..devices.cpus import available_cores

        cpu_rows = [s for s in self.setups if s.device == "cpu" and s.ranks > 1 and not s.horovod]
        return [(self.plan.batch_size, available_cores())] if cpu_rows else []

    def measure(self) -> None:
        from ..data.store import open_dataset
        from ..scaling.projection import thread_speedup

        for batch, threads in self.keys():
            prepared = open_dataset(self.plan.dataset, verify=False)
            self.found.setdefault(probe_key(batch, threads), []).append(
                thread_speedup(batch, threads, n_x=prepared.n_x, n_y=prepared.n_y))


def probe_key(batch: int, threads: int) -> str:
    return f"{threads} threads, batch {batch}"


def predict_rows(setups: Sequence[Setup], rows: Dict[str, dict], plan: Plan, out_dir: Path,
                 echo: Callable[[str], None],
                 probes: Optional[Dict[str, List[float]]] = None) -> dict:
    """Predicted figures of every measured multi-rank row (in place); what they came from.
    ``probes``: thread speedups taken during the rows (ThreadProbes.found); a figure not
    probed then is measured now."""
    wanted = [s for s in setups if s.ranks > 1 and rows[s.id]["status"] == "measured"]
    context: dict = {"model": PREDICTION_MODEL, "comm": {}, "profiles": {},
                     "thread_speedup_probes": dict(probes or {})}
    if not wanted:
        return context
    from ..data.store import open_dataset
    from ..scaling.projection import mlp_shape

    prepared = open_dataset(plan.dataset, verify=False)
    shape = mlp_shape(prepared.n_x, n_y=prepared.n_y)
    context["model_gradient_bytes"] = shape.gradient_bytes
    for setup in wanted:
        try:
            predicted = _predict_row(setup, rows, plan, shape, out_dir, context, echo)
            figures.attach_prediction(rows[setup.id], predicted)
        except PredictionMissing as missing:
            figures.attach_prediction(rows[setup.id], None, str(missing))
    return context


class PredictionMissing(Exception):
    """Why a multi-rank row has no predicted figures."""


def framework_step_s(kosmoss_row: dict, raw_row: dict) -> float:
    """What the framework adds to a step (Lightning's loop, hooks, the loader): the 1-rank
    kosmoss row's step time − the raw loop's at the same batch, both of this bench. Python
    on one thread: it neither shrinks with the per-rank batch nor speeds up with cores."""
    if raw_row.get("status") != "measured" or not raw_row.get("samples_per_s"):
        return 0.0
    batch = kosmoss_row["batch_size"]
    return max(0.0, batch / kosmoss_row["samples_per_s"] - batch / raw_row["samples_per_s"])


def loop_paid_back_s(single_row: dict) -> float:
    """What a rank of a multi-rank row pays a step that the 1-rank row did not: that row
    ran Lightning's loop once per K steps (kosmoss.run.chunks), a DDP rank runs it every
    step (K = 1). The loop's cost is the 1-rank run's own gap between chunks."""
    steps = single_row.get("steps_per_execution") or 1
    return (single_row.get("loop_step_s") or 0.0) * (1 - 1 / steps)


def row_topology(setup: Setup) -> Tuple[int, int, str]:
    """(ranks, simulated nodes, device) of a multi-rank row, from its command's flags."""
    entry = list(setup.entry)
    nodes = int(entry[entry.index("--num-nodes") + 1]) if "--num-nodes" in entry else 1
    return setup.ranks, nodes, "cuda" if setup.device == "gpu" else "cpu"


def _predict_row(setup: Setup, rows: Dict[str, dict], plan: Plan, shape, out_dir: Path,
                 context: dict, echo: Callable[[str], None]) -> dict:
    from ..scaling.projection import Cluster, links_from_comm, predict, profile_from_reference

    if setup.horovod:
        raise PredictionMissing("Horovod: its fusion buffer and cycle time are not DDP's "
                                "buckets; not modelled")
    single = rows.get(setup.single or "", {})
    if single.get("status") != "measured" or not single.get("samples_per_s"):
        raise PredictionMissing(f"no measured 1-rank row ({setup.single}) in this bench")
    ranks, nodes, device = row_topology(setup)
    gpu = device == "cuda"
    reference_share, rank_share = _shares(setup, rows, gpu, shape, context)
    if setup.single not in context["profiles"]:
        context["profiles"][setup.single] = profile_from_reference(
            {"samples_per_s": single["samples_per_s"], "batch": single["batch_size"],
             "device": device, "source": f"bench row {setup.single}",
             "step_time_cv": single.get("step_time_cv"),
             "fixed_s": framework_step_s(single, rows.get(single.get("versus") or "", {}))
                        + loop_paid_back_s(single)},
            reference_share, n_x=shape.n_x, n_y=shape.n_y)
    profile = context["profiles"][setup.single]
    global_batch = rows[setup.id]["batch_size"]
    # The all-reduces timed as this row's steps meet them: after each rank's compute.
    compute_s = profile.compute_s(global_batch / ranks, rank_share)
    comm = _comm(setup, (ranks, nodes, device), shape, plan, out_dir, context, echo, compute_s)
    intra, inter = links_from_comm(comm, "kosmoss comm in the bench")
    ratio, exposed = (shared_device_split(_anatomy(setup, ranks, plan, global_batch, out_dir,
                                                   context, echo), global_batch)
                      if gpu and shares_one_gpu(setup) else (None, None))
    cluster = Cluster(ranks // nodes, nodes, intra or inter, inter or intra, share=rank_share,
                      overlap=gpu, single_share=reference_share,
                      wait_s=gradient_wait_s(comm, shape.gradient_bytes),
                      ddp_s=0.0 if gpu else _ddp_cost(global_batch // ranks, ranks, shape,
                                                      context),
                      contention=side_by_side(comm),
                      measured_compute_ratio=ratio, measured_exposed_s=exposed)
    return predict(profile, shape, cluster, global_batch)


def shares_one_gpu(setup: Setup) -> bool:
    """A multi-rank GPU row whose ranks all run on one GPU (--gpus 1: simulated nodes of one
    GPU each, on this one machine)."""
    entry = list(setup.entry)
    return setup.device == "gpu" and "--gpus" in entry and entry[entry.index("--gpus") + 1] == "1"


def shared_device_split(lines: List[dict], global_batch: int) -> Tuple[float, float]:
    """(a rank's raw step ÷ one process's, the all-reduce's cost a step in seconds) from
    ddp_anatomy's first three lines: 1 process; the ranks, no communication; + one flat
    all-reduce (samples/s of the whole world at ``global_batch``)."""
    single, apart, reduced = (global_batch / line["samples_per_s"] for line in lines[:3])
    return apart / single, max(0.0, reduced - apart)


def _anatomy(setup: Setup, ranks: int, plan: Plan, global_batch: int, out_dir: Path,
             context: dict, echo: Callable[[str], None], device: str = "cuda") -> List[dict]:
    """ddp_anatomy's first three lines for ``ranks`` sharing one ``device`` (once per rank
    count and batch per bench)."""
    key = f"{ranks} ranks, batch {global_batch}, {device}"
    found = context.setdefault("anatomy", {})
    if key in found:
        return found[key]
    slug = key.replace(", ", "-").replace(" ", "")
    out, log = out_dir / "anatomy" / f"{slug}.json", out_dir / "logs" / f"anatomy-{slug}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "kosmoss.bench.ddp_anatomy", "--device", device, "--dataset",
            str(plan.dataset), "--batch-size", str(global_batch), "--ranks", str(ranks),
            "--steps", str(ANATOMY_STEPS), "--repeats", "1", "--variants", "3", "--json", str(out)]
    echo(f"predict {setup.id}: ddp_anatomy --device {device} --ranks {ranks} --variants 3")
    found[key] = _measured("ddp_anatomy", argv, setup, out_dir, log, out)
    return found[key]


def _measured(name: str, argv: List[str], setup: Setup, out_dir: Path, log: Path,
              result: Path) -> dict:
    """The JSON a prediction's measuring subprocess wrote, or why there is none."""
    code = run_logged(argv, row_environment(setup, out_dir), COMM_TIMEOUT_S, log)
    if code != 0 or not result.is_file():
        raise PredictionMissing(f"{name} failed ({'timed out' if code is None else code}): "
                                f"{last_line(log.read_text())} (log: {log})")
    return json.loads(result.read_text())


def _ddp_cost(batch: int, ranks: int, shape, context: dict) -> float:
    """DDP's own cost a step on a CPU rank of ``batch`` rows (projection.ddp_overhead_s),
    measured once per batch and thread count."""
    from ..devices.cpus import cores_per_process
    from ..scaling.projection import ddp_overhead_s

    threads = cores_per_process(ranks)
    costs = context.setdefault("ddp_overhead_s", {})
    key = probe_key(batch, threads)
    if key not in costs:
        costs[key] = ddp_overhead_s(batch, threads, n_x=shape.n_x, n_y=shape.n_y) or 0.0
    return costs[key]


def _gradient_row(comm: dict, gradient_bytes: int, key: str) -> Optional[dict]:
    """The comm row nearest the model's gradients that has ``key`` (an after-compute run)."""
    rows = [r for r in comm["groups"]["world"]["rows"] if key in r]
    return min(rows, key=lambda r: abs(r["bytes"] - gradient_bytes)) if rows else None


def gradient_wait_s(comm: dict, gradient_bytes: int) -> Optional[float]:
    """The ranks' measured wait for the last one at the all-reduce of the size nearest the
    model's gradients (kosmoss comm --compute-s), or None (back-to-back timings)."""
    row = _gradient_row(comm, gradient_bytes, "wait_s")
    return None if row is None else row["wait_s"]


def side_by_side(comm: dict) -> float:
    """A rank's training step with every rank computing ÷ alone, as that comm run measured
    it: the median over its sizes, which all follow the same step (one size's ratio swung
    0.89–1.31 between runs on a 2-core VM, the median 1.05–1.26); 1 for back-to-back
    timings."""
    ratios = [row["compute_s"] / row["compute_alone_s"]
              for row in comm["groups"]["world"]["rows"] if row.get("compute_alone_s")]
    return statistics.median(ratios) if ratios else 1.0


def _shares(setup: Setup, rows: Dict[str, dict], gpu: bool, shape,
            context: dict) -> Tuple[float, float]:
    """(what the 1-rank row had, what each rank has), in the same unit. GPU rows: the one
    GPU the ranks share. CPU rows: cores as they perform now (thread_speedup), in units of
    one thread: the 1-rank row's threads (Lightning gives a lone process every core)
    against each rank's (this host's cores split over the ranks)."""
    from ..devices.cpus import available_cores, cores_per_process
    from ..scaling.projection import thread_speedup

    if gpu:
        return 1.0, 1.0 / setup.ranks
    speedups = context.setdefault("thread_speedup", {})

    def speedup(batch: int, threads: int) -> float:
        key = probe_key(batch, threads)
        if key not in speedups:
            probed = context["thread_speedup_probes"].get(key)
            speedups[key] = statistics.median(probed) if probed else \
                thread_speedup(batch, threads, n_x=shape.n_x, n_y=shape.n_y)
        return speedups[key]

    batch = rows[setup.id]["batch_size"]
    return (speedup(batch, available_cores()),
            speedup(batch // setup.ranks, cores_per_process(setup.ranks)))


def _comm(setup: Setup, topology: Tuple[int, int, str], shape, plan: Plan, out_dir: Path,
          context: dict, echo: Callable[[str], None], compute_s: float) -> dict:
    """The kosmoss comm measurement of this topology, each all-reduce after ``compute_s``
    of compute (one per topology and compute time per bench)."""
    hosts = host_flags(setup)  # a row on hosts: its comm over the same shaped links
    key = "{}x{}-{}-{:.1f}ms".format(*topology, compute_s * 1e3) + "-".join(["", *hosts[1::2]])
    if key in context["comm"]:
        return context["comm"][key]["result"]
    ranks, nodes, device = topology
    folder, log = out_dir / "comm" / key, out_dir / "logs" / f"comm-{key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(COMM_SIZES) | {size for size, _ in shape.buckets})
    argv = [sys.executable, "-m", "kosmoss.commands.comm", "--ranks", str(ranks), "--nodes",
            str(nodes), "--backend", "gloo", "--device", device, "--repeats", str(COMM_REPEATS),
            "--compute-s", f"{compute_s:.6f}", "--out", str(folder), *hosts,
            "--sizes", *map(str, sizes)]
    echo(f"predict {setup.id}: kosmoss comm --ranks {ranks} --nodes {nodes} --compute-s "
         f"{compute_s:.4f} ({device})")
    result = _measured("kosmoss comm", argv, setup, out_dir, log, folder / "comm.json")
    context["comm"][key] = {"comm_json": str(folder / "comm.json"), "result": result}
    return result


def host_flags(setup: Setup) -> List[str]:
    """--hosts and --link-rate of a row's command, for its kosmoss comm."""
    entry = list(setup.entry)
    return [flag for name in ("--hosts", "--link-rate") if name in entry
            for flag in (name, entry[entry.index(name) + 1])]


def prediction_summary(context: dict) -> dict:
    """What bench.json keeps of the prediction's inputs (the comm results stay in comm/)."""
    from dataclasses import asdict

    return {"model": context["model"],
            "model_gradient_bytes": context.get("model_gradient_bytes"),
            "comm": {key: {"comm_json": c["comm_json"],
                           "fits": {name: g.get("fit_mean") or g["fit"]
                                    for name, g in c["result"]["groups"].items()}}
                     for key, c in context["comm"].items()},
            "profiles": {key: asdict(p) for key, p in context["profiles"].items()},
            "thread_speedup": context.get("thread_speedup", {}),
            "ddp_overhead_s": context.get("ddp_overhead_s", {}),
            "anatomy": context.get("anatomy", {}),
            "thread_speedup_probes": context.get("thread_speedup_probes", {})}


def assemble(setups: Sequence[Setup], rows: Dict[str, dict], plan: Plan, out_dir: Path,
             machine_facts: dict, quick: bool, prediction: Optional[dict] = None,
             stopped_by: Optional[str] = None) -> dict:
    """bench.json: what ran where, every row (skipped ones with their reason), the checks."""
    goals = figures.complete(setups, rows)
    return {
        "kosmoss_bench": 1,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command_line(),
        "quick": quick,
        "stopped_by": stopped_by,
        "out_dir": str(out_dir),
        "plan": {
            "dataset": str(plan.dataset), "dataset_name": plan.dataset.name,
            "n_samples": plan.n_samples, "n_train": plan.n_train,
            "batch_size": plan.batch_size, "gpu_batch_size": plan.gpu_batch_size,
            "steps": plan.steps, "warmup_steps": 1, "repeats": plan.repeats, "seed": plan.seed,
        },
        "machine": machine_facts,
        "target_definition": TARGET_DEFINITION,
        "targets": goals,
        "rows": [rows[s.id] for s in setups],
        "prediction": prediction_summary(prediction) if prediction else None,
        "checks": figures.checks(rows, plan.n_samples),
    }
