"""The course: where its lessons ship, copying them into a working folder, and the
helpers the lessons share (finding a launcher script, running a command visibly, quieting
Lightning's banners, the quick mode CI uses).

The lessons are jupytext ``py:percent`` files in the repository's ``notebooks/``. A
checkout (editable install) uses them in place; ``pip install .`` installs them, with the
launcher scripts they run, under ``<prefix>/share/kosmoss/lessons`` (setuptools
``data-files``, the way Jupyter ships kernelspecs), found through the installed files'
record or the install scheme's data folder. Copying never replaces a file the learner
changed: a manifest keeps the checksum of every file written, and only files still equal
to what was written are updated.

The learner's folder gets one notebook per lesson, the ``.ipynb`` (JupyterLab with
jupytext would list a ``.py`` beside it as a second copy of the same lesson); without
jupytext the ``.py`` source is copied instead. ``KOSMOSS_LESSON_QUICK=1`` (CI sets it)
shortens the longest experiments; the lessons still compute and assert their verdicts.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from ..core.errors import RunFailed, UsageError
from ..core.files import atomic_write_bytes, atomic_write_json, check_writable

LESSON_GLOB = "[0-9][0-9]*_*.py"  # 01_..., and 03b_... for a lesson placed after lesson 3
SCRIPTS = ("trainup_cpu.py", "trainup_gpu.py", "slurm/submit.sbatch")
# Files the lessons point to, copied beside them (a pip install has no repository to look in).
# What scripts/gpu_check.sh recorded on a GPU (docs/gpu/): a lesson's GPU-only cell shows
# it where the learner has no GPU, with its date and device. Newest last.
GPU_RECORDS = ("docs/gpu/2026-11-26-h200/results.json",
               "docs/gpu/2026-11-26-h200-followup/results.json",
               "docs/gpu/2026-11-26-h100/results.json",
               "docs/gpu/2026-11-26-h100-ladder/results.json",
               "docs/gpu/2026-11-27-h200-ladder/results.json",
               "docs/gpu/2026-11-28-h200-top/results.json",
               "docs/gpu/2026-11-28-h200-lessons/results.json")
COMPANIONS = ("docs/devices.md", "docs/horovod.md", "docs/scaling.md", "docs/debugging.md",
              "docs/cli.md", "docs/hosts.md", "docs/hosts/lost-host.json", "docs/gpu.md",
              "scripts/install_horovod.sh") + GPU_RECORDS
QUICK_ENV = "KOSMOSS_LESSON_QUICK"
NOTEBOOK_COLUMNS = 120  # what a JupyterLab output area shows without wrapping
SH_STOP_GRACE_S = 20.0  # an interrupted command's own stop (a run's last checkpoint) gets this
# Warnings a learner cannot act on; every other warning still shows, on one line.
NOISE = (
    ".*does not have many workers.*",  # the batched loader needs no worker processes
    ".*LeafSpec.*is deprecated.*",  # Lightning 2.6 calling torch 2.13's deprecated API
    ".*srun.*command is available.*",  # Slurm is installed but the lesson does not use it
)
SHARE = ("share", "kosmoss", "lessons")
MANIFEST = ".kosmoss-lessons.json"


def source_root() -> Path:
    """The folder holding ``notebooks/`` and the scripts: the checkout kosmoss was imported
    from, else the installed copy."""
    checkout = Path(__file__).resolve().parents[2]  # kosmoss/lessons/course.py
    if (checkout / "pyproject.toml").is_file() and (checkout / "notebooks").is_dir():
        return checkout
    installed = _installed_root()
    if installed is None:
        raise UsageError("the lessons are not installed with this kosmoss: reinstall it "
                         "(pip install kosmoss) or run from a kosmoss checkout")
    return installed


def _installed_root() -> Optional[Path]:
    return next((folder for folder in _install_candidates()
                 if (folder / SCRIPTS[0]).is_file()), None)


def _install_candidates() -> Iterator[Path]:
    """Where ``pip install`` may have put ``share/kosmoss/lessons``: the installed files'
    record, then the data folders of the install schemes, then beside the package
    (``pip install --target``, whose record points elsewhere)."""
    try:
        files = importlib.metadata.distribution("kosmoss").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        # RECORD paths of data-files are relative to site-packages ("../../../share/...").
        if tuple(file.parts[-4:]) == SHARE + (SCRIPTS[0],):
            yield Path(file.locate()).resolve().parent
    yield Path(sysconfig.get_path("data")).joinpath(*SHARE)
    yield Path(sysconfig.get_path("data", f"{os.name}_user")).joinpath(*SHARE)
    yield Path(__file__).resolve().parents[2].joinpath(*SHARE)


def lesson_sources(root: Optional[Path] = None) -> List[Path]:
    return sorted(((root or source_root()) / "notebooks").glob(LESSON_GLOB))


def script(name: str) -> Path:
    """A launcher script (``trainup_cpu.py``, ...): the learner's copy in the working folder
    if there is one, else the one that ships with kosmoss."""
    here = Path(name)
    return here.resolve() if here.is_file() else source_root() / name


def recorded_gpu(key: str) -> Optional[dict]:
    """The newest GPU record holding ``key`` (a results.json entry of scripts/gpu_check.sh:
    ghost, anatomy, sweep, ...): ``{"figures": ..., "device": ..., "date": ...,
    "command": ...}``; None if no record has it."""
    import json

    for name in reversed(GPU_RECORDS):
        path = script(name)  # the learner's copy beside the lessons, else the shipped one
        record = json.loads(path.read_text()) if path.is_file() else {}
        if record.get(key):
            meta = record["meta"]
            return {"figures": record[key], "device": meta["device"].split(": ", 1)[-1],
                    "date": meta["started"], "command": meta["command"]}
    return None


def scratch_folder(prefix: str) -> Path:
    """A temporary folder for a lesson's files, removed when its kernel exits: a course run
    many times leaves no /tmp/lessonNN-* folders behind."""
    import atexit
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def quick() -> bool:
    """True when ``KOSMOSS_LESSON_QUICK`` is set (CI): the longest experiments run shorter."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def quiet_lightning() -> None:
    """What a lesson's own Trainers print, reduced to what a learner should read: no
    banners ("GPU available: ...") or adverts (Lightning's INFO log), no warnings nobody
    can act on (``NOISE``), and every other warning on one line without a source excerpt."""
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in NOISE:
        warnings.filterwarnings("ignore", pattern)
    warnings.formatwarning = _one_line


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}\n"


