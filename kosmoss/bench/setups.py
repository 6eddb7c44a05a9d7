"""The bench's matrix: every set-up, the command that runs it, and why one is skipped.

Every row runs as a subprocess of the real entry point (trainup_cpu.py, trainup_gpu.py,
horovodrun) or of :mod:`kosmoss.bench.baselines`, so each gets a fresh process: its own
peak memory, its own start-up time, no state left over from the row before.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

from .rungs import RUNGS, TOP

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # what `import kosmoss` needs on the path
MAX_EPOCHS = 1_000_000  # the step count stops every run
HOROVOD_HINT = "run scripts/install_horovod.sh"


@dataclass(frozen=True)
class Setup:
    """One row of the matrix. ``versus``: the row this one's samples/s is divided by (the
    limit; for the batched loader, the course's loader). ``single``: the 1-rank row its
    scaling efficiency is measured against."""

    id: str
    label: str
    kind: str  # raw | lightning | fabric | ladder | kosmoss | loader
    device: str = "cpu"  # cpu | gpu
    ranks: int = 1
    bf16: bool = False
    horovod: bool = False
    versus: Optional[str] = None
    single: Optional[str] = None
    entry: Tuple[str, ...] = ()  # kosmoss rows: script and its flags
    rung: Optional[str] = None  # ladder rows: the rung of kosmoss.bench.ladder
    batch: Optional[str] = None  # a batch of its own: a number, or "max" (see ladder)

    @property
    def trains(self) -> bool:
        return self.kind in ("raw", "lightning", "fabric", "ladder", "kosmoss")

    @property
    def holds_splits(self) -> bool:
        """The loop holds the training and validation splits as tensors."""
        return self.kind in ("raw", "lightning", "fabric", "ladder")


def _ladder_rows() -> Tuple[Setup, ...]:
    """The GPU ladder (kosmoss.bench.ladder): each rung ÷ the one below it (what its change
    bought), and against the GPU's limit; its top rung at larger batches."""
    rows, below = [], None
    for step in RUNGS:
        rows.append(Setup(f"ladder-{step.name}", f"ladder: {step.name} ({step.removes})",
                          "ladder", device="gpu", bf16=step.bf16, versus=below, rung=step.name))
        below = f"ladder-{step.name}"
    top = RUNGS[-1]
    for batch in ("65536", "max"):
        rows.append(Setup(f"ladder-top-{batch}", f"ladder: {top.name} at batch {batch}",
                          "ladder", device="gpu", bf16=True, versus=below, rung=top.name,
                          batch=batch))
    return tuple(rows)


LADDER_ROWS = _ladder_rows()


# A GPU row must not fall back to CPU unnoticed, and keeps its data on the GPU (the raw
# GPU loop's data is there too: the host-to-GPU copy would otherwise be what is measured).
GPU_FLAGS = ("--require-gpu", "--mode", "device")
HOROVOD = ("trainup_gpu.py", "--strategy", "horovod")
# The ladder's rungs never validate; at the top's batches an epoch is a chunk or one step,
# and a validation after each left the GPU idle between them
# (docs/gpu/2026-11-27-h200-ladder.md).
TOP_FLAGS = ("trainup_gpu.py", "--gpus", "1", "--precision", "bf16-mixed", "--compile",
             "--cuda-graphs", "--steps-per-execution", "8", "--val-every-n-epochs", "100") \
    + GPU_FLAGS
HOROVOD_CPU = ("trainup_cpu.py", "--strategy", "horovod")  # every CPU row: trainup_cpu.py

