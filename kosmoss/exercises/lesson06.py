"""Lesson 06 (ghost jobs): find which process holds a port, as a ghost holds MASTER_PORT.

    kosmoss check 06
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator, Tuple

from .core import Exercise, Mistake, failed, learner, passed

HOLDER_STATEMENT = """\
**Find which process holds a port.**

A ghost rank keeps `MASTER_PORT`: the next run fails with EADDRINUSE ("address already in use").
Write `port_holder(port)`: the pid (an integer) of the process *listening* on TCP port
`port` on this machine, or `None` when nobody listens there. Use `psutil` (its
`net_connections` lists every socket with its local address, status and pid). The
checker starts a process that listens on a free port and asks your function; then that
process ends while another one holds the same port number for UDP (which is no TCP
listener), and it asks again; then nobody holds it. A connection's local end, in any state
(ESTABLISHED, CLOSE_WAIT, ...), is no listener.
"""

HOLDER_SKELETON = """
import psutil


def port_holder(port):
    \"\"\"The pid listening on TCP `port`, or None.\"\"\"
    raise NotImplementedError("your code here")
"""

HOLDER_REFERENCE = """
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="tcp"):
        if (connection.laddr and connection.laddr.port == port
                and connection.status == psutil.CONN_LISTEN):
            return connection.pid
    return None
"""

HOLDER_WRONG = {
    "the remote end's port": Mistake("""
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="inet"):
        if connection.raddr and connection.raddr.port == port:
            return connection.pid
    return None
""", "local address (laddr)"),
    "this process": Mistake("""
import os


def port_holder(port):
    return os.getpid()
""", "os.getpid()"),
    "any socket on that port number": Mistake("""
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="inet"):
        if connection.laddr and connection.laddr.port == port:
            return connection.pid
    return None
""", "LISTEN state"),
    "whether, not who": Mistake("""
import psutil


def port_holder(port):
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))
""", "return the pid"),
    "the port, not the pid": Mistake("""
import psutil


def port_holder(port):
    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == "LISTEN":
            return connection.laddr.port
    return None
