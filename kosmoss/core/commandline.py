"""What every kosmoss command line shares: one-line errors and exit codes."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator, List, Mapping, Optional

from .errors import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, Interrupted, RunFailed,
                     UsageError, name_too_long)
from .output import failed_on_stdout, silence_stdout, watched_stdout
from .signals import restore


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before an error; users get one line. An empty
    value (``--resume "$RUN"`` with RUN unset) is an error, not the default or the current
    folder: argparse would take it, and Path("") is ".", so it would be read as neither."""

    def add_argument(self, *args, **kwargs):
        if kwargs.get("action", "store") in VALUE_ACTIONS and kwargs.get("nargs") != \
                argparse.REMAINDER and kwargs.get("default") != "":
            kwargs["type"] = _not_empty(kwargs.get("type"))
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):
        _say(f"{self.prog}: error: {message} (see --help)")  # once a node, as run_command's
        self.exit(EXIT_USAGE)


VALUE_ACTIONS = ("store", "append", "extend")  # the actions that take a typed value


def _not_empty(convert: Optional[Callable]) -> Callable:
    def checked(text: str):
        if text == "":
            raise argparse.ArgumentTypeError("an empty value (an unset shell variable?); "
                                             "give one, or leave it out")
        return convert(text) if convert is not None else text

    # argparse names the type in its errors ("invalid int value"): keep the name.
    checked.__name__ = getattr(convert, "__name__", "str")
    return checked


def run_command(prog: str, command: Callable[[], object],
                flag_names: Optional[Mapping[str, str]] = None) -> int:
    """Bad input -> one line on stderr and exit 2, a configuration field named by its flag
    (``flag_names``); a failure during the run -> one line, exit 1. The ranks an external
    launcher started all find the same bad input: the first rank of each node says it."""
    out = None
    try:
        with watched_stdout() as out:
            command()
    except ConfigError as err:
        _say(f"{prog}: error: {err.in_terms_of(flag_names or {})}")
        return EXIT_USAGE
    except UsageError as err:
        _say(f"{prog}: error: {err}")
        return EXIT_USAGE
    except RunFailed as err:
        print(f"{prog}: failed: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as err:  # a name too long, wherever a command first looks it up
        if failed_on_stdout(err, out):  # `kosmoss env > /dev/full`: the user's output
            silence_stdout()
            _say(f"{prog}: error: standard output cannot be written ({err.strerror}): send "
                 "it to a terminal or a file that takes it")
            return EXIT_USAGE
        too_long = name_too_long(err)
        if too_long is None:
            raise
        _say(f"{prog}: error: {too_long}")
        return EXIT_USAGE
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM under stop_signals_unwind()
        stop = stop if isinstance(stop, Interrupted) else Interrupted()
        _say(f"{prog}: stopped by {signal.Signals(stop.signal_number).name}"
             + (f"; {stop.kept}" if stop.kept else ""))
        return stop.exit_code
    return EXIT_OK


UNWIND_S = 10.0  # ending what a command started: a row's grace period is 5 s


@contextlib.contextmanager
def stop_signals_unwind() -> Iterator[None]:
    """SIGTERM raises :class:`Interrupted` as Ctrl-C raises KeyboardInterrupt, so that a
    command's ``with`` blocks and ``finally`` clauses end what it started (a bench's row, a
    comm's ranks) instead of leaving them running when ``kill PID`` ends it. A signal again
    within UNWIND_S of the first is ignored: it would cut that ending short. A later one
    stops again (a library may have swallowed the first). The caller's handlers come back
    at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: List[float] = []

    def stop(number, frame):
        if first and time.monotonic() - first[0] < UNWIND_S:
            return
        first[:] = [time.monotonic()]
        raise Interrupted(number)

    previous = {name: signal.getsignal(name) for name in (signal.SIGINT, signal.SIGTERM)}
    for name, handler in previous.items():
        if handler is not signal.SIG_IGN:  # a job started with `&` ignores SIGINT: keep that
            signal.signal(name, stop)
    try:
        yield
    finally:
        restore(list(previous.items()))  # all of them, even when a late stop raises midway


# A launcher's variables: (its rank on this node, a variable only its ranks have).
LAUNCHED_RANKS = (("LOCAL_RANK", "TORCHELASTIC_RUN_ID"), ("SLURM_LOCALID", "SLURM_PROCID"),
                  ("HOROVOD_LOCAL_RANK", "HOROVOD_RANK"),
                  ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK"))


SPEAKER_WAIT_S = 20.0  # the rank that speaks checks the same input: seconds behind at most


def _say(line: str) -> None:
    if not _rank_that_stays_silent(os.environ) or not _the_rank_that_speaks_ended():
        print(line, file=sys.stderr)  # ... or this rank alone found it: nobody else would say it


def _rank_that_stays_silent(environment: Mapping[str, str]) -> bool:
    return any(environment.get(local, "0").strip() not in ("0", "") and marker in environment
               for local, marker in LAUNCHED_RANKS)


def _rank_that_speaks(environment: Mapping[str, str]) -> bool:
    # Not "some local rank is 0": torchrun inside an srun task has SLURM_LOCALID 0 on all.
    return (any(marker in environment for _, marker in LAUNCHED_RANKS)
            and not _rank_that_stays_silent(environment))


def _the_rank_that_speaks_ended() -> bool:
    """torchrun and srun end every rank of a node once one exits: a silent rank that exits
    first can have the rank that would say the line killed before it does (seen in CI,
    2026-11-28). So it exits after that rank, a sibling under the same launcher. False when
    that rank still runs after SPEAKER_WAIT_S: it did not find what this rank found."""
    import psutil  # here: a command that never fails this way does not pay for it

    speakers = []
    try:
        siblings = psutil.Process().parent().children()
    except (psutil.Error, AttributeError):  # no parent left to ask
        return True
    for sibling in siblings:
        try:
            if sibling.pid != os.getpid() and _rank_that_speaks(sibling.environ()):
                speakers.append(sibling)
        except psutil.Error:  # ended already, or not ours to read
            continue
    if threading.current_thread() is threading.main_thread():  # signal.signal's rule
        for name in (signal.SIGINT, signal.SIGTERM):  # the launcher ending it: end, silently
            signal.signal(name, signal.SIG_DFL)
    _, running = psutil.wait_procs(speakers, timeout=SPEAKER_WAIT_S)
    return not running


def command_main(prog: str, description: str, add_arguments: Callable, argv=None) -> int:
    """``main()`` of one subcommand module, so each can also run on its own."""
    parser = OneLineParser(prog=prog, description=description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(prog, lambda: args.command(args), getattr(args, "flag_names", None))