def on_ranks(function: Callable, world_size: int, *args, timeout_s: float = 180) -> None:
    """Run ``function(rank, world_size, port, *args)`` in ``world_size`` processes forked
    from the notebook's kernel (they inherit its variables: a function defined in a cell
    cannot be pickled for ``spawn``), and wait for all of them.

    A fork of a kernel is fragile: it copies the kernel's threads' locks as they were. So
    each rank gets one OpenMP thread, writes to the kernel's own stdout/stderr rather than
    the notebook's (ipykernel's streams are zmq sockets of the parent), and dies with the
    kernel. Ranks that do not finish within ``timeout_s`` are a hang: the cell fails with
    every rank's stack (py-spy, as ``kosmoss stacks`` reads them) instead of waiting
    forever. Ranks whose backward fails because the kernel ran one first with a GPU visible
    fail the cell with one line that says so (:mod:`.forks`)."""
    import torch.multiprocessing as mp

    from ..launch.ports import free_port
    from ..diagnose.stacks import stacks_text
    from .forks import explaining_autograd_forks

    with explaining_autograd_forks(f"on_ranks({function.__name__}, {world_size})"):
        context = mp.start_processes(_forked_rank, args=(os.getpid(), function, world_size,
                                                          free_port(), *args),
                                     nprocs=world_size, start_method="fork", join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{world_size} ranks of {function.__name__} did not "
                                       f"finish within {timeout_s:g} s; where they were:\n"
                                       + stacks_text((p.pid for p in context.processes),
                                                     native=True))
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join(timeout=5)  # reaped: no zombie left in the kernel's table


