"""The mechanism behind :mod:`kosmoss.exercises`: the catalogue, and running a learner's
cell. Judging it (in this process or in gloo ranks) is :mod:`.judging`.

An :class:`Exercise` is judged in one of two ways:

- in one process: ``judge(namespace)`` calls the learner's functions through
  :func:`learner` and returns :func:`passed` or :func:`failed`;
- in gloo processes (``rank_task`` set), at each of ``world_sizes`` (2, 3 and 4: at 2 a
  ring has one step and "divide by 2" is "divide by the world size"): every rank runs the
  cell's source and ``rank_task(namespace, rank, world_size)``; ``judge(per_rank_results)``
  then decides, once per world size (:mod:`kosmoss.exercises.distributed`).

Each exercise carries a catalogue of plausible mistakes (:class:`Mistake`, at least four):
the tests run every one at every world size and check that the verdict names it.
"""
from __future__ import annotations

import importlib
import operator
import re
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ..core.errors import UsageError
from .guard import Forbidden, raise_if_hit, tripwire

LESSON_MODULES = {"01": "lesson01", "02": "lesson02", "03": "lesson03", "metrics": "metrics",
                  "04": "lesson04", "05": "lesson05", "06": "lesson06", "07": "lesson07",
                  "08": "lesson08", "08b": "lesson08b", "09": "lesson09", "09b": "lesson09b",
                  "10": "lesson10", "11": "lesson11", "12": "lesson12"}
# Lesson 3b's exercises carry the lab's own key, "metrics" (its notebook's name holds it).
LESSON_ALIASES = {"03b": "metrics"}
MARKER = re.compile(r"^#\s*exercise:\s*(\S+)\s*$")
CORRECT, WRONG, ERROR = "correct", "wrong", "error"
WORLD_SIZES = (2, 3, 4)  # a distributed exercise runs at each: see the module's docstring


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer: the cell body, a phrase the checker's message must hold
    (it names the mistake), and the world sizes where it is wrong (None: all of them; a
    hard-coded world size of 2 is right at 2)."""

    body: str
    says: str
    wrong_at: Optional[Tuple[int, ...]] = None


@dataclass(frozen=True)
class Exercise:
    id: str  # "<lesson>.<name>"
    statement: str  # markdown; its first line is the summary `--list` prints
    skeleton_body: str  # the cell the learner starts from, without the marker line
    reference: str  # a correct cell body
    wrong: Dict[str, Union[str, Mistake]]  # name -> a wrong answer the checker must reject
    judge: Callable[..., Tuple[bool, str]]
    rank_task: Optional[Callable[[dict, int, int], Any]] = None  # set: runs in gloo ranks
    names: Tuple[str, ...] = field(default=())  # what the cell must define
    world_sizes: Tuple[int, ...] = WORLD_SIZES  # where rank_task runs
    forbidden: Tuple[Forbidden, ...] = ()  # what it is checked against (kosmoss.exercises.guard)

    @property
    def lesson(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]

    @property
    def distributed(self) -> bool:
        return self.rank_task is not None

    @property
    def title(self) -> str:
        return self.statement.strip().splitlines()[0].lstrip("#* ").rstrip("*")

    @property
    def mistakes(self) -> Dict[str, Mistake]:
        """The catalogue, every entry a :class:`Mistake` (a bare body says nothing)."""
        return {name: entry if isinstance(entry, Mistake) else Mistake(entry, "")
                for name, entry in self.wrong.items()}

    def wrong_at(self, name: str) -> Tuple[int, ...]:
        """World sizes where mistake ``name`` gives a wrong answer ((0,): not distributed)."""
        if not self.distributed:
            return (0,)
        return self.mistakes[name].wrong_at or self.world_sizes

    @property
    def skeleton(self) -> str:
        return self.cell(self.skeleton_body)

    @property
    def checker_cell(self) -> str:
        return f'from kosmoss.exercises import check; check("{self.id}", globals())'

    def cell(self, body: str) -> str:
        """A whole exercise cell: the marker line, then ``body``."""
        return f"# exercise: {self.id}\n{textwrap.dedent(body).strip()}\n"


@dataclass(frozen=True)
class Verdict:
    exercise_id: str
    status: str  # correct | wrong | error
    message: str
    # (world size, passed, message) of each world size judged, for a distributed exercise
    per_world_size: Tuple[Tuple[int, bool, str], ...] = ()

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    @property
    def line(self) -> str:
        return f"{self.status}: {self.exercise_id} — {self.message}"

    def as_dict(self) -> dict:
        return {"exercise": self.exercise_id, "status": self.status, "message": self.message}


def passed(message: str) -> Tuple[bool, str]:
    return True, message


def failed(message: str) -> Tuple[bool, str]:
    return False, message


class NotAnswered(Exception):
    """The learner's function still raises NotImplementedError, or is missing."""


