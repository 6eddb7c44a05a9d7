"""MASTER_PORT: a free one for ranks kosmoss starts, and a busy one named with who holds
it before anything starts on it."""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import List, Optional, Tuple

import psutil

from ..core.errors import UsageError
from .topology import Launcher, Topology


TORCHRUN_PORT = 29500  # torchrun's default MASTER_PORT: `kosmoss ghosts` flags its holder
LOWEST_PICKED = 15000  # above the well-known services a machine may run


def free_port() -> int:
    """A port nobody listens on, for ranks that bind it seconds later (after importing torch).
    Picked below the kernel's ephemeral range, not by binding port 0 as Lightning's
    ``find_free_network_port`` does: meanwhile a connection's local port (gloo opens one per
    pair of ranks) is drawn from that range and could take it."""
    low, _ = ephemeral_ports()
    candidates = [port for port in range(LOWEST_PICKED, low) if port != TORCHRUN_PORT]
    for port in random.sample(candidates, min(len(candidates), 64)):
        if port_is_free(port):
            return port
    with socket.socket() as sock:  # a range made tiny, or all taken: the kernel picks
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> Tuple[int, int]:
    """The range the kernel draws connections' local ports from (Linux's default where unread)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def check_master_port(topology: Topology) -> None:
    """A MASTER_PORT the user set must be free before we start ranks on it, or they would
    fail with EADDRINUSE ("address already in use") one by one; name who holds it."""
    port = os.environ.get("MASTER_PORT")
    if port is None or not topology.launcher.starts_ranks:  # set but empty: not a port either
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"MASTER_PORT {port!r} is not a TCP port: unset it (kosmoss picks a "
                         "free one) or give a number from 1 to 65535")
    if not port_is_free(int(port)):
        raise UsageError(f"MASTER_PORT {port} is busy, {port_holder(int(port))}: end that "
                         "process, or unset MASTER_PORT and kosmoss picks a free one")


def check_master_addr(topology: Topology) -> None:
    """Lightning's local ranks meet at MASTER_ADDR when it is set: one left in the shell by
    a cluster job, that this machine cannot listen on, made them retry for minutes (the
    store's timeout) before a traceback. Every rank of such a run starts on this machine."""
    address = os.environ.get("MASTER_ADDR")
    if address is None or topology.launcher is not Launcher.LIGHTNING or \
            not topology.launcher.starts_ranks:
        return
    problem = _cannot_listen_on(address)
    if problem:
        raise UsageError(f"MASTER_ADDR {address!r} {problem}, and every rank of this run starts "
                         "on this machine: unset it (the ranks meet at 127.0.0.1) or give one "
                         "of this machine's addresses")


def _cannot_listen_on(address: str) -> Optional[str]:
    """Why rank 0 could not listen on ``address``, or None (a bind to port 0 says it)."""
    try:
        found = socket.getaddrinfo(address or None, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        return f"does not resolve ({getattr(error, 'strerror', None) or error})"
    for family, kind, protocol, _, where in found:
        with socket.socket(family, kind, protocol) as sock:
            try:
                sock.bind((where[0], 0))
                return None
            except OSError:
                continue
    return "is not an address of this machine"


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # SO_REUSEADDR: a port in TIME_WAIT is free for us; one being listened on is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    pid = next(iter(port_holders(port)), None)
    if pid is None:
        return "held by a process this user cannot see"
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        command = "?"
    return f"held by pid {pid} ({command[:80]})"


def port_holders(port: int) -> List[Optional[int]]:
    """Every process listening on this TCP port (a socket forked into data workers is held
    by each); None for one this user cannot see."""
    return [conn.pid for conn in psutil.net_connections(kind="inet")
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN]
