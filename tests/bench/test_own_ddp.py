"""Lesson 9b's benchmark (kosmoss.bench.own_ddp): the wrappers it times end with torch
DDP's weights at 2 and 3 ranks, each all-reduces what it should, a wrong wrapper is seen,
the figures it derives follow from what the ranks measured, and over hosts with a link of
a set rate the all-reduces take the link's time."""
from __future__ import annotations

import statistics

import pytest
import torch

from kosmoss.bench import own_ddp
from kosmoss.launch import hosts
from kosmoss.lessons import on_ranks
from kosmoss.run.lightning_private import bucket_assignment

SMALL = own_ddp.Setup(layers=(48, 32, 32, 8), batch=8, steps=2, warmup=1, replays=2,
                      bucket_cap_mb=4000 / 2 ** 20)


def test_bucket_bytes_are_ddps_own_assignment_at_the_same_cap():
    for setup in (own_ddp.Setup(), SMALL, own_ddp.Setup(layers=(512,) * 9)):
        parameters = list(reversed(list(setup.model().parameters())))
        cap = int(setup.bucket_cap_mb * 1024 * 1024)
        buckets, _ = bucket_assignment([p.detach() for p in parameters], [cap, cap])
        expected = [sum(4 * parameters[i].numel() for i in bucket) for bucket in buckets]
        assert own_ddp.bucket_bytes(setup) == expected


def test_the_course_mlp_has_its_first_layer_in_the_last_bucket():
    buckets = own_ddp.bucket_bytes(own_ddp.Setup())
    assert len(buckets) == 2 and buckets[-1] > 4 * 4128 * 100  # the first layer's weight


def test_the_lessons_settings_skip_the_link_where_no_hosts_can_be_made():
    with_hosts = own_ddp.lesson_settings(None, quick=True)
    assert [link for _, link in with_hosts.values()] == [None, own_ddp.LINK, own_ddp.LINK]
    without = own_ddp.lesson_settings("needs root", quick=True)
    assert list(without) == ["course MLP, loopback", "equal layers, loopback"]
    assert all(link is None for _, link in without.values())
    assert without["equal layers, loopback"][0] == with_hosts[f"equal layers, {own_ddp.LINK} "
                                                              "link"][0]
    assert own_ddp.lesson_settings(None, quick=False)["course MLP, loopback"][0].steps > \
        with_hosts["course MLP, loopback"][0].steps


def _figures(step_ms, alone_ms, finish_ms):
    """What read() returns, from per-variant (per-rank per-step steps, alone, finishes)."""
    return {name: {"step_s": [[t / 1e3 for t in rank] for rank in step_ms[name]],
                   "finish_s": [[t / 1e3 for t in rank] for rank in finish_ms[name]],
                   "alone_s": [a / 1e3 for a in alone_ms[name]],
                   "all_reduce_elements": [[1] * count] * 2}
            for name, count in zip(own_ddp.VARIANTS, (0, 2, 1, 8, 2))}


def test_summary_takes_the_slowest_rank_of_each_step_and_derives_hidden():
    steps = {"model alone": [[2, 9, 2], [3, 3, 3]], "torch DDP": [[6, 6, 6], [7, 5, 8]],
             "flat": [[8, 8, 8], [8, 8, 8]], "overlap": [[9, 9, 9], [9, 9, 9]],
             "buckets": [[5, 5, 5], [5, 5, 5]]}
    finish = {name: [[1, 1, 1], [2, 1, 1]] for name in own_ddp.VARIANTS}
    alone = {"model alone": [0, 0], "torch DDP": [2, 4], "flat": [4, 5], "overlap": [6, 6],
             "buckets": [3, 3]}
    table = own_ddp.summary(_figures(steps, alone, finish))
    compute = statistics.median([3, 9, 3])  # the slowest rank of each step
    assert table["model alone"]["step_s"] == pytest.approx(compute / 1e3)
    assert table["flat"]["hidden_s"] == pytest.approx((compute + 5 - 8) / 1e3)
    assert table["flat"]["exposed_s"] == pytest.approx(1 / 1e3)  # median of 2, 1, 1
    assert [table[name]["all_reduces"] for name in own_ddp.VARIANTS[1:]] == [2, 1, 8, 2]
    ddp = table["torch DDP"]
    assert ddp["step_s"] == pytest.approx(7 / 1e3)
    assert ddp["exposed_s"] == pytest.approx((7 - compute) / 1e3)  # DDP waits in backward
    assert ddp["alone_s"] == pytest.approx(4 / 1e3)  # its own replay, the slowest rank's
    assert table["buckets"]["alone_s"] == pytest.approx(3 / 1e3)
    assert ddp["hidden_s"] == pytest.approx((compute + 4 - 7) / 1e3)