class LearnerRaised(Exception):
    """The learner's code raised: the message names the error and the line of the cell;
    ``original`` is what it raised (a checker that asks for a refusal reads it)."""

    def __init__(self, message: str, original: Optional[BaseException] = None):
        super().__init__(message)
        self.original = original


def learner(namespace: Dict[str, Any], name: str) -> Callable:
    """The learner's function ``name``, wrapped so that what it raises becomes a verdict
    (and not a traceback out of the checker)."""
    function = namespace.get(name)
    if function is None:
        raise NotAnswered(f"your cell does not define `{name}`: run the exercise cell first")
    if not callable(function):
        raise NotAnswered(f"`{name}` is a {type(function).__name__}, not a function")

    def call(*args, **kwargs):
        try:
            with tripwire() as hits:
                result = function(*args, **kwargs)
        except NotImplementedError:
            raise NotAnswered(f"not answered yet: `{name}` still raises "
                              "NotImplementedError") from None
        except (Exception, SystemExit) as err:  # sys.exit() in a cell ends no checker
            raise LearnerRaised(describe_error(err, _code_file(function)), err) from None
        raise_if_hit(hits)
        return result

    call.raw = function
    return call


def describe_error(err: BaseException, cell_file: Optional[str] = None) -> str:
    """``ValueError: ... (line 4 of your cell)`` for an error raised by the learner."""
    if isinstance(err, SyntaxError):
        return f"your cell has a {type(err).__name__}: {err.msg} (line {err.lineno})"
    where = ""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if cell_file is None or f.filename == cell_file]
    if frames:
        where = f" (line {frames[-1].lineno} of your cell)"
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"your code raised {type(err).__name__}{': ' + text if text else ''}{where}"


