"""docs/cli.md, generated from the argparse parsers themselves.

    python scripts/cli_reference.py > docs/cli.md   # write it
    python scripts/cli_reference.py --check         # exit 1, naming the first stale command

The parsers are the real ones: trainup_cpu.py's and trainup_gpu.py's as their ``main()``
builds them, and ``kosmoss.cli.build_parser()`` with every subcommand under it. The usage
lines are formatted here, not by argparse, so the text depends neither on the terminal's
width nor on the Python version's help formatter. Nothing imports torch.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cli.md"
SCRIPTS = ("trainup_cpu.py", "trainup_gpu.py")
WIDTH = 88  # usage lines wrap here

HEADER = """\
# Command-line reference

Every flag of `trainup_cpu.py`, `trainup_gpu.py` and each `kosmoss` subcommand, with its
help text, default and choices. Generated from the parsers themselves by
`python scripts/cli_reference.py > docs/cli.md`: do not edit it by hand.
`python scripts/cli_reference.py --check` and `tests/test_cli_reference.py` fail when it
is stale. The same text, per command, is `--help`.

Bad input, for every command: one line on stderr naming the flag or file and what to do,
and exit code 2. The training scripts' other exit codes (0, 1, and after a signal):
[reliability.md](reliability.md), "Exit codes".
"""


class _Built(Exception):
    """Carries the parser a script's main() built, out of its parse_args()."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def script_parser(path: Path) -> argparse.ArgumentParser:
    """The parser ``main()`` of a trainup script builds: its own ``build_parser()`` if it
    has one, else caught at ``parse_args`` (the script's code runs exactly as written)."""
    spec = importlib.util.spec_from_file_location(f"_cli_reference_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "build_parser"):
        return module.build_parser()
    base = module.OneLineParser

    class Capturing(base):
        def parse_args(self, args=None, namespace=None):
            raise _Built(self)

    module.OneLineParser = Capturing
    try:
        module.main([])
    except _Built as built:
        built.parser.__class__ = base  # parses again, as the script's own parser does
        return built.parser
    raise RuntimeError(f"{path.name}: main() never parsed its arguments")


def kosmoss_parser() -> argparse.ArgumentParser:
    from kosmoss.cli import build_parser

    return build_parser()


def parsers() -> List[argparse.ArgumentParser]:
    """The top-level parsers, in the order docs/cli.md shows them."""
    return [script_parser(REPO / name) for name in SCRIPTS] + [kosmoss_parser()]


# ---------------------------------------------------------------- walking the parsers


def _actions(parser: argparse.ArgumentParser) -> list:
    return parser._actions  # argparse has no public list of a parser's arguments


def _is_subcommands(action: argparse.Action) -> bool:
    return action.nargs == argparse.PARSER


def walk(parser: argparse.ArgumentParser,
         summary: Optional[str] = None) -> Iterator[Tuple[argparse.ArgumentParser, Optional[str]]]:
    """The parser, then every subcommand's parser under it, depth first, in the order
    they were registered; each with the one-line help its parent lists it with."""
    yield parser, summary
    for action in _actions(parser):
        if _is_subcommands(action):
            helps = {choice.dest: choice.help
                     for choice in getattr(action, "_choices_actions", [])}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a subcommand already shown
                    continue
                seen.add(id(sub))
                yield from walk(sub, helps.get(name))


# ---------------------------------------------------------------- formatting


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None and not _is_subcommands(action):
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _arguments(action: argparse.Action) -> str:
    """What follows a flag (or stands for a positional), as argparse spells it."""
    if _is_subcommands(action):  # a metavar (kosmoss's COMMAND) as argparse shows it
        return (action.metavar or "{" + ",".join(action.choices) + "}") + " ..."
    if action.nargs == 0:
        return ""
    meta = _metavar(action)
    if action.nargs is None:
        return meta
    if action.nargs == argparse.OPTIONAL:
        return f"[{meta}]"
    if action.nargs == argparse.ZERO_OR_MORE:
        return f"[{meta} ...]"
    if action.nargs == argparse.ONE_OR_MORE:
        return f"{meta} [{meta} ...]"
    if action.nargs == argparse.REMAINDER:
        return "..."
    return " ".join([meta] * action.nargs)


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS


def usage(parser: argparse.ArgumentParser) -> str:
    """``usage: prog [-h] [--flag X] ... positional``, wrapped at WIDTH."""
    parts = []
    for action in _actions(parser):
        if not _shown(action):
            continue
        if action.option_strings:
            text = " ".join(filter(None, [action.option_strings[0], _arguments(action)]))
            parts.append(text if action.required else f"[{text}]")
    parts += [_arguments(action) for action in _actions(parser)
              if not action.option_strings and _shown(action)]
    first = f"usage: {parser.prog}"
    indent = " " * (len(first) + 1) if len(first) < WIDTH // 2 else " " * 6
    lines, line = [], first
    for part in parts:
        if len(line) + 1 + len(part) > WIDTH and line.strip():
            lines.append(line)
            line = indent + part
        else:
            line = f"{line} {part}"
    lines.append(line)
    return "\n".join(lines)


def _plain(text) -> str:
    return " ".join(str(text).split())


def _cell(text: str) -> str:
    return _plain(text).replace("|", "\\|")


def _value(value) -> str:
    value = getattr(value, "value", value)  # kosmoss.run.flags.Default wraps a default
    if isinstance(value, (list, tuple)):
        return " ".join(str(item) for item in value)
    return str(value)


def help_text(action: argparse.Action, prog: str) -> str:
    """The help as ``--help`` shows it (``%(default)s`` and the like filled in)."""
    if not action.help:
        return ""
    params = {name: value for name, value in vars(action).items()
              if value is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return action.help % params  # as argparse expands it


def default_text(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""  # a switch, or no default of its own (the help says what happens)
    shown = _value(action.default)
    return f"`{_cell(shown)}`" if shown else ""


def flag_name(action: argparse.Action) -> str:
    arguments = _arguments(action)
    if not action.option_strings:
        return f"`{arguments}`"
    return ", ".join(f"`{option} {arguments}`" if arguments else f"`{option}`"
                     for option in action.option_strings)


def flag_table(parser: argparse.ArgumentParser) -> str:
    rows = ["| flag | what it does | default | choices |", "|---|---|---|---|"]
    for action in _actions(parser):
        if not _shown(action) or _is_subcommands(action) or action.dest == "help":
            continue
        choices = "" if action.choices is None \
            else _cell(", ".join(f"`{choice}`" for choice in action.choices))
        rows.append(f"| {_cell(flag_name(action))} | {_cell(help_text(action, parser.prog))} "
                    f"| {default_text(action)} | {choices} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def subcommand_list(parser: argparse.ArgumentParser) -> str:
    lines = []
    for action in _actions(parser):
        if _is_subcommands(action):
            for choice in getattr(action, "_choices_actions", []):
                lines.append(f"- `{parser.prog} {choice.dest}`: {_plain(choice.help or '')}")
    return "\n".join(lines)


def section(parser: argparse.ArgumentParser, summary: Optional[str], seen: dict) -> str:
    """One command: its heading, what it does, usage, then its flags."""
    parts = [f"## `{parser.prog}`"]
    about = parser.description or summary
    if about:
        parts.append(_plain(about))
    parts.append(f"```text\n{usage(parser)}\n```")
    subcommands = subcommand_list(parser)
    if subcommands:
        parts.append(subcommands)
    table = flag_table(parser)
    if table and table in seen:
        parts.append(f"Flags: the same as `{seen[table]}` above.")
    elif table:
        seen[table] = parser.prog
        parts.append(table)
    return "\n\n".join(parts) + "\n"


def sections(top: Optional[List[argparse.ArgumentParser]] = None) -> List[Tuple[str, str]]:
    """(command, its markdown) for every command, in order; the header first, as ''."""
    seen: dict = {}
    found = [("", HEADER)]
    for parser in (parsers() if top is None else top):
        for each, summary in walk(parser):
            found.append((each.prog, section(each, summary, seen)))
    return found


def render(top: Optional[List[argparse.ArgumentParser]] = None) -> str:
    return "\n".join(text for _, text in sections(top))


def first_difference(expected: List[Tuple[str, str]], actual_text: str) -> Optional[str]:
    """The first command whose section of ``actual_text`` differs from ``expected``, as a
    one-line description; None when they are equal."""
    if "\n".join(text for _, text in expected) == actual_text:
        return None
    rest = actual_text
    for command, text in expected:
        if rest.startswith(text):
            rest = rest[len(text):].removeprefix("\n")
            continue
        name = f"`{command}`" if command else "the header"
        if command and f"## `{command}`\n" not in actual_text:
            return f"{name} is missing"
        have = rest.splitlines()
        for number, line in enumerate(text.splitlines()):
            found = have[number] if number < len(have) else ""
            if found != line:
                return (f"{name} differs: the parsers give {line.strip()[:60]!r} where the "
                        f"page has {found.strip()[:60]!r}")
        return f"{name} differs"
    return "there is text after the last command"


def check(doc: Path = DOC, top=None) -> int:
    expected = sections(top)
    actual = doc.read_text() if doc.exists() else ""
    difference = first_difference(expected, actual)
    if difference is None:
        return 0
    print(f"{doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc} is stale: "
          f"{difference}; regenerate it: python scripts/cli_reference.py > docs/cli.md",
          file=sys.stderr)
    return 1


def main(argv=None, out: Callable[[str], object] = sys.stdout.write) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming the first command whose docs/cli.md text is stale")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    out(render())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # the trainup scripts import kosmoss from the checkout
    sys.exit(main())