def _wrong_wrappers():
    """The course's, with a FlatDDP that forgets to all-reduce."""
    wrappers = dict(own_ddp.course_wrappers())

    class Silent(wrappers["flat"]):
        def finish_gradient_synchronization(self):
            pass

    wrappers["flat"] = Silent
    return wrappers


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_wrapper_ends_with_ddps_weights_and_all_reduces_what_it_should(world_size,
                                                                             tmp_path):
    on_ranks(own_ddp.bench_rank, world_size, own_ddp.course_wrappers(), SMALL, tmp_path)
    figures = own_ddp.read(tmp_path, world_size)
    assert max(own_ddp.weight_gaps(tmp_path).values()) < 1e-6
    parameters = list(SMALL.model().parameters())
    elements = {name: figures[name]["all_reduce_elements"] for name in own_ddp.WRAPPERS}
    assert elements["flat"] == [[sum(p.numel() for p in parameters)]] * world_size
    assert elements["overlap"] == [[p.numel() for p in reversed(parameters)]] * world_size
    assert [4 * e for e in elements["buckets"][0]] == own_ddp.bucket_bytes(SMALL)
    ddp = figures["torch DDP"]["all_reduce_elements"]  # read from DDP after its rebuild
    assert ddp == elements["buckets"] and len(ddp[0]) > 1
    table = own_ddp.summary(figures)
    for name in own_ddp.VARIANTS[1:]:
        row = table[name]
        assert row["step_s"] > 0 and row["alone_s"] > 0
        assert len(figures[name]["step_s"][0]) == SMALL.steps


@pytest.mark.slow
def test_a_wrapper_that_does_not_reduce_is_seen(tmp_path):
    on_ranks(own_ddp.bench_rank, 2, _wrong_wrappers(), SMALL, tmp_path)
    gaps = own_ddp.weight_gaps(tmp_path)
    assert gaps["flat"] > 1e-3 and gaps["overlap"] < 1e-6 and gaps["buckets"] < 1e-6


@pytest.mark.slow
@pytest.mark.skipif(hosts.support_missing() is not None,
                    reason=f"no hosts here: {hosts.support_missing()}")
def test_over_hosts_the_all_reduce_takes_the_links_time(tmp_path):
    setup = own_ddp.Setup(layers=(512, 512, 8), batch=8, steps=2, warmup=1, replays=2)
    rate = hosts.parse_rate("100mbit", "--link-rate")
    with hosts.host_set(2, rate, purpose="test own_ddp") as made:
        on_ranks(own_ddp.bench_rank, 2, own_ddp.course_wrappers(), setup, tmp_path, made)
    figures = own_ddp.read(tmp_path, 2)
    gradient_bytes = 4 * sum(p.numel() for p in setup.model().parameters())
    link_s = gradient_bytes / (rate / 8)  # a ring of 2 sends the buffer once each way
    assert min(figures["flat"]["alone_s"]) >= 0.8 * link_s
    assert max(own_ddp.weight_gaps(tmp_path).values()) < 1e-6
    assert torch.load(tmp_path / "weights-flat.pt").numel() == gradient_bytes // 4
