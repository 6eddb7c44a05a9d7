"""What every kosmoss command line shares: one-line errors and exit codes."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Mapping, Optional

from .errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, RunFailed, UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before an error; users get one line."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def run_command(prog: str, command: Callable[[], object],
                flag_names: Optional[Mapping[str, str]] = None) -> int:
    """Bad input -> one line on stderr and exit 2, a configuration field named by its flag
    (``flag_names``); a failure during the run -> one line, exit 1. The ranks an external
    launcher started all find the same bad input: the first rank of each node says it."""
    try:
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
    return EXIT_OK


# A launcher's variables: (its rank on this node, a variable only its ranks have).
LAUNCHED_RANKS = (("LOCAL_RANK", "TORCHELASTIC_RUN_ID"), ("SLURM_LOCALID", "SLURM_PROCID"),
                  ("HOROVOD_LOCAL_RANK", "HOROVOD_RANK"),
                  ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK"))


def _say(line: str) -> None:
    if not _another_rank_on_this_node_speaks():
        print(line, file=sys.stderr)


def _another_rank_on_this_node_speaks() -> bool:
    return any(os.environ.get(local, "0").strip() not in ("0", "") and marker in os.environ
               for local, marker in LAUNCHED_RANKS)


def command_main(prog: str, description: str, add_arguments: Callable, argv=None) -> int:
    """``main()`` of one subcommand module, so each can also run on its own."""
    parser = OneLineParser(prog=prog, description=description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(prog, lambda: args.command(args), getattr(args, "flag_names", None))