def number(value: Any) -> Optional[float]:
    """A learner's answer as a float (Python, numpy or 0-d torch number), else None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def is_tensor(value: Any) -> bool:
    """A torch tensor; torch is not imported for it (a learner who returned one has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


# A 0-d tensor compares equal to its number, so a check of the value alone lets it through.
TENSOR_HINT = ("a tensor, not a Python number: .item() (or .tolist()) gives the number — "
               "printed, logged or put in an environment variable a tensor reads tensor(3), "
               "and json refuses it")


def number_hint(value: Any, otherwise: str) -> str:
    """TENSOR_HINT for a tensor, else the caller's own hint."""
    return TENSOR_HINT if is_tensor(value) else otherwise


def is_integer(value: Any) -> bool:
    """A count as a learner may return it: int or numpy's integers; not 4128.0, not True, not
    tensor(3) (which has __index__, but reads "tensor(3)" as text)."""
    if is_tensor(value):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return not isinstance(value, bool)


def show(value: Any) -> str:
    """A learner's answer as a message shows it: numbers to 6 significant digits."""
    if isinstance(value, bool) or number(value) is None or isinstance(value, str):
        return repr(value)
    return f"{number(value):.6g}"


def _code_file(function: Callable) -> Optional[str]:
    code = getattr(function, "__code__", None)
    return code.co_filename if code else None


# ---------------------------------------------------------------- the catalogue


def catalogue(lesson: Optional[str] = None) -> List[Exercise]:
    lessons = LESSON_MODULES if lesson is None else {lesson: module_name(lesson)}
    found = []
    for key, module in lessons.items():
        found += importlib.import_module(f"{__package__}.{module}").EXERCISES
    return found


def lesson_key(lesson: str) -> str:
    """The catalogue's key for what a learner typed: 3 is 03, 03b (or 3b) lesson 3b's lab;
    anything else as typed, so that an unknown lesson is named as the learner wrote it."""
    typed = lesson.lower()  # 3B is lesson 3b, as a learner may type it
    padded = "0" + typed if re.fullmatch(r"\d[a-z]?", typed) else typed
    key = LESSON_ALIASES.get(padded, padded)
    return key if key in LESSON_MODULES else lesson


def lesson_choices() -> str:
    """The lessons in course order, as a learner types them ("03b", not the lab's key)."""
    typed = {key: alias for alias, key in LESSON_ALIASES.items()}
    return ", ".join(typed.get(key, key) for key in LESSON_MODULES)


def module_name(lesson: str) -> str:
    if lesson not in LESSON_MODULES:
        raise UsageError(f"unknown lesson {lesson!r}: choose one of "
                         f"{lesson_choices()} (kosmoss check --list shows them all)")
    return LESSON_MODULES[lesson]


def find(exercise_id: str) -> Exercise:
    lesson, _, name = exercise_id.partition(".")
    for exercise in catalogue(lesson):
        if exercise.name == name:
            return exercise
    names = ", ".join(e.name for e in catalogue(lesson))
    raise UsageError(f"unknown exercise {exercise_id!r}: lesson {lesson} has {names}")


def notebook_glob(lesson: str) -> str:
    module = importlib.import_module(f"{__package__}.{module_name(lesson)}")
    return getattr(module, "NOTEBOOK_GLOB", f"{lesson}_*")


# ---------------------------------------------------------------- judging


def seeded_namespace() -> Dict[str, Any]:
    """What a cell run on its own starts with: the imports every lesson makes anyway."""
    import math

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    return {"__name__": "__exercise__", "math": math, "np": np, "torch": torch,
            "dist": dist, "nn": nn}


def cell_filename(exercise: Exercise) -> str:
    return f"<exercise {exercise.id}>"


def run_cell(exercise: Exercise, source: str) -> Dict[str, Any]:
    """Execute a cell alone in a fresh namespace; raises LearnerRaised if it raises or
    does not define what the exercise asks for."""
    namespace, filename = seeded_namespace(), cell_filename(exercise)
    try:
        code = compile(source, filename, "exec")
        with tripwire() as hits:
            exec(code, namespace)
    except NotImplementedError:
        raise NotAnswered("not answered yet: your cell raises NotImplementedError") from None
    except (Exception, SystemExit) as err:
        raise LearnerRaised(describe_error(err, filename), err) from None
    raise_if_hit(hits)
    missing = [name for name in exercise.names if not callable(namespace.get(name))]
    if missing:
        defined = sorted(k for k, v in namespace.items()
                         if callable(v) and getattr(v, "__module__", None) == "__exercise__")
        raise LearnerRaised(f"your cell does not define `{missing[0]}` (it defines "
                            f"{', '.join(f'`{n}`' for n in defined) or 'no function'}): "
                            f"the exercise asks for {', '.join(f'`{n}`' for n in exercise.names)}")
    return namespace


def marked_id(source: str) -> Optional[str]:
    """The exercise id of a cell whose first line is ``# exercise: <id>``."""
    first = source.lstrip("\n").split("\n", 1)[0]
    match = MARKER.match(first.strip())
    return match.group(1) if match else None
