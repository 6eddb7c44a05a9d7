"""Lesson 06 (ghost jobs): find which process holds a port, as a ghost holds MASTER_PORT.

    kosmoss check 06
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator, Tuple

from .core import Exercise, failed, learner, passed

HOLDER_STATEMENT = """\
**Find which process holds a port.**

A ghost rank keeps `MASTER_PORT`: the next run fails with "Address already in use".
Write `port_holder(port)`: the pid of the process *listening* on TCP port `port` on this
machine, or `None` when nobody listens there. Use `psutil` (its `net_connections`
lists every socket with its local address, status and pid). The checker starts a
process that listens on a free port, asks your function, and asks again once that
process has ended.
"""

HOLDER_SKELETON = '''
import psutil


def port_holder(port):
    """The pid listening on TCP `port`, or None."""
    raise NotImplementedError("your code here")
'''

HOLDER_REFERENCE = '''
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="inet"):
        if (connection.laddr and connection.laddr.port == port
                and connection.status == psutil.CONN_LISTEN):
            return connection.pid
    return None
'''

HOLDER_WRONG = {
    "the remote end's port": '''
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="inet"):
        if connection.raddr and connection.raddr.port == port:
            return connection.pid
    return None
''',
    "this process": '''
import os


def port_holder(port):
    return os.getpid()
''',
}

LISTENER = ("import socket, sys, time\n"
            "s = socket.socket()\n"
            "s.bind(('127.0.0.1', 0))\n"
            "s.listen()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "sys.stdin.read()\n")  # until the checker closes stdin (or dies)


@contextlib.contextmanager
def listener() -> Iterator[Tuple[int, int]]:
    """(pid, port) of a child that listens on a free port until the block ends."""
    child = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        yield child.pid, port
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def holder_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "port_holder")
    with listener() as (pid, port):
        got = mine(port)
        if got != pid:
            return failed(f"pid {pid} listens on port {port}; your port_holder({port}) "
                          f"returned {got!r}")
    after = mine(port)
    if after is not None:
        return failed(f"once pid {pid} has ended nobody listens on port {port}, but your "
                      f"port_holder({port}) returned {after!r}")
    return passed(f"found pid {pid} on port {port}, and nobody once it had ended")


EXERCISES = [
    Exercise("06.port_holder", HOLDER_STATEMENT, HOLDER_SKELETON, HOLDER_REFERENCE,
             HOLDER_WRONG, holder_judge, names=("port_holder",)),
]
