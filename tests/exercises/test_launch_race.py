"""The distributed checker's watcher reads each rank's count of finished tasks, then asks
whether the rank has ended. A rank that finished its last task and exited between the two
was taken for one that died early: "the checker's process 1 exited with ..." against an
answer it should have judged, the rank's last line gloo's at the teardown (seen once, 2
cores)."""
import pickle

import pytest

from kosmoss.exercises import distributed
from kosmoss.exercises.distributed import Task


class _Tail:
    by_task: dict = {}

    def last_line(self) -> str:
        return "Connection closed by peer: typically caused by a remote worker"


class _FinishesBetweenCountAndPoll:
    """A rank on its last task at the first count, gone (its count written) at the poll."""

    def __init__(self, scratch, rank: int, total: int) -> None:
        self.scratch, self.rank, self.total = scratch, rank, total

    def poll(self):
        distributed._write(self.scratch, self.rank, [None] * self.total)
        return 1  # torch's gloo teardown, as its peers leave first


def test_a_rank_that_finished_and_left_between_count_and_poll_is_no_failure(tmp_path):
    tasks = [Task(0, "x.a", "", 2), Task(1, "x.b", "", 2)]
    for rank in (0, 1):
        distributed._write(tmp_path, rank, [None] * (len(tasks) - rank))  # rank 1: one behind
    ranks = [_FinishesBetweenCountAndPoll(tmp_path, 0, len(tasks)),
             _FinishesBetweenCountAndPoll(tmp_path, 1, len(tasks))]
    tails = [(_Tail(), _Tail()) for _ in ranks]
    assert distributed._watch(ranks, tails, tasks, tmp_path, exercise_s=5) is None


class _Ended:
    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self):
        return self.code


class _Said:
    by_task: dict = {}

    def __init__(self, line: str) -> None:
        self.line = line

    def last_line(self) -> str:
        return self.line


PEER = "[enforce fail at gloo/transport/tcp/pair.cc] Connection closed by peer [127.0.0.1]:5"


def test_of_ranks_ended_together_the_cause_is_named_not_the_peers_it_took_down():
    """A rank killed (the OOM killer, the learner's os.kill) takes gloo's peers down with
    it within milliseconds: the watcher, seeing both gone, names the killed one."""
    tails = [(_Said(""), _Said(PEER)), (_Said(""), _Said(""))]
    assert distributed._ended([_Ended(1), _Ended(-9)], [0, 0], 1, tails) == (1, -9)
    exited = [(_Said(""), _Said(PEER)), (_Said(""), _Said("ValueError: mine")),
              (_Said(""), _Said(PEER))]
    assert distributed._ended([_Ended(1), _Ended(1), _Ended(1)], [0, 0, 0], 1, exited) == (1, 1)
    assert distributed._ended([_Ended(1), _Ended(1)], [0, 0], 1,
                              [(_Said(""), _Said(PEER))] * 2) == (0, 1)  # no better guess
    assert distributed._ended([_Ended(1), _Ended(0)], [1, 0], 1, tails) == (1, 0)  # 0 finished


def test_the_ranks_meet_on_the_port_rank_0_was_given_by_the_kernel(tmp_path):
    """No port is picked free beforehand (another launch, or a connection's local port,
    could take it before rank 0 binds it): rank 0 listens on port 0 and writes down the
    port it got; the others read it."""
    first = distributed._meet(tmp_path, 0, 2)
    assert int((tmp_path / "port").read_text()) == first.port > 0
    second = distributed._meet(tmp_path, 1, 2)
    second.set("from rank 1", "seen")
    assert first.get("from rank 1") == b"seen"


def test_a_rank_whose_rank_0_never_wrote_its_port_gives_up_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "START_ALLOWANCE_S", 0.3)
    with pytest.raises(SystemExit, match="rank 0 did not start its store within"):
        distributed._meet(tmp_path, 1, 2)


def test_outcomes_are_appended_and_only_those_counted_are_read(tmp_path):
    """Each rank appends its new outcomes after a task and then writes its count: what the
    checker reads is every counted outcome, in order, and never the half-written one of a
    rank that died while appending."""
    outcomes = [distributed.Outcome("ok", [step] * 3) for step in range(4)]
    distributed._write(tmp_path, 0, [])
    assert distributed._read(tmp_path, 0) == []
    for finished in range(1, 4):
        distributed._write(tmp_path, 0, outcomes[:finished])
    assert distributed._read(tmp_path, 0) == outcomes[:3]
    with open(tmp_path / "rank0.pkl", "ab") as half_written:
        half_written.write(pickle.dumps(outcomes[3])[:5])
    assert distributed._read(tmp_path, 0) == outcomes[:3]
    assert distributed._read(tmp_path, 1) == []  # a rank that never started
