"""The faults made for real on 2 CPU ranks (gloo), with tiny_run.py:

- rank 1 does 40 ms more CPU work per step: ``kosmoss watch --once`` shows both ranks
  advancing and flags rank 1 as the straggler (rank 0 waits for it in the all-reduce);
- then rank 1 sleeps inside training_step: ``kosmoss stacks`` names it the odd one out and
  rank 0 waiting in DDP's all-reduce; ``watch`` says the run is stuck;
- a rank that never reaches the start-up check is named, the run exits 1 within the
  timeout and the stacks of both ranks are in the run directory.
Each wait is on a marker (a heartbeat, a file), never a fixed sleep."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diagnose_helpers import end_all, start_tiny_run, wait_until
from helpers import STARTUP_TIMEOUT_S
from kosmoss import cli
from kosmoss.diagnose.runs import read_heartbeats

pytestmark = pytest.mark.slow
RUN_ID = "20260101-120000-slow01"
START_S = STARTUP_TIMEOUT_S  # two ranks importing torch and Lightning, maybe at load 10


def _training(run_dir: Path) -> bool:
    beats = read_heartbeats(run_dir)
    return sorted(beats) == [0, 1] and all(
        b["state"] == "train" and b["busy_ms"] is not None for b in beats.values())


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    home = tmp_path_factory.mktemp("diagnose-home")
    run_dir, log, go = home / "runs" / RUN_ID, home / "log.txt", home / "sleep-now"
    proc = start_tiny_run(run_dir, home, log, "--slow-rank", "1", "--slow-ms", "40",
                          "--sleep-when", str(go))
    try:
        wait_until(lambda: _training(run_dir), START_S, "both ranks' heartbeats", log)
        yield {"home": home, "run_dir": run_dir, "log": log, "go": go}
    finally:
        end_all(home, [proc])


@pytest.fixture
def home_of(straggler, monkeypatch):
    monkeypatch.setenv("KOSMOSS_HOME", str(straggler["home"]))
    return straggler


def _json(capsys, *args) -> dict:
    assert cli.main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_watch_shows_both_ranks_advancing_and_flags_the_slow_one(home_of, capsys):
    first = _json(capsys, "watch", "--once", "--json")  # the newest live run
    assert first["run_id"] == RUN_ID and [r["rank"] for r in first["ranks"]] == [0, 1]
    assert all(r["pid"] and r["rss_bytes"] > 0 and r["cpu_percent"] is not None
               for r in first["ranks"])

    def advanced():
        snap = _json(capsys, "watch", RUN_ID, "--once", "--json")
        steps = [(a["step"], b["step"]) for a, b in zip(first["ranks"], snap["ranks"])]
        return snap if all(later > before for before, later in steps) else None

    snap = wait_until(advanced, 60, "both ranks' steps to advance", home_of["log"])
    assert snap["stragglers"] == [1], snap["ranks"]
    fast, slow = snap["ranks"]
    assert slow["busy_ms"] >= 40 and "works" in slow["why"][0] and not fast["why"]
    assert fast["wait_ms"] > slow["wait_ms"]  # rank 0 waits for rank 1 in the all-reduce
    assert cli.main(["watch", RUN_ID, "--once"]) == 0
    assert "* rank 1 is a straggler: works" in capsys.readouterr().out


def test_stacks_name_the_sleeping_rank_and_the_collective_of_the_other(home_of, capsys,
                                                                         tmp_path):
    run_dir = home_of["run_dir"]
    home_of["go"].touch()
    wait_until((run_dir / "sleeping-rank-1").exists, 60, "rank 1 to sleep", home_of["log"])

    def rank0_waits():  # rank 0 reaches the all-reduce a moment after rank 1 stops
        dump = _json(capsys, "stacks", "--json")
        by_rank = {g["members"][0]["rank"]: g for g in dump["groups"]}
        return by_rank if by_rank[0]["waits_in_collective"] else None

    by_rank = wait_until(rank0_waits, 60, "rank 0 to wait in the all-reduce", home_of["log"])
    assert "all_reduce" in by_rank[0]["summary"] and "backward" in by_rank[0]["summary"]
    assert not by_rank[0]["odd_one_out"] and by_rank[1]["odd_one_out"]
    assert "`time.sleep(0.5)` in TinyModel.training_step" in by_rank[1]["summary"]

    out = tmp_path / "stacks.txt"
    assert cli.main(["stacks", RUN_ID[:12], "--native", "--out", str(out)]) == 0
    text = out.read_text()
    (odd,) = [line for line in text.splitlines() if "odd one out" in line]
    assert odd.startswith("rank 1 (pid") and "training_step" in odd
    assert "c10d::Reducer::finalize_backward" in text  # where DDP waits, in native frames
    assert cli.main(["stacks", "--out", str(out)]) == 2  # never overwritten
    assert f"--out {out}: exists" in capsys.readouterr().err

    def stuck():
        return "stuck" in " ".join(_json(capsys, "watch", "--once", "--json", "--stale", "2")
                                   ["notes"])

    wait_until(stuck, 30, "both heartbeats to go stale")


def test_a_rank_that_never_arrives_is_named_and_the_stacks_written(tmp_path):
    home = tmp_path / "home"
    run_dir, log = home / "runs" / "20260101-120000-absent", tmp_path / "log.txt"
    proc = start_tiny_run(run_dir, home, log, "--absent-rank", "1", "--startup-timeout", "5")
    try:
        code = proc.wait(timeout=START_S)
    finally:
        end_all(home, [proc])
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert "rank 1 did not reach the start-up check within 5 s" in out
    stacks = Path(re.search(r"stacks of the run in (\S+)", out).group(1))
    assert stacks.parent == run_dir / "stacks" and stacks.with_suffix(".json").exists()
    text = stacks.read_text()
    (rank1,) = [line for line in text.splitlines() if line.startswith("rank 1 (pid")]
    assert "TinyData.setup" in rank1 and "odd one out" in rank1
    (rank0,) = [line for line in text.splitlines() if line.startswith("rank 0 (pid")]
    assert "monitored_barrier" in rank0
    # Rank 1 got stuck when rank 0 reached the check (both right after Lightning's
    # "pre_setup" barrier): 5 s of check, then py-spy on two processes.
    stuck = (run_dir / "absent-rank-1").stat().st_mtime
    assert 5 <= stacks.stat().st_mtime - stuck < 5 + 25
    assert read_heartbeats(run_dir)[0]["state"] == "failed"