MATRIX: Tuple[Setup, ...] = (
    Setup("raw-cpu", "raw PyTorch loop, tensors in RAM (the limit)", "raw"),
    Setup("lightning-cpu", "the raw loop's step in Trainer(barebones=True): Lightning alone",
          "lightning", versus="raw-cpu"),
    Setup("fabric-cpu", "the raw loop on Lightning Fabric: a loop of one's own", "fabric",
          versus="raw-cpu"),
    Setup("kosmoss-cpu", "kosmoss, 1 CPU process", "kosmoss", versus="raw-cpu",
          entry=("trainup_cpu.py",)),
    Setup("ddp-cpu-2", "kosmoss, CPU DDP, 2 processes", "kosmoss", ranks=2, versus="raw-cpu",
          single="kosmoss-cpu", entry=("trainup_cpu.py", "--num-processes", "2")),
    Setup("nodes-cpu-2x1", "kosmoss, 2 simulated nodes x 1 process, CPU", "kosmoss", ranks=2,
          versus="raw-cpu", single="kosmoss-cpu",
          entry=("trainup_cpu.py", "--num-nodes", "2", "--num-processes", "1")),
    *(Setup(f"hosts-cpu-2x1{'-' + rate if rate != 'none' else ''}",
            f"kosmoss, 2 hosts (network namespaces) x 1 process, CPU, links {rate}", "kosmoss",
            ranks=2, versus="raw-cpu", single="kosmoss-cpu",
            entry=("trainup_cpu.py", "--num-nodes", "2", "--num-processes", "1", "--hosts",
                   "netns", "--link-rate", rate))
      for rate in ("none", "1gbit", "100mbit")),
    Setup("horovod-cpu-2", "kosmoss, Horovod (gloo), 2 CPU processes", "kosmoss", ranks=2,
          horovod=True, versus="raw-cpu", single="kosmoss-cpu", entry=HOROVOD_CPU),
    Setup("loader-course", "loader: the course's, one memmap opened per sample", "loader"),
    Setup("loader-kosmoss", "loader: kosmoss, batched reads", "loader", versus="loader-course"),
    Setup("raw-gpu", "raw PyTorch loop, tensors on the GPU (the limit)", "raw", device="gpu"),
    Setup("lightning-gpu", "the raw GPU loop's step in Trainer(barebones=True)", "lightning",
          device="gpu", versus="raw-gpu"),
    Setup("fabric-gpu", "the raw GPU loop on Lightning Fabric", "fabric", device="gpu",
          versus="raw-gpu"),
    Setup("kosmoss-gpu", "kosmoss, 1 GPU", "kosmoss", device="gpu", versus="raw-gpu",
          entry=("trainup_gpu.py", "--gpus", "1") + GPU_FLAGS),
    Setup("nodes-gpu-2x1", "kosmoss, 2 simulated nodes sharing 1 GPU (gloo)", "kosmoss",
          device="gpu", ranks=2, versus="raw-gpu", single="kosmoss-gpu",
          entry=("trainup_gpu.py", "--num-nodes", "2", "--gpus", "1") + GPU_FLAGS),
    Setup("raw-gpu-bf16", "raw PyTorch loop, GPU, bf16 autocast (the limit)", "raw",
          device="gpu", bf16=True),
    Setup("kosmoss-gpu-bf16", "kosmoss, 1 GPU, bf16-mixed", "kosmoss", device="gpu", bf16=True,
          versus="raw-gpu-bf16",
          entry=("trainup_gpu.py", "--gpus", "1", "--precision", "bf16-mixed") + GPU_FLAGS),
    Setup("horovod-gpu-2", "kosmoss, Horovod, 2 processes sharing 1 GPU", "kosmoss",
          device="gpu", ranks=2, horovod=True, versus="raw-gpu", single="kosmoss-gpu",
          entry=HOROVOD + GPU_FLAGS),
    # kosmoss at the top of the ladder: the top rung's features through the run path, ÷ it.
    Setup("kosmoss-gpu-top", "kosmoss, 1 GPU, bf16, compile, CUDA graphs, 8 steps a replay, "
          "inputs stored in bf16, validation every 100 epochs", "kosmoss", device="gpu",
          bf16=True, versus=f"ladder-{TOP.name}", entry=TOP_FLAGS),
    Setup("kosmoss-gpu-top-max", "the same at the largest batch", "kosmoss", device="gpu",
          bf16=True, versus="ladder-top-max", entry=TOP_FLAGS, batch="max"),
    # The CPU's compile row: the raw loop with torch.compile (inductor), compile time apart.
    Setup("compile-cpu", "raw loop + torch.compile (inductor), fp32", "ladder",
          versus="raw-cpu", rung="compile-fp32"),
) + LADDER_ROWS
BY_ID: Dict[str, Setup] = {setup.id: setup for setup in MATRIX}


