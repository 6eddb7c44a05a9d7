"""docs/cli.md is what scripts/cli_reference.py generates from the parsers, and the
generator shows what a parser holds: a flag added to one appears, a stale page is named."""
from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys

import pytest

from helpers import REPO
from kosmoss.core.commandline import OneLineParser
from kosmoss.run.flags import add_run_flags

SCRIPT = REPO / "scripts" / "cli_reference.py"
FIX = "python scripts/cli_reference.py > docs/cli.md"


@pytest.fixture(scope="module")
def cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(cli_reference):
    return cli_reference.sections()


def test_docs_cli_md_is_what_the_parsers_generate(cli_reference, generated):
    actual = (REPO / "docs" / "cli.md").read_text()
    difference = cli_reference.first_difference(generated, actual)
    assert difference is None, f"docs/cli.md is stale: {difference}; regenerate it: {FIX}"


def test_every_command_has_its_section(generated):
    commands = [command for command, _ in generated]
    assert commands[:4] == ["", "trainup_cpu.py", "trainup_gpu.py", "kosmoss"]
    for name in ("data", "data prepare", "data info", "train", "bench", "ghosts", "env",
                 "lessons", "check", "comm", "project", "stacks", "watch", "hosts", "hosts up",
                 "hosts exec", "hosts status", "hosts down"):
        assert f"kosmoss {name}" in commands


def test_the_readme_names_every_subcommand_kosmoss_registers():
    from kosmoss.cli import build_parser

    subparsers = next(action for action in build_parser()._actions
                      if isinstance(action, argparse._SubParsersAction))
    readme = (REPO / "README.md").read_text()
    listed = re.findall(r"`(\w+)`", re.search(r"`kosmoss --help` lists the subcommands \(([^)]*)\)",
                                               readme).group(1))
    assert listed == list(subparsers.choices), "README.md's list of subcommands is stale"


def test_the_scripts_sections_come_from_their_real_parsers(cli_reference, generated):
    text = dict(generated)
    cpu, gpu = text["trainup_cpu.py"], text["trainup_gpu.py"]
    # what a GPU adds is in trainup_gpu.py's page only
    for flag in ("`--require-gpu`", "`--gpu-ids GPU_IDS`", "`--gpus NUM_PROCESSES`"):
        assert flag in gpu and flag not in cpu
    assert "| `--batch-size BATCH_SIZE` | global batch, split evenly over all processes " \
           "(default 256) | `256` |" in cpu
    assert "`--scale-lr {none,linear,sqrt}`" in cpu and "`none`, `linear`, `sqrt`" in cpu
    # the parser caught from main() is the one the script parses with
    parser = cli_reference.script_parser(REPO / "trainup_gpu.py")
    assert parser.parse_args(["--gpus", "2", "--gpu-ids", "0,1"]).num_processes == 2
    assert "Flags: the same as `trainup_cpu.py` above." in text["kosmoss train"]


def _demo_parser(extra: bool) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="demo.py", description="A demo launcher.")
    add_run_flags(parser)
    if extra:
        parser.add_argument("--topology-file", metavar="FILE", default="nodes.txt",
                            choices=["nodes.txt", "hosts.txt"],
                            help="where the nodes are listed (default %(default)s)")
    tools = parser.add_subparsers(dest="tool")
    inspect = tools.add_parser("inspect", help="look at a run")
    inspect.add_argument("run", nargs="?", help="run id")
    if extra:
        inspect.add_argument("--deep", action="store_true", help="every rank | every frame")
    return parser


def test_a_flag_added_to_a_parser_shows_up(cli_reference):
    before = cli_reference.render([_demo_parser(extra=False)])
    after = cli_reference.render([_demo_parser(extra=True)])
    row = ("| `--topology-file FILE` | where the nodes are listed (default nodes.txt) "
           "| `nodes.txt` | `nodes.txt`, `hosts.txt` |")
    assert row in after and "--topology-file" not in before
    assert "[--topology-file FILE]" in after  # in the usage too
    # in a subcommand, with a table's pipe escaped
    assert "## `demo.py inspect`" in after
    assert "| `--deep` | every rank \\| every frame |  |  |" in after
    assert "- `demo.py inspect`: look at a run" in after


def test_a_stale_page_names_the_first_command_that_differs(cli_reference):
    new = cli_reference.sections([_demo_parser(extra=True)])
    old = cli_reference.render([_demo_parser(extra=False)])
    difference = cli_reference.first_difference(new, old)
    assert difference.startswith("`demo.py` differs: the parsers give ") and "\n" not in difference
    assert cli_reference.first_difference(new, cli_reference.render([_demo_parser(True)])) \
        is None
    without = old.replace(old[old.index("## `demo.py inspect`"):], "")
    assert cli_reference.first_difference(cli_reference.sections([_demo_parser(False)]),
                                          without) == "`demo.py inspect` is missing"


def test_check_exits_1_with_one_line_naming_the_command(cli_reference, tmp_path, capsys):
    doc = tmp_path / "cli.md"
    doc.write_text(cli_reference.render())
    assert cli_reference.check(doc) == 0
    text = doc.read_text()
    bench = text.index("## `kosmoss bench`")
    doc.write_text(text[:bench] + text[bench:].replace("| `--quick` |", "| `--fast` |", 1))
    capsys.readouterr()
    assert cli_reference.check(doc) == 1
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "`kosmoss bench` differs" in message
    assert FIX in message


def test_the_text_does_not_depend_on_the_terminal(cli_reference, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference.render()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference.render() == narrow
    for line in narrow.splitlines():
        if line.startswith("usage:") or line.startswith("  "):
            assert len(line) <= cli_reference.WIDTH, line


def test_generating_imports_no_torch():
    code = ("import runpy, sys\n"
            "page = runpy.run_path('scripts/cli_reference.py')['render']()\n"
            "print('## `kosmoss watch`' in page, 'torch' in sys.modules, "
            "'pytorch_lightning' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["True", "False", "False"], done.stdout + done.stderr


def test_every_flag_of_every_command_refuses_an_empty_value(cli_reference):
    """``--resume "$RUN"`` with RUN unset once started a new run, ``--dest ""`` copied the
    lessons into the current folder (Path("") is "."): every value a command takes, typed
    empty, is one line instead (OneLineParser.add_argument)."""
    checked = []
    for top in cli_reference.parsers():
        for parser, _ in cli_reference.walk(top):
            for action in cli_reference._actions(parser):
                if action.nargs in (0, argparse.PARSER, argparse.REMAINDER) or \
                        isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                    continue  # switches, subcommands, `hosts exec -- COMMAND...`
                name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
                with pytest.raises(argparse.ArgumentTypeError, match="an empty value"):
                    action.type("")
                checked.append(name)
    assert "trainup_cpu.py --resume" in checked and "kosmoss stacks run" in checked, checked
    assert len(checked) > 100, checked
