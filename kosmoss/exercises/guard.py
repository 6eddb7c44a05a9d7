"""No passing by import: a cell that calls the reference it is asked to write is told so.

Each exercise lists what it is checked against (``Exercise.forbidden``): module prefixes
such as ``kosmoss.scaling``, or functions of torch that are built-in (a zero-argument
callable returns them). Two looks, because a ``from X import f`` binds ``f`` before any
patch could reach it:

- before running the cell, its source: an import (or a module's name in a string, as
  ``importlib.import_module`` takes it) of a listed module, or of the checkers' own
  ``kosmoss.exercises``, whose references and measurements are the answers;
- while the learner's code runs, every call (``sys.setprofile``): a Python function
  defined in a listed module, or a listed built-in, called from anywhere in it.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import sys
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

CHECKERS = "kosmoss.exercises"  # every exercise's references, measurements and checkers
IMPORTING = ("<module>", "__getattr__", "__dir__")  # what an import runs: no call of a reference
Forbidden = Union[str, Callable[[], object]]
_ACTIVE: contextvars.ContextVar[Tuple[Forbidden, ...]] = contextvars.ContextVar(
    "kosmoss_exercise_forbidden", default=())


class UsedReference(Exception):
    """The learner's code called (or imported) what the checker compares it with."""


def verdict_for(what: str) -> str:
    return (f"your cell uses {what}, which this exercise is checked against: write the "
            "computation yourself, as the statement describes it")


@contextlib.contextmanager
def guarding(forbidden: Sequence[Forbidden]) -> Iterator[None]:
    """While the block runs, :func:`tripwire` watches for ``forbidden`` (the judging code
    sets it; ``learner()`` and ``run_cell`` read it)."""
    token = _ACTIVE.set(tuple(forbidden))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def imported_reference(source: str, forbidden: Sequence[Forbidden] = ()) -> Optional[str]:
    """The first listed module (or built-in) the cell's source imports or names."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # running the cell reports it, with its line
    prefixes = _prefixes(forbidden) + (CHECKERS,)
    builtins = {getattr(obj, "__name__", None) for obj in _objects(forbidden)} - {None}
    for node in ast.walk(tree):
        for name in _names(node):
            if _within(name, prefixes) or name.rsplit(".", 1)[-1] in builtins:
                return name
    return None


@contextlib.contextmanager
def tripwire() -> Iterator[List[str]]:
    """Record every call to a forbidden function while the block runs; the caller raises
    :class:`UsedReference` afterwards (raising from a profile function would be swallowed
    into a confusing error in the learner's code)."""
    forbidden = _ACTIVE.get()
    hits: List[str] = []
    if not forbidden:
        yield hits
        return
    prefixes, objects = _prefixes(forbidden), {id(obj): obj for obj in _objects(forbidden)}

    def watch(frame, event, arg):
        if hits:
            return
        if event == "call" and frame.f_code.co_qualname not in IMPORTING:
            module = frame.f_globals.get("__name__") or ""
            if _within(module, prefixes):
                hits.append(f"{module}.{frame.f_code.co_qualname}")
        elif event == "c_call" and id(arg) in objects:
            hits.append(f"{getattr(arg, '__module__', '')}.{getattr(arg, '__name__', arg)}")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield hits
    finally:
        sys.setprofile(previous)


def raise_if_hit(hits: List[str]) -> None:
    if hits:
        raise UsedReference(verdict_for(hits[0]))


def _names(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value


def _within(name: str, prefixes: Tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def _prefixes(forbidden: Sequence[Forbidden]) -> Tuple[str, ...]:
    return tuple(item for item in forbidden if isinstance(item, str))


def _objects(forbidden: Sequence[Forbidden]) -> list:
    return [item() for item in forbidden if not isinstance(item, str)]
