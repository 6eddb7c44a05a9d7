"""A rank stopped with SIGSTOP is named as stopped everywhere a user looks: ``kosmoss watch``
(its process state from /proc; the other rank sleeping in a collective), ``kosmoss stacks``
(stopped, its stack read without pausing it, the odd one out; not "py-spy failed") and the
one line the run ends with after --collective-timeout. Waits on heartbeats, never sleeps."""
import json
import signal

import psutil
import pytest
from fault_helpers import end_all, exit_code, run_dir, start, stderr_of, trained, wait_for

from kosmoss import cli
from kosmoss.diagnose.runs import read_heartbeats

TIMEOUT_S = 20  # the window in which watch and stacks look at the stopped rank


def _json(capsys, *args):
    assert cli.main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_stopped_rank_is_named_by_watch_stacks_and_the_timeout(shared_home, tmp_path,
                                                                 monkeypatch, capsys):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-processes", "2", "--hidden",
                     "16", "--max-steps", "100000", "--collective-timeout", str(TIMEOUT_S))
    try:
        wait_for(lambda: trained(home, 2, 30), "30 steps on both ranks")
        folder = run_dir(home)
        rank1 = read_heartbeats(folder)[1]["pid"]
        psutil.Process(rank1).send_signal(signal.SIGSTOP)
        monkeypatch.setenv("KOSMOSS_HOME", str(home))

        def rank0_waits():
            snap = _json(capsys, "watch", folder.name, "--once", "--json")
            by_rank = {view["rank"]: view for view in snap["ranks"]}
            return snap if by_rank[0]["process"] == "sleeping in a collective" else None

        snap = wait_for(rank0_waits, "rank 0 to sleep in a collective", timeout=TIMEOUT_S)
        zero, one = sorted(snap["ranks"], key=lambda view: view["rank"])
        assert one["process"] == "stopped" and snap["stragglers"] == [1], snap
        assert f"`kill -CONT {rank1}`" in one["why"][0] and zero["waits_in"], zero
        assert "rank 0 sleep(s) in a collective, waiting for rank 1" in snap["notes"]

        dump = _json(capsys, "stacks", folder.name, "--json")
        (stopped,) = [g for g in dump["groups"] if g["members"][0]["pid"] == rank1]
        assert stopped["state"] == "stopped" and stopped["odd_one_out"], stopped
        summary = stopped["summary"]
        assert summary.startswith("stopped (state T") and "py-spy failed" not in summary
        assert "), at " in summary, summary  # where it stopped: its stack, read as it stands

        assert exit_code(home, launcher, timeout=TIMEOUT_S + 120) == 1
        err = stderr_of(home)
        lines = [line for line in err.splitlines() if line.startswith("trainup_cpu.py:")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert f"--collective-timeout): rank 1 (pid {rank1}) is stopped (state T" in lines[0]
    finally:
        end_all(home, launcher)
