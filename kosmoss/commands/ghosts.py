"""``kosmoss ghosts``: find ghost jobs of kosmoss runs (a dry run); ``--kill`` ends them.

    kosmoss ghosts                      # what outlived its run, who holds GPU memory
    kosmoss ghosts --port 29500         # who holds port 29500, and is it a ghost?
    kosmoss ghosts --kill               # end the ghosts of your kosmoss runs
    kosmoss ghosts --kill --pid 4242    # end this process of yours, kosmoss or not
    kosmoss ghosts --stacks             # and where each one is stuck (py-spy), before --kill
"""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.commandline import command_main
from ..core.errors import RunFailed, UsageError
from ..ghosts.end import DEFAULT_GRACE_S, check_grace, end_ghosts
from ..ghosts.find import Ghost, find_ghosts, human_bytes
from ..launch.ports import port_is_free

HELP = ("find ghost jobs: ranks that outlived their run, stuck rendezvous, GPU memory and port "
        "holders; --kill ends them")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="a JSON list, one object per process (pid, run_id, kind, reason, ...)")
    parser.add_argument("--kill", action="store_true",
                        help="end the ghosts of your kosmoss runs with their process trees "
                             "(SIGTERM, --grace, then SIGKILL); with --pid, the named processes")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL (default %(default)g)")
    parser.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                        help="only this process (repeatable); --kill ends it even if no kosmoss "
                             "run started it, if it is yours")
    parser.add_argument("--port", type=int, metavar="N",
                        help="only the processes listening on TCP port N")
    parser.add_argument("--stacks", action="store_true",
                        help="show where each one is (its Python stack, read with py-spy)")
    parser.set_defaults(command=ghosts_command)


def register(subparsers) -> None:
    add_arguments(subparsers.add_parser("ghosts", help=HELP, description=HELP))


def ghosts_command(args: argparse.Namespace) -> None:
    check_grace(args.grace)  # before anything is looked at, let alone ended
    if args.stacks:
        from ..diagnose.stacks import find_py_spy

        find_py_spy()
    ghosts = find_ghosts(port=args.port, pids=args.pid)
    stacks = _stacks(ghosts) if args.stacks else {}  # before --kill ends them
    report = end_ghosts(ghosts, args.grace) if args.kill else None
    if args.json:
        print(json.dumps([{**ghost.as_dict(), **_stack_json(stacks.get(ghost.pid))}
                          for ghost in ghosts], indent=2))
    else:
        _print_table(ghosts, args)
        _print_stacks(ghosts, stacks)
    if report is not None:
        print(report.summary(), file=sys.stderr if args.json else sys.stdout)
        if report.survived:
            raise RunFailed(f"{len(report.survived)} process(es) survived SIGKILL (stuck in the "
                            "kernel, state D?): pid " + ", ".join(map(str, report.survived)))


def _print_table(ghosts, args: argparse.Namespace) -> None:
    console = Console(highlight=False, soft_wrap=True)
    if args.port is not None and not ghosts:
        console.print(f"port {args.port}: " + ("free" if port_is_free(args.port) else
                                               "held by a process this user cannot see"))
        return
    if not ghosts:
        console.print("no ghost: no process of a kosmoss run outlived its run, and none holds "
                      "GPU memory")
        return
    table = Table(title="kosmoss ghosts" + (" (dry run)" if not args.kill else ""))
    for column in ("pid", "user", "why, and the command", "holds", "--kill"):
        table.add_column(column, overflow="fold")
    for ghost in ghosts:
        why = Text(f"{ghost.kind}: {ghost.reason}\n")
        for cause in ghost.causes:
            why.append(f"- {cause}\n", "bold")
        pid = "-" if ghost.pid is None else str(ghost.pid)  # a leftover host set has none
        table.add_row(pid, ghost.user, why.append(ghost.command[:120], "dim"),
                      _holds(ghost), _fate(ghost))
    console.print(table)
    killable = sum(ghost.killable for ghost in ghosts)
    if not args.kill and killable:
        console.print(f"dry run: the same command with --kill ends {killable} of these, "
                      "with their process trees")
    elif not args.kill:
        console.print("dry run: none of these is a ghost of your kosmoss runs; "
                      "`kosmoss ghosts --kill --pid PID` ends a process of yours")


def _stacks(ghosts) -> dict:
    """pid -> its stacks, read with py-spy (a ghost that is not Python, or not ours to trace,
    gets the reason as its error)."""
    from ..diagnose.runs import RunProcess
    from ..diagnose.stacks import ProcessStacks, StackError, dump

    found = {}
    for ghost in (g for g in ghosts if g.pid is not None):  # a leftover host set has none
        member = RunProcess(ghost.pid, ghost.create_time, "process", None, f"pid {ghost.pid}")
        try:
            found[ghost.pid] = ProcessStacks(member, dump(ghost.pid))
        except (StackError, UsageError) as err:
            found[ghost.pid] = ProcessStacks(member, error=str(err))
    return found


def _stack_json(stacks) -> dict:
    if stacks is None:
        return {}
    from ..diagnose.stacks import describe

    return {"stack": describe(stacks)[0] if not stacks.error else None,
            "stack_error": stacks.error, "threads": [t.as_dict() for t in stacks.threads]}


def _print_stacks(ghosts, stacks: dict) -> None:
    from ..diagnose.stacks import describe, thread_lines

    for ghost in ghosts:
        found = stacks.get(ghost.pid)
        if found is not None:
            print("\n".join([f"\npid {ghost.pid} ({ghost.kind}): {describe(found)[0]}",
                             *thread_lines(found)]))


def _holds(ghost: Ghost) -> str:
    held = []
    if ghost.gpu_memory_bytes is not None:
        gpus = ",".join(map(str, ghost.gpus))
        held.append(f"{human_bytes(ghost.gpu_memory_bytes)} on GPU {gpus}")
    if ghost.ports:
        held.append("port " + ", ".join(map(str, ghost.ports)))
    return "\n".join(held)


def _fate(ghost: Ghost) -> str:
    if ghost.ended is not None:
        return "ended" if ghost.ended else "still alive"
    return "yes" if ghost.killable else "with --pid" if ghost.mine else "never"


def main(argv=None) -> int:
    return command_main("kosmoss ghosts", HELP, add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