@dataclass(frozen=True)
class Plan:
    """What every row shares: the dataset, the batches, the step count."""

    dataset: Path
    n_samples: int
    n_train: int
    bytes_per_sample: int
    batch_size: int  # global batch of the CPU rows and the loaders
    gpu_batch_size: int
    steps: int  # timed steps; one more runs first, as the warm-up
    repeats: int
    seed: int = 42
    timeout_s: float = 900.0

    def batch_for(self, setup: Setup) -> int:
        if setup.batch == "max":  # as kosmoss.bench.ladder.largest_batch
            return 1 << (max(1, self.n_train).bit_length() - 1)
        if setup.batch:
            return int(setup.batch)
        return self.gpu_batch_size if setup.device == "gpu" else self.batch_size


@dataclass(frozen=True)
class Machine:
    """What decides whether a row can run here; each ``*_missing`` is a reason or None."""

    cuda: bool
    bf16: bool
    horovod_missing: Optional[str]
    scripts_missing: Optional[str]
    free_ram_bytes: int
    free_gpu_bytes: int = 0
    hosts_missing: Optional[str] = None  # why hosts in network namespaces cannot be made here


def probe(setups: Sequence[Setup] = MATRIX) -> Machine:
    """This machine, as the skip rules see it (Horovod is probed only if a row needs it)."""
    import torch

    cuda = torch.cuda.is_available()
    return Machine(
        cuda=cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        horovod_missing=horovod_missing() if any(s.horovod for s in setups) else None,
        scripts_missing=scripts_missing(),
        free_ram_bytes=psutil.virtual_memory().available,
        free_gpu_bytes=torch.cuda.mem_get_info()[0] if cuda else 0,
        hosts_missing=hosts_missing() if any(uses_hosts(s) for s in setups) else None,
    )


def uses_hosts(setup: Setup) -> bool:
    return "--hosts" in setup.entry


def hosts_missing() -> Optional[str]:
    from ..launch.hosts import support_missing

    missing = support_missing()
    return f"hosts in network namespaces: {missing}" if missing else None


def horovodrun() -> Optional[str]:
    # The venv's bin is not on PATH when kosmoss is called by its full path.
    beside = Path(sys.executable).with_name("horovodrun")
    return shutil.which("horovodrun") or (str(beside) if beside.is_file() else None)


def horovod_missing() -> Optional[str]:
    if importlib.util.find_spec("horovod") is None:
        return f"Horovod not installed: {HOROVOD_HINT}"
    # In a subprocess: a broken build can abort the interpreter that imports it.
    check = "import sys, horovod.torch as hvd; sys.exit(0 if hvd.gloo_built() else 3)"
    probe_import = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                                  timeout=120)
    if probe_import.returncode == 3:
        return f"Horovod was built without gloo (horovodrun --gloo needs it): {HOROVOD_HINT}"
    if probe_import.returncode != 0:
        return f"import horovod.torch fails ({last_line(probe_import.stderr)}): {HOROVOD_HINT}"
    if horovodrun() is None:
        return f"horovodrun not on PATH: activate the environment Horovod is in, or {HOROVOD_HINT}"
    return None


def scripts_root() -> Optional[Path]:
    """Where trainup_*.py are: the checkout, or the copy installed with kosmoss."""
    from ..core.errors import UsageError
    from ..lessons.course import source_root

    try:
        return source_root()
    except UsageError:
        return None