def forked(function: Callable, *args):
    """``function(*args)`` in one process forked from the notebook's kernel, and its result
    (pickled) back: the way a lesson runs a backward pass that must not run in the kernel
    (after one there, a GPU machine's ranks forked later could not run theirs:
    :mod:`.forks`). The process computes with one OpenMP thread, as a rank of
    :func:`on_ranks` does; ``function`` is named by reference (a cell's function, not a
    lambda)."""
    import multiprocessing

    from .forks import explaining_autograd_forks

    with explaining_autograd_forks(f"forked({function.__name__})"):
        with multiprocessing.get_context("fork").Pool(1, initializer=_one_thread) as pool:
            return pool.apply(function, args)


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # the kernel's OpenMP pool does not survive a fork (lesson 3)


@contextlib.contextmanager
def one_thread_per_forked_rank() -> Iterator[None]:
    """Around a ``fit`` with Lightning's notebook launcher (``strategy="ddp_notebook"``,
    ranks forked from the kernel): each rank computes with one OpenMP thread.

    GNU OpenMP's thread pool does not survive a fork: a rank forked from a kernel that
    already computed on several threads hangs in its first parallel region if it asks for
    more than one thread (facebookresearch/CrypTen#37 met it in notebooks too). Lightning's
    launcher gives each rank cores ÷ ranks threads when ``OMP_NUM_THREADS`` is unset
    (``lightning_fabric.utilities.distributed._set_num_threads_if_needed``): 1 on 2 cores,
    so CI never hangs, but 2 or more, and a hang, on any machine with 4 cores or more. So
    ``OMP_NUM_THREADS=1`` for the launcher and one thread in the kernel while it forks;
    the kernel's own setting comes back afterwards. Ranks whose backward fails because the
    kernel ran one first with a GPU visible fail with one line that says so (:mod:`.forks`).
    A fit interrupted from Jupyter leaves no rank behind, running or zombie."""
    import multiprocessing

    import torch

    from .forks import explaining_autograd_forks

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    kernels_own = set(multiprocessing.active_children())
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)  # what the forked ranks inherit
    try:
        with explaining_autograd_forks("the notebook launcher (ddp_notebook)"):
            yield
    except BaseException:
        # Interrupted (Lightning turns the kernel's KeyboardInterrupt into SystemExit): the
        # ranks got the interrupt too but nothing reaps them; they stayed zombies.
        _end(set(multiprocessing.active_children()) - kernels_own)
        raise
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


def _end(processes) -> None:
    """Kill ``multiprocessing`` children still running and reap them all."""
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(timeout=5)


def _forked_rank(rank: int, kernel: int, function: Callable, world_size: int, port: int,
                 *args) -> None:
    import torch

    from ..launch.lifetime import die_with

    die_with(kernel)()
    torch.set_num_threads(1)  # the kernel's OpenMP pool does not survive a fork (lesson 3)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    function(rank, world_size, port, *args)


def sh(args: Sequence, *, env: Optional[Dict[str, str]] = None,
       check: bool = True) -> subprocess.CompletedProcess:
    """Run a command as a learner would type it: print it, stream its output (stderr in
    order with stdout, tables as wide as a notebook), and raise (with the exit code) if it
    fails, so a lesson never goes on past a broken step. Interrupted from Jupyter, the
    command stops as Ctrl-C stops it in a terminal, and the lines it says then are shown."""
    shown = ["python" if a == sys.executable else str(a) for a in args]
    print("$ " + " ".join(shown), flush=True)
    env = dict(os.environ if env is None else env)
    env.setdefault("COLUMNS", str(NOTEBOOK_COLUMNS))  # rich sizes its tables from it
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        _print_lines(proc, lines)
    except KeyboardInterrupt:  # the learner interrupted the cell
        _let_it_stop(proc, lines)
        raise
    except BaseException:
        _end_command(proc)
        raise
    if check and proc.returncode != 0:
        # Its last line too: a report that keeps only the error (scripts/gpu_check.sh) says why.
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        raise RuntimeError(f"`{' '.join(shown)}` exited with code {proc.returncode}"
                           + (f": {last}" if last else ""))
    return subprocess.CompletedProcess(shown, proc.returncode, "".join(lines), "")


def _print_lines(proc: subprocess.Popen, lines: List[str]) -> None:
    for line in proc.stdout:
        lines.append(line)
        print(line, end="", flush=True)
    proc.wait()