""", "that is the port"),
}

HOLDER = ("import socket, sys\n"
          "kind = socket.SOCK_DGRAM if sys.argv[1] == 'udp' else socket.SOCK_STREAM\n"
          "six = sys.argv[1] == 'tcp6'\n"  # IPv6's loopback, as TCPStore listens on '::'
          "s = socket.socket(socket.AF_INET6 if six else socket.AF_INET, kind)\n"
          "s.bind(('::1' if six else '127.0.0.1', int(sys.argv[2])))\n"
          "if kind == socket.SOCK_STREAM:\n"
          "    s.listen()\n"
          "if sys.argv[1] in ('client', 'hungup'):\n"  # a connection to that listener
          # Bound first, its port is its own: a connect() from anywhere else may share an
          # ephemeral port with a socket of another destination (TIME_WAIT ones, owned by
          # no process, listed first), and a wrong answer then passed on their None.
          "    c = socket.socket()\n"
          "    c.bind(('127.0.0.1', 0))\n"
          "    c.connect(s.getsockname())\n"
          "    held = (s, s.accept())\n"
          "    s = c\n"
          "if sys.argv[1] == 'hungup':\n"  # the listener's end closes: ours is in CLOSE_WAIT
          "    held[1][0].close()\n"
          "    c.recv(1)\n"  # b'' once the peer's FIN has come: CLOSE_WAIT for sure
          "print(s.getsockname()[1], flush=True)\n"
          "sys.stdin.read()\n")  # until the checker closes stdin (or dies)


@contextlib.contextmanager
def holder(kind: str, port: int = 0) -> Iterator[Tuple[int, int]]:
    """(pid, port) of a child that holds a port (``tcp``: listens; ``tcp6``: listens on
    IPv6's loopback; ``client``: the local end of a connection to a listener of its own, on
    another port; ``hungup``: the same, once that listener's end has closed) until the block
    ends."""
    for attempt in range(HOLDER_TRIES):
        child = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(port)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            held = int(child.stdout.readline())
            if port or attempt == HOLDER_TRIES - 1 or not _shared(held, child.pid):
                yield child.pid, held
                return
        finally:
            _end(child)


HOLDER_TRIES = 5


def _shared(port: int, pid: int) -> bool:
    """Whether a socket of someone else has this port number too: an IPv6 listener on ::1
    and an IPv4 connection may both have it, and TIME_WAIT ones belong to no process. An
    answer that takes the first socket listed would read theirs (once in CI: None)."""
    import psutil

    return any(c.laddr and c.laddr.port == port and c.pid != pid
               for c in psutil.net_connections(kind="inet"))


def _end(child: subprocess.Popen) -> None:
    child.stdin.close()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def holder_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "port_holder")
    listeners = ("tcp", "tcp6") if _ipv6_loopback() else ("tcp",)
    for listener in listeners:  # tcp6: as torchrun's TCPStore listens on '::' where it can
        with holder(listener) as (pid, port):
            got = mine(port)
            if got != pid or isinstance(got, bool):
                over = " over IPv6 (::1)" if listener == "tcp6" else ""
                stale = bool(over) and got is None and _misses_new_listeners(mine)
                hint = (": yours found the first listener but not one started after it — "
                        + STALE) if stale else _holder_hint(got, pid, port, ipv6=bool(over))
                return failed(f"pid {pid} listens on TCP port {port}{over}; your "
                              f"port_holder({port}) returned {got!r}" + hint)
    for kind in ("udp", "client"):  # sockets on a port that are no TCP listener
        with holder(kind, port if kind == "udp" else 0) as (other_pid, other_port):
            got = mine(other_port)
            if got is not None:
                return failed(_not_a_listener(kind, pid, other_pid, other_port, got))
    with holder("hungup") as (other_pid, other_port):  # nor a connection in CLOSE_WAIT
        got = mine(other_port)
        if got is not None:
            return failed(_not_a_listener("hungup", pid, other_pid, other_port, got))
    after = mine(port)
    if after is not None:
        return failed(f"once pid {pid} and the holders after it have ended nobody holds port "
                      f"{port}, but your port_holder({port}) returned {after!r}"
                      + (f": {STALE}" if after == pid else ""))
    return passed(f"found pid {pid} on TCP port {port}; nobody once it had ended, a UDP "
                  "socket on the same number and a connection's local port, established "
                  "and in CLOSE_WAIT, included")


STALE = ("a list of connections kept from an earlier call is stale once processes start or "
         "end: ask psutil on every call")


def _misses_new_listeners(mine) -> bool:
    """Whether the answer misses an IPv4 listener started now too (it lists the connections
    once), rather than IPv6 listeners only."""
    with holder("tcp") as (pid, port):
        return mine(port) != pid


def _ipv6_loopback() -> bool:
    """Whether this machine can listen on IPv6's loopback (some containers cannot)."""
    import socket

    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def _not_a_listener(kind: str, pid: int, other_pid: int, port: int, got) -> str:
    if got == pid:  # the listener that has ended: a listing from an earlier call
        return f"pid {pid} has ended, but your port_holder({port}) still returned it: " + STALE
    if kind == "udp":
        return (f"pid {pid} has ended; pid {other_pid} holds port {port} for UDP, which is no "
                f"TCP listener, but your port_holder({port}) returned {got!r}: only a TCP "
                "socket in the LISTEN state holds MASTER_PORT for the next run")
    if kind == "hungup":
        return (f"pid {other_pid} has a TCP connection in CLOSE_WAIT (its peer hung up) whose "
                f"local end is port {port}, but nobody listens on it; your "
                f"port_holder({port}) returned {got!r}: a connection is no listener in any "
                "state — test status == LISTEN, not status != ESTABLISHED")
    return (f"pid {other_pid} has a TCP connection whose local end is port {port}, but nobody "
            f"listens on it; your port_holder({port}) returned {got!r}: a connection's end is "
            "no listener — only a socket in the LISTEN state holds MASTER_PORT")


def _holder_hint(got, pid: int, port: int, ipv6: bool = False) -> str:
    import os

    if isinstance(got, bool):
        return ": return the pid of the listener, not whether someone listens"
    if got == os.getpid():
        return (": that is the checker's own process (os.getpid()) — ask psutil who holds "
                "the port")
    if got == port:
        return ": that is the port — return the listening process's pid"
    if got is None and ipv6:
        return (": an IPv6 listener is a TCP listener too — torchrun's store listens on '::' "
                "where it can; ask psutil for kind='tcp' (IPv4 and IPv6), not 'tcp4'")
    if got is None:
        return (": nobody found — compare the port with each socket's local address (laddr), "
                "the listening end; raddr is the other end of a connection")
    return ""


EXERCISES = [
    Exercise("06.port_holder", HOLDER_STATEMENT, HOLDER_SKELETON, HOLDER_REFERENCE,
             HOLDER_WRONG, holder_judge, names=("port_holder",),
             forbidden=("kosmoss.ghosts", "kosmoss.launch")),
]
