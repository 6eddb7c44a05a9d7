"""06.port_holder where IPv6's loopback is missing (some containers): the checker then
starts IPv4 listeners only, and a stale answer is caught by the holders after them."""
from __future__ import annotations

import pytest
from test_fresh_wrong_answers import FRESH

from kosmoss.exercises import lesson06
from kosmoss.exercises.core import CORRECT, WRONG, find, run_cell
from kosmoss.exercises.judging import verdict

STALE_ANSWER = next(body for exercise_id, name, body, *_ in FRESH
                    if name == "the connections listed once, on the first call")


def _judged(body: str):
    exercise = find("06.port_holder")
    return verdict(exercise, lambda: exercise.judge(run_cell(exercise, exercise.cell(body))))


@pytest.fixture
def no_ipv6(monkeypatch):
    monkeypatch.setattr(lesson06, "_ipv6_loopback", lambda: False)


def test_without_ipv6_the_reference_passes(no_ipv6):
    result = _judged(lesson06.HOLDER_REFERENCE)
    assert result.status == CORRECT, result.line


def test_without_ipv6_a_stale_listing_is_named_by_the_udp_holder(no_ipv6):
    result = _judged(STALE_ANSWER)
    assert result.status == WRONG, result.line
    assert "has ended, but your port_holder" in result.message, result.line
    assert "ask psutil on every call" in result.message, result.line


def test_an_ipv4_only_answer_is_not_told_its_listing_is_stale():
    ipv4_only = next(body for _, name, body, *_ in FRESH if name == "IPv4 listeners only")
    if not lesson06._ipv6_loopback():
        pytest.skip("this machine cannot listen on ::1: the checker starts no IPv6 listener")
    result = _judged(ipv4_only)
    assert result.status == WRONG and "not 'tcp4'" in result.message, result.line
    assert "stale" not in result.message, result.line
