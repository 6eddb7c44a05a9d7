"""``kosmoss check``: run a lesson's exercises from the learner's notebook and say, for
each, "correct" or what differs. The notebook is only read.

    kosmoss check --list                 # every lesson's exercises, one line each
    kosmoss check 03                     # every exercise of lesson 03
    kosmoss check 03 average_gradients   # one of them
    kosmoss check 03 --notebook my/03_data_parallelism.ipynb --json

Exit code 0: all correct; 1: one is wrong or not answered yet; 2: unknown lesson or
exercise, no marked cell, or a cell that raises, defines another name, runs past the
checker's time or ends its own process (one line naming the exercise; the other
exercises are still checked). See docs/exercises.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.commandline import command_main
from ..core.errors import RunFailed, UsageError

HELP = "check your answers to a lesson's exercises (--list shows them all)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lesson", nargs="?",
                        help="01 .. 12, 08b, 09b, or metrics (lesson 3b, the DDP-metrics lab; "
                             "03b works too); --list shows them")
    parser.add_argument("exercise", nargs="?",
                        help="one exercise of the lesson, e.g. average_gradients (default: all)")
    parser.add_argument("--notebook", type=Path,
                        help="the notebook to check, .ipynb or jupytext .py (default: the "
                             "lesson's copy in the working folder of `kosmoss lessons`)")
    parser.add_argument("--list", action="store_true", help="list every lesson's exercises")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.set_defaults(command=check_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("check", help=HELP, description=HELP))


def check_command(args: argparse.Namespace) -> None:
    from ..exercises.core import lesson_choices, lesson_key

    if args.lesson is not None:
        args.lesson = lesson_key(args.lesson)
    if args.list:
        return list_exercises(args.json, args.lesson)
    if args.lesson is None:
        raise UsageError(f"give a lesson ({lesson_choices()}), e.g. `kosmoss check 03`, "
                         "or --list")
    from ..exercises.core import catalogue, find
    from ..exercises.judging import judge_sources
    from ..exercises.notebook import code_cells, default_notebook, exercise_cell

    chosen = catalogue(args.lesson)
    if args.exercise:
        name = args.exercise.split(".", 1)[-1]
        chosen = [find(f"{args.lesson}.{name}")]
    path = args.notebook or default_notebook(args.lesson)
    cells = code_cells(path)
    items = [(exercise, exercise_cell(cells, exercise, path)) for exercise in chosen]
    verdicts = judge_sources(items)
    if args.json:
        print(json.dumps({"notebook": str(path), "results": [v.as_dict() for v in verdicts]},
                         indent=2))
    else:
        print(f"checking {path}")
        for verdict in verdicts:
            print(f"  {verdict.line}")
    _exit_status(verdicts)


def _exit_status(verdicts) -> None:
    errors = [v for v in verdicts if v.status == "error"]
    if errors:
        more = f" (and {', '.join(v.exercise_id for v in errors[1:])})" if errors[1:] else ""
        raise UsageError(f"{errors[0].exercise_id} — {errors[0].message}{more}")
    wrong = [v for v in verdicts if not v.correct]
    if wrong:
        raise RunFailed(f"{len(wrong)} of {len(verdicts)} exercise(s) not correct yet: "
                        f"{', '.join(v.exercise_id for v in wrong)}")


def list_exercises(as_json: bool, lesson: str | None = None) -> None:
    from ..exercises.core import catalogue

    exercises = catalogue(lesson)
    if as_json:
        print(json.dumps([{"id": e.id, "lesson": e.lesson, "title": e.title,
                           "defines": list(e.names), "distributed": e.distributed}
                          for e in exercises], indent=2))
        return
    width = max(len(e.id) for e in exercises)
    for exercise in exercises:
        sizes = [str(size) for size in exercise.world_sizes]
        where = (f" ({', '.join(sizes[:-1])} and {sizes[-1]} gloo processes)"
                 if exercise.distributed else "")
        print(f"{exercise.id:{width}s}  {exercise.title}{where}")


def main(argv=None) -> int:
    return command_main("kosmoss check", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
