"""``run(config)``: prepare, then train and report, with this process's run record around
them; or, for simulated nodes, start the node processes that do it."""
from __future__ import annotations

import json
from typing import Callable

from pytorch_lightning.utilities import rank_zero_only
from rich.console import Console

from .. import launch, records
from ..data.store import verify_checksums
from ..errors import RunFailed
from .config import RunConfig
from .plan import RunPlan, prepare
from .report import report
from .train import train

__all__ = ["run", "prepare", "train", "report"]


def say(message: str) -> None:
    """Print once per run: from global zero only (Lightning's rank-zero rule)."""
    if rank_zero_only.rank == 0:
        Console(highlight=False, soft_wrap=True).print(message, markup=False)


def run(config: RunConfig, *, echo: Callable[[str], None] = say) -> dict:
    """Check everything, then train. Bad input raises a UsageError before anything is
    written (only a missing preset dataset is prepared)."""
    plan = prepare(config, log=echo)
    rank_zero_only.rank = plan.topology.global_rank  # Lightning sets the same, later
    if plan.topology.launcher is not launch.Launcher.SIMULATED_NODE:
        for line in plan.describe():  # the node processes' parent already said it all
            echo(line)
    if plan.is_global_zero:  # the last input check: from here on, things are written
        verify_checksums(plan.dataset, trust_unchanged=True)  # records in it what matched
    if plan.launches_nodes:
        return simulate(plan, echo)
    with records.recorded(plan.run_dir, kind=plan.topology.launcher.value,
                          global_rank=plan.topology.global_rank) as membership:
        outcome = train(plan)
        if outcome.stopped_by:
            membership.stopped()
        return report(plan, outcome, echo=echo)


def simulate(plan: RunPlan, echo: Callable[[str], None]) -> dict:
    """Start one process per simulated node, each running this same command."""
    with records.recorded(plan.run_dir, kind=plan.topology.launcher.value):  # marks the nodes
        code = launch.simulate_nodes(plan.topology, {records.RUN_ID_ENV: plan.run_id}, echo)
        if code != 0:
            raise RunFailed(f"a node process exited with code {code}; the other nodes were "
                            f"ended too (run {plan.run_id})")
    # Node 0's rank 0 wrote result.json (and --result-json, the same flags reached it).
    return json.loads((plan.run_dir / "result.json").read_text())