def scripts_missing() -> Optional[str]:
    root, scripts = scripts_root(), ("trainup_cpu.py", "trainup_gpu.py")
    missing = [name for name in scripts if root is None or not (root / name).is_file()]
    if missing:
        where = f" in {root}" if root else ""
        return f"{' and '.join(missing)} not found{where}: run from a checkout or reinstall kosmoss"
    return None


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def skip_reason(setup: Setup, machine: Machine, plan: Optional[Plan]) -> Optional[str]:
    """Why ``setup`` cannot run on ``machine``, or None (memory is judged with a plan only)."""
    if setup.device == "gpu" and not machine.cuda:
        return "no CUDA GPU"
    if setup.bf16 and not machine.bf16:
        return "this GPU has no bf16 (torch.cuda.is_bf16_supported() is False)"
    if setup.horovod and machine.horovod_missing:
        return machine.horovod_missing
    if setup.kind == "kosmoss" and machine.scripts_missing:
        return machine.scripts_missing
    if uses_hosts(setup) and machine.hosts_missing:
        return machine.hosts_missing
    if setup.holds_splits and plan is not None:
        return _memory_shortfall(setup, machine, plan)
    return None


def _memory_shortfall(setup: Setup, machine: Machine, plan: Plan) -> Optional[str]:
    # The raw and Lightning loops hold the training and validation splits as tensors (90 %
    # of the rows).
    need = int(plan.n_samples * 0.9) * plan.bytes_per_sample
    where, free = ("GPU memory", machine.free_gpu_bytes) if setup.device == "gpu" else \
        ("RAM", machine.free_ram_bytes)
    if need > 0.8 * free:
        return (f"its tensors need {need / 2**30:.1f} GiB of {where}, {free / 2**30:.1f} GiB "
                "free: use a smaller --dataset")
    return None


def command(setup: Setup, plan: Plan, result_json: Path) -> List[str]:
    """The command line of one measurement of ``setup``; it writes ``result_json``."""
    batch = str(plan.batch_for(setup))
    if setup.kind == "kosmoss":
        script, *flags = setup.entry
        launcher = [horovodrun() or "horovodrun", "-np", str(setup.ranks), "--gloo"] \
            if setup.horovod else []
        script_path = (scripts_root() or PACKAGE_PARENT) / script
        return launcher + [
            sys.executable, str(script_path), *flags, "--dataset", str(plan.dataset),
            "--batch-size", batch, "--max-steps", str(plan.steps + 1),
            "--max-epochs", str(MAX_EPOCHS), "--seed", str(plan.seed), "--no-progress",
            "--result-json", str(result_json),
        ]
    if setup.kind == "ladder":
        return [sys.executable, "-m", "kosmoss.bench.ladder", "--dataset", str(plan.dataset),
                "--rungs", setup.rung, "--batch-size", batch, "--steps", str(plan.steps),
                "--seed", str(plan.seed), "--device", "cuda" if setup.device == "gpu" else "cpu",
                "--out", str(result_json)]
    what = setup.id if setup.kind == "loader" else setup.kind
    return [sys.executable, "-m", "kosmoss.bench.baselines", what, "--dataset", str(plan.dataset),
            "--batch-size", batch, "--steps", str(plan.steps), "--seed", str(plan.seed),
            "--device", "cuda" if setup.device == "gpu" else "cpu",
            *(["--bf16"] if setup.bf16 else []), "--out", str(result_json)]


def environment(setup: Setup) -> Dict[str, str]:
    """Variables set for the row's process on top of the bench's own."""
    # A CPU row stays on CPU through the one device policy, whatever the user's environment
    # says about this machine (KOSMOSS_MACHINE_GPU=force would otherwise give it the GPU).
    return {"KOSMOSS_MACHINE_GPU": "none"} if setup.device == "cpu" else {}
