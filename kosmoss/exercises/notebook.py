"""Reading a learner's notebook (only reading: it is never written) and finding its
exercise cells.

    kosmoss check 03 --notebook kosmoss-lessons/03_data_parallelism.ipynb
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from ..core.errors import UsageError
from ..core.files import read_regular
from .core import Exercise, marked_id, notebook_glob

INSTALL_HINT = 'in kosmoss\'s checkout: pip install torch==2.13.0 -e ".[lessons]"'
WORKING_FOLDER = Path("kosmoss-lessons")  # `kosmoss lessons`' default --dest
MANIFEST = ".kosmoss-lessons.json"  # what `kosmoss lessons` writes in its working folder
NOTEBOOK_MAX_BYTES = 256 * 2**20  # a lesson with its figures is a few MiB


def default_notebook(lesson: str, cwd: Path | None = None) -> Path:
    """The lesson's copy in the working folder: the current folder if ``kosmoss lessons``
    wrote it, else ``./kosmoss-lessons``; of ``.ipynb`` and ``.py``, the one saved last."""
    here = Path.cwd() if cwd is None else cwd
    folder = here if (here / MANIFEST).is_file() else here / WORKING_FOLDER
    pattern = notebook_glob(lesson)
    copies = [p for suffix in (".ipynb", ".py") for p in folder.glob(pattern + suffix)]
    if not copies:
        raise UsageError(f"no copy of lesson {lesson} in {folder}: run `kosmoss lessons` "
                         "there first, or give --notebook PATH")
    # Saved last wins; on a tie the .ipynb, the file JupyterLab saves.
    return max(copies, key=lambda p: (p.stat().st_mtime, p.suffix == ".ipynb"))


def code_cells(path: Path) -> List[str]:
    """The source of every code cell of a notebook, ``.ipynb`` or jupytext ``.py``."""
    try:
        text = read_regular(path, NOTEBOOK_MAX_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise UsageError(f"--notebook {path}: no such file; give the lesson's .ipynb or .py") \
            from None
    except (OSError, ValueError) as err:  # a folder, a FIFO, /dev/zero: never read whole
        raise UsageError(f"--notebook {path}: {getattr(err, 'strerror', None) or err}; give "
                         "the lesson's .ipynb or .py") from None
    try:
        import jupytext
    except ImportError:
        raise UsageError(f"reading a notebook needs jupytext: {INSTALL_HINT}") from None
    try:
        notebook = jupytext.reads(text, fmt=path.suffix.lstrip(".") or "py")
        # jupytext does not validate: {} or {"cells": [5]} fail on reading the cells.
        sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
        if not all(isinstance(source, str) for source in sources):
            raise TypeError("a code cell's source is not text")
    except Exception as err:  # jupytext and nbformat raise many kinds for a broken file
        raise UsageError(f"--notebook {path}: cannot read it as a notebook "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                         ")") from None
    return sources


def exercise_cell(cells: List[str], exercise: Exercise, path: Path) -> str:
    """The learner's cell for ``exercise``: the last one marked with its id (a learner who
    copied the cell to try again means the newer try)."""
    marked = [source for source in cells if marked_id(source) == exercise.id]
    if not marked:
        raise UsageError(f"{exercise.id}: {path} has no cell whose first line is "
                         f"`# exercise: {exercise.id}`; add it back (kosmoss check --list "
                         "shows the exercises) or give --notebook PATH")
    return marked[-1]
