"""06.port_holder where IPv6's loopback is missing (some containers): the checker then
starts IPv4 listeners only, and a stale answer is caught by the holders after them; and
the holders' connections keep their local ports to themselves."""
from __future__ import annotations

import os
import shutil

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


PORT_SHARED = """
import socket, subprocess, sys
import psutil
from kosmoss.exercises.lesson06 import holder

away = socket.socket()  # a listener off the ephemeral range: the others connect to it
away.bind(("127.0.0.1", 5000))
away.listen()
with holder("hungup") as (pid, port):
    kept = []
    for _ in range(3):  # each needs a local port of its own among the range's three
        try:
            kept.append(socket.create_connection(("127.0.0.1", 5000)))
        except OSError:
            break
    print(sorted((c.status, c.pid == pid) for c in psutil.net_connections(kind="tcp")
                 if c.laddr and c.laddr.port == port))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="a network namespace of its own needs root and iproute2")
def test_the_holders_connection_keeps_its_port_to_itself():
    """An outgoing connection may share its local port with others of other destinations:
    in CI a wrong answer (status != ESTABLISHED) met a TIME_WAIT socket, owned by no process,
    on the CLOSE_WAIT holder's port, and passed on its None. In a namespace of three
    ephemeral ports, the holder's listener and connection take two, and connections to
    elsewhere must not share the holder's."""
    import subprocess
    import sys

    namespace = f"kosmoss-test-ports-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        inside = ["ip", "netns", "exec", namespace]
        subprocess.run(inside + ["ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(inside + ["sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40002"],
                       check=True)
        done = subprocess.run(inside + [sys.executable, "-c", PORT_SHARED], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "[('CLOSE_WAIT', True)]", done.stdout
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)


def test_a_holder_whose_port_someone_else_has_too_is_started_again(monkeypatch):
    """An IPv6 listener on ::1 may get a port number an IPv4 TIME_WAIT socket (no owner)
    has too: in CI the answer "any TCP socket on that port" then read None for the IPv6
    holder and was told the wrong thing. Such a holder is replaced by another."""
    import psutil

    said = iter([True, False])
    monkeypatch.setattr(lesson06, "_shared", lambda port, pid: next(said))
    with lesson06.holder("tcp") as (pid, port):
        listening = [c for c in psutil.net_connections(kind="tcp")
                     if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
        assert [c.pid for c in listening] == [pid]
        assert len([p for p in psutil.process_iter(["cmdline"]) if lesson06.HOLDER in
                    (p.info["cmdline"] or [])]) == 1  # the first one has ended
    assert next(said, "used") == "used"
