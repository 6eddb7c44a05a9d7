"""``kosmoss lessons``: copy the course into a working folder and say how to open it."""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from collections import Counter
from pathlib import Path

from ..core.commandline import command_main
from ..core.errors import UsageError

HELP = "copy the lessons (notebooks, the scripts they run, the documents they cite) into a working folder"
DEFAULT_DEST = Path("kosmoss-lessons")
# kosmoss is installed from its checkout, with the pinned CPU torch (README.md).
INSTALL_HINT = 'pip install torch==2.13.0 -e ".[lessons]" in the kosmoss checkout'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST,
                        help="working folder (default ./%(default)s); files you changed "
                             "there are never replaced")
    parser.add_argument("--prepare", action="store_true",
                        help="also prepare every dataset and cache the lessons use (once, "
                             "before the session; what is there is kept)")
    parser.add_argument("--site", type=Path, metavar="DIR",
                        help="instead of copying: build the course as a static web site in DIR "
                             "(one page per lesson with its outputs, the docs, an index)")
    parser.add_argument("--executed", type=Path, metavar="FOLDER",
                        help="with --site: publish the executed notebooks in FOLDER (.ipynb); "
                             "default: run every lesson first (the course's whole run time)")
    parser.set_defaults(command=lessons_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("lessons", help=HELP, description=HELP))


def lessons_command(args: argparse.Namespace) -> None:
    from ..lessons.course import bundle, copy_lessons, source_root, to_ipynb

    if args.executed is not None and args.site is None:
        raise UsageError("--executed FOLDER: only with --site DIR (the site to build from it)")
    if args.site is not None:
        from ..lessons.site import site_command

        site_command(args.site, args.executed)
        return

    has_jupytext = installed("jupytext")
    files = bundle(source_root(), to_ipynb if has_jupytext else None)
    report = copy_lessons(args.dest, files)
    counts = Counter(item.status for item in report)
    print(f"lessons in {args.dest.resolve()}: " + ", ".join(
        f"{counts[s]} {s}" for s in ("written", "updated", "unchanged", "kept") if counts[s]))
    for item in report:
        if item.status == "kept":
            print(f"  kept {item.name}: you changed it; move it away and run again to get "
                  "the shipped version")
    if not has_jupytext:
        print(f"  no .ipynb written, the .py sources instead: jupytext is missing ({INSTALL_HINT}, "
              "then run again)")
    if args.prepare:
        from ..lessons.site import prepare_for_lessons

        prepare_for_lessons()
    _print_how_to_open(args.dest)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _print_how_to_open(dest: Path) -> None:
    print("open them:")
    if not installed("jupyterlab"):
        print(f"  {INSTALL_HINT}")
    print(f"  cd {shlex.quote(str(dest))} && jupyter lab")


def main(argv=None) -> int:
    return command_main("kosmoss lessons", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