def _let_it_stop(proc: subprocess.Popen, lines: List[str]) -> None:
    """An interrupted cell's command: Jupyter signals the kernel's process group
    (jupyter_client's LocalProvisioner), so the command got SIGINT too, once, as from Ctrl-C
    in a terminal; a second one could cut its own stop short. Its last lines are shown as it
    stops (a run says how to resume); it is ended after SH_STOP_GRACE_S, or at a second
    interrupt, so that nothing is left behind."""
    try:
        rest = threading.Thread(target=_print_lines, args=(proc, lines), daemon=True)
        rest.start()
        rest.join(SH_STOP_GRACE_S)
    finally:
        _end_command(proc)


def _end_command(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


# ---------------------------------------------------------------- copying


@dataclass(frozen=True)
class Copied:
    name: str  # path inside the working folder
    status: str  # written | updated | unchanged | kept (the learner changed it)


def bundle(root: Path, notebook_converter=None) -> Dict[str, bytes]:
    """Every file of the working folder and its content: each lesson once, as ``.ipynb``
    when ``notebook_converter`` is given, else as its ``.py`` source; the scripts they run
    and the documents they point to."""
    files = {}
    for lesson in lesson_sources(root):
        if notebook_converter is None:
            files[lesson.name] = lesson.read_bytes()
        else:
            files[lesson.with_suffix(".ipynb").name] = notebook_converter(lesson)
    for name in SCRIPTS + COMPANIONS:
        files[name] = (root / name).read_bytes()
    return files


def to_ipynb(lesson: Path) -> bytes:
    """The lesson as the notebook Jupyter would save: fixed cell ids and the kernel's
    ``language_info``, so that opening it changes nothing (a notebook JupyterLab has to
    complete opens as modified, and once saved it counts as the learner's)."""
    import jupytext

    notebook = jupytext.read(lesson)
    for index, cell in enumerate(notebook.cells):
        # nbformat draws random cell ids: fixed ones make the same lesson the same file.
        cell.id = f"cell-{index:03d}"
    notebook.metadata["language_info"] = language_info()
    text = jupytext.writes(notebook, fmt="ipynb")
    return (text if text.endswith("\n") else text + "\n").encode()  # as nbformat.write ends it


def language_info() -> dict:
    """What this interpreter's kernel reports when it starts (ipykernel's own answer)."""
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:  # no kernel here to open the notebook anyway: the same keys, by hand
        return {"name": "python", "version": sys.version.split()[0], "mimetype": "text/x-python",
                "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
                "pygments_lexer": f"ipython{sys.version_info[0]}",
                "nbconvert_exporter": "python", "file_extension": ".py"}
    return dict(IPythonKernel.language_info)


def copy_lessons(dest: Path, files: Dict[str, bytes]) -> List[Copied]:
    """Write ``files`` into ``dest``; a file that differs from what kosmoss last wrote
    there was changed by the learner and is kept as it is."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--dest {dest}: is a file; give a folder for the lessons")
    check_writable(dest, "--dest")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--dest {dest}: cannot create it ({err.strerror}); give another "
                         "folder") from None
    written = _read_manifest(dest)
    report = []
    name = MANIFEST
    try:
        for name, content in files.items():
            target = dest / name
            status = _status(target, content, written.get(name))
            if status in ("written", "updated"):
                target.parent.mkdir(parents=True, exist_ok=True)
                # Whole or not at all: a half-written lesson would pass for the learner's own.
                atomic_write_bytes(target, content)
            if status != "kept":
                written[name] = _sha256(content)
            report.append(Copied(name, status))
        name = MANIFEST
        atomic_write_json(dest / MANIFEST, {"files": dict(sorted(written.items()))})
    except OSError as err:
        raise RunFailed(f"--dest {dest}: could not write {name} "
                        f"({err.strerror or err}); every lesson there is whole: free some space, "
                        "then run again") from None
    return report


def _status(target: Path, content: bytes, written_sha: Optional[str]) -> str:
    if not target.exists():
        return "written"
    current = _sha256(target.read_bytes())
    if current == _sha256(content):
        return "unchanged"
    return "updated" if current == written_sha else "kept"


def _read_manifest(dest: Path) -> Dict[str, str]:
    try:
        return dict(json.loads((dest / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no manifest: every existing file counts as the learner's


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
