"""How `kosmoss watch` names the rank the others wait for, from each rank's process state
(/proc: running, sleeping, stopped; py-spy: sleeping in a collective) and heartbeat age."""
from kosmoss.diagnose.watch import IN_A_COLLECTIVE, RankView, _flag_stragglers


def _view(rank, process, age, busy=3.0):
    return RankView(rank, 1000 + rank, f"rank {rank}", "train", step=500, heartbeat_age_s=age,
                    process=process, busy_ms=busy, steps_per_s=10.0)


def test_a_stopped_rank_is_flagged_however_fresh_its_heartbeat():
    views = [_view(0, IN_A_COLLECTIVE, 4.0), _view(1, "stopped", 4.0)]
    notes = _flag_stragglers(views, 0.3, 15.0)
    assert [v.rank for v in views if v.straggler] == [1]
    assert "`kill -CONT 1001`" in views[1].why[0]
    assert notes == ["rank 0 sleep(s) in a collective, waiting for rank 1"]


def test_when_every_heartbeat_is_stale_the_rank_outside_a_collective_is_named():
    views = [_view(0, IN_A_COLLECTIVE, 21.0), _view(1, "sleeping", 21.0, busy=52.0)]
    notes = _flag_stragglers(views, 0.3, 15.0)
    assert "the run is stuck" in notes[0]
    assert [v.rank for v in views if v.straggler] == [1]
    assert views[1].why == ["sleeping, not in a collective, while rank 0 wait(s) in one for it"]


def test_ranks_all_in_collectives_flag_nobody_but_say_the_run_is_stuck():
    views = [_view(0, IN_A_COLLECTIVE, 21.0), _view(1, IN_A_COLLECTIVE, 21.0)]
    notes = _flag_stragglers(views, 0.3, 15.0)
    assert not any(v.straggler for v in views) and "stuck" in notes[0]
