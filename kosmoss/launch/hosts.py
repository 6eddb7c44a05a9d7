"""Hosts on one machine: each simulated node in its own network namespace, with its own
interface and address on a private subnet, joined to the others through a bridge, its link
shaped to a set rate (``tc`` tbf). docs/hosts.md says what they emulate and what not.

    with host_set(2, parse_rate("1gbit", "--link-rate"), purpose="run R") as hosts:
        hosts.hosts[0].command(["python", "trainup_cpu.py"])  # ip netns exec kosmoss-R-h0 ...

What is made: namespaces ``kosmoss-<set>-h<i>`` (one per host, interface ``kosmoss0``) and
``kosmoss-<set>-sw`` (the bridge, no address); nothing in the machine's own namespace, so
no traffic is routed to the outside. A record in ``/run/kosmoss/hosts/<set>.json`` names
the process that owns the set: a set whose owner is gone is a ghost (``kosmoss ghosts``
lists it, ``--kill`` removes it, :mod:`kosmoss.ghosts.hosts`).
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from ..core.errors import UsageError
from ..core.files import atomic_write_json
from .records import ProcessId

PREFIX = "kosmoss-"
SWITCH = "sw"
INTERFACE = "kosmoss0"  # the same name on every host, as a cluster's fast network has
NETNS_DIR = Path("/run/netns")  # where iproute2 keeps named namespaces
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` mounts /etc/netns/NAME/hosts on /etc/hosts
STATE_DIR = Path(os.environ.get("KOSMOSS_HOSTS_STATE", "/run/kosmoss/hosts"))
SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
SUBNET_SPACE = ipaddress.ip_network("10.0.0.0/8")
FIRST_SUBNET = ipaddress.ip_network("10.213.0.0/24")  # searched from here, wrapping around
MAX_HOSTS = 253  # a /24 less the network, broadcast and one spare address
HOSTS_PER_CORE = 4  # beyond this every host's processes mostly wait for a core
QUEUE_LATENCY = "100ms"  # tbf's queue: deep enough that TCP is not cut back by drops
MIN_BURST_BYTES = 128 * 1024  # a veth hands tbf 64 KiB GSO packets: the bucket must hold one
STOP_GRACE_S = 5.0


def parse_rate(text: Optional[str], flag: str) -> Optional[float]:
    """``1gbit``, ``100mbit``, ``2.5gbit``, ``none`` → bits per second (None: unshaped)."""
    if text is None or text.strip().lower() in ("none", "unshaped"):
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in RATE_UNITS or float(match.group(1)) <= 0:
        raise UsageError(f"{flag} {text}: not a link rate; write e.g. 100mbit, 1gbit, 10gbit, "
                         "or none (unshaped)")
    rate = float(match.group(1)) * RATE_UNITS[unit]
    if rate < 1e6:  # below this gloo's connect and handshake time out before a step ends
        raise UsageError(f"{flag} {text}: below 1mbit a step would take minutes; give 1mbit "
                         "or more")
    return rate


def rate_name(rate_bps: Optional[float]) -> str:
    if rate_bps is None:
        return "unshaped"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if rate_bps >= RATE_UNITS[unit]:
            return f"{rate_bps / RATE_UNITS[unit]:g}{unit}"
    return f"{rate_bps:g}bit"


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str
    interface: str = INTERFACE

    @property
    def socket_env(self) -> Dict[str, str]:
        """What tells gloo and NCCL which interface is this node's network."""
        return {name: self.interface for name in SOCKET_VARIABLES}

    def command(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None) -> List[str]:
        """``argv`` run in this host, as a user types it (``ip netns exec`` keeps the pid,
        so the parent-death signal and signals sent to it reach the command)."""
        pairs = [f"{key}={value}" for key, value in (env or {}).items()]
        return ["ip", "netns", "exec", self.namespace, *(["env", *pairs] if pairs else []),
                *argv]


@dataclass(frozen=True)
class HostSet:
    set_id: str
    hosts: tuple
    subnet: str
    rate_bps: Optional[float]
    purpose: str
    owner: Optional[ProcessId]  # None: made by `kosmoss hosts up`, removed by `hosts down`
    created_at: float

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.set_id}-{SWITCH}"

    @property
    def master_addr(self) -> str:
        return self.hosts[0].address

    @property
    def namespaces(self) -> List[str]:
        return [host.namespace for host in self.hosts] + [self.switch]

    @property
    def threads_env(self) -> Dict[str, str]:
        """One rank a host: its share of this machine's cores, which the hosts share.
        torchrun, srun and Lightning would give each rank all of them, and a rank's thread
        count changes its float sums (simulated nodes set the same share: .nodes)."""
        from ..devices.cpus import cores_per_process

        return {"OMP_NUM_THREADS": str(cores_per_process(len(self.hosts)))}

    def describe(self) -> str:
        addresses = ", ".join(f"{h.namespace} {h.address}" for h in self.hosts)
        count = f"{len(self.hosts)} host" + ("s" if len(self.hosts) != 1 else "")
        return (f"{count} in network namespaces ({addresses}; subnet "
                f"{self.subnet}, link {rate_name(self.rate_bps)}), interface {INTERFACE} "
                f"(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), MASTER_ADDR {self.master_addr}")

    def as_dict(self) -> dict:
        return {"set_id": self.set_id, "subnet": self.subnet, "rate_bps": self.rate_bps,
                "rate": rate_name(self.rate_bps), "purpose": self.purpose,
                "owner": self.owner.as_dict() if self.owner else None,
                "created_at": self.created_at, "switch": self.switch,
                "hosts": [{"index": h.index, "namespace": h.namespace, "address": h.address,
                           "interface": h.interface} for h in self.hosts]}

    @classmethod
    def from_dict(cls, data: dict) -> "HostSet":
        hosts = tuple(Host(h["index"], h["namespace"], h["address"], h.get("interface",
                                                                          INTERFACE))
                      for h in data["hosts"])
        return cls(data["set_id"], hosts, data["subnet"], data.get("rate_bps"),
                   data.get("purpose", ""), ProcessId.from_dict(data.get("owner")),
                   float(data.get("created_at") or 0.0))


# --- can this machine make hosts ---------------------------------------------------------

def check_support(flag: str) -> None:
    """Root, iproute2, and network namespaces in this kernel; a UsageError naming ``flag``."""
    if sys.platform != "linux":
        raise UsageError(f"{flag}: network namespaces are Linux's; run without it (loopback)")
    if os.geteuid() != 0:
        raise UsageError(f"{flag}: making network namespaces needs root; run as root (sudo), "
                         "or without it (the nodes then share the loopback)")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UsageError(f"{flag}: {' and '.join(missing)} not found; install iproute2")
    if not Path("/proc/self/ns/net").exists():
        raise UsageError(f"{flag}: this kernel has no network namespaces (CONFIG_NET_NS); run "
                         "without it")


def support_missing() -> Optional[str]:
    """Why hosts cannot be made here (for skips and the lesson), or None."""
    try:
        check_support("--hosts netns")
    except UsageError as err:
        return str(err).split(": ", 1)[1]
    return None


def check_count(count: int, flag: str, cores: Optional[int] = None) -> None:
    from ..devices.cpus import available_cores

    cores = cores or available_cores()
    if count < 1:
        raise UsageError(f"{flag} {count}: give 1 or more hosts")
    if count > MAX_HOSTS:
        raise UsageError(f"{flag} {count}: a host set's /24 subnet holds {MAX_HOSTS} hosts; "
                         "give fewer")
    if count > HOSTS_PER_CORE * cores:
        raise UsageError(f"{flag} {count}: {count} hosts on {cores} core(s) (at most "
                         f"{HOSTS_PER_CORE} a core, every host runs processes of its own); "
                         "give fewer")


# --- iproute2 ------------------------------------------------------------------------------

def _ip(args: Sequence[str], batch: Optional[str] = None, namespace: Optional[str] = None,
        program: str = "ip") -> str:
    # iproute2's own commands, batched one process per namespace: what docs/hosts.md shows a
    # user typing, no extra dependency, and 2 hosts made in a few tens of milliseconds.
    argv = [program, *(["-n", namespace] if namespace else []), *args]
    if batch is not None:
        argv += ["-batch", "-"]
    done = subprocess.run(argv, input=batch, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class HostError(RuntimeError):
    """An iproute2 command failed while hosts were made or removed."""


def _json(args: Sequence[str], namespace: Optional[str] = None) -> list:
    text = _ip(["-j", *args], namespace=namespace)
    return json.loads(text) if text.strip() else []


def existing_namespaces() -> List[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


# --- the subnet ------------------------------------------------------------------------

def taken_networks() -> List[ipaddress.IPv4Network]:
    """Every IPv4 network this machine routes or holds an address in (all routing tables),
    and the subnets of the host sets recorded."""
    taken = []
    for route in _json(["-4", "route", "show", "table", "all"]):
        dst = route.get("dst", "")
        if dst and dst != "default" and not dst.startswith(("broadcast", "local")):
            taken.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for link in _json(["-4", "addr"]):
        for info in link.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}",
                                              strict=False))
    taken += [ipaddress.ip_network(record.subnet) for record in recorded_sets()]
    return taken


def choose_subnet(taken: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /24 of 10.0.0.0/8, from 10.213.0.0, that overlaps nothing taken."""
    ranges = [(int(n.network_address), int(n.broadcast_address)) for n in taken
              if n.version == 4]
    base, count = int(SUBNET_SPACE.network_address), SUBNET_SPACE.num_addresses // 256
    start = (int(FIRST_SUBNET.network_address) - base) // 256
    for k in (*range(start, count), *range(start)):
        low = base + 256 * k
        if not any(first <= low + 255 and last >= low for first, last in ranges):
            return ipaddress.ip_network(f"{ipaddress.ip_address(low)}/24")
    raise UsageError("--hosts netns: every /24 of 10.0.0.0/8 overlaps a route of this "
                     "machine; remove some host sets (kosmoss hosts status)")


# --- making and removing ---------------------------------------------------------------

def new_set_id() -> str:
    return uuid.uuid4().hex[:8]


def make_hosts(count: int, rate_bps: Optional[float], *, purpose: str,
               owner: Optional[ProcessId], set_id: Optional[str] = None) -> HostSet:
    """Make ``count`` hosts; on any failure what was made is removed again."""
    check_support("--hosts netns")
    check_no_leftovers()
    set_id = set_id or new_set_id()
    subnet = choose_subnet(taken_networks())
    addresses = list(subnet.hosts())
    hosts = tuple(Host(i, f"{PREFIX}{set_id}-h{i}", str(addresses[i])) for i in range(count))
    made = HostSet(set_id, hosts, str(subnet), rate_bps, purpose, owner, time.time())
    atomic_write_json(STATE_DIR / f"{set_id}.json", made.as_dict())  # first: a crash leaves a ghost
    try:
        _build(made, subnet.prefixlen)
    except BaseException:
        remove_hosts(made)
        raise
    return made


def _build(made: HostSet, prefix: int) -> None:
    _ip([], batch="".join(f"netns add {name}\n" for name in made.namespaces))
    _write_hosts_files(made)
    switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
    for host in made.hosts:
        port = f"p{host.index}"
        switch += [f"link add {port} type veth peer name {INTERFACE} netns {host.namespace}",
                   f"link set {port} master br0", f"link set {port} up"]
    _ip([], batch="\n".join(switch) + "\n", namespace=made.switch)
    for host in made.hosts:
        # No IPv6 link-local address: gloo takes an interface's first address, which must
        # be the host's IPv4 one.
        _ip([], namespace=host.namespace, batch=(
            f"link set lo up\nlink set {INTERFACE} addrgenmode none\n"
            f"addr add {host.address}/{prefix} dev {INTERFACE}\nlink set {INTERFACE} up\n"))
        if made.rate_bps is not None:
            _ip(tbf_args(made.rate_bps), namespace=host.namespace, program="tc")


def _write_hosts_files(made: HostSet) -> None:
    """Every host's name resolves in every host, without DNS (there is none to reach), and
    the machine's hostname to the host's own address, as a node's does: the lookups of
    c10d, torchrun and Slurm find them."""
    names = "".join(f"{address}{h.address} {h.namespace} h{h.index}\n" for h in made.hosts
                    for address in ("", "::ffff:"))  # c10d's store: IPv6-mapped peers
    for host in made.hosts:
        folder = NETNS_ETC / host.namespace
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} "
                                      f"{socket.gethostname()}\n{names}")


def tbf_args(rate_bps: float) -> List[str]:
    """Shape what the host sends to ``rate_bps``: its link's rate in each direction."""
    burst = max(MIN_BURST_BYTES, int(rate_bps / 8 / 1000))  # a millisecond of the rate
    return ["qdisc", "add", "dev", INTERFACE, "root", "tbf", "rate", f"{int(rate_bps)}bit",
            "burst", str(burst), "latency", QUEUE_LATENCY]


def remove_hosts(made: HostSet) -> List[str]:
    """End every process inside the set's namespaces, delete them and the record; returns
    the namespaces deleted."""
    return remove_namespaces(made.namespaces, STATE_DIR / f"{made.set_id}.json")


def remove_namespaces(names: Sequence[str], record: Optional[Path] = None) -> List[str]:
    present = [name for name in names if (NETNS_DIR / name).exists()]
    end_processes_in(present)
    for name in present:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    for name in names:
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    if record is not None:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        shutil.rmtree(record.with_suffix(".slurm"), ignore_errors=True)  # host_slurm.py
    return present


def processes_in(names: Sequence[str]) -> List[int]:
    pids = []
    for name in names:
        done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids += [int(pid) for pid in done.stdout.split() if pid.isdigit()]
    return [pid for pid in pids if pid != os.getpid()]


def end_processes_in(names: Sequence[str], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM what runs in the namespaces, SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_in(names):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 2.0)
        while processes_in(names) and time.monotonic() < deadline:
            time.sleep(0.05)


@contextlib.contextmanager
def host_set(count: int, rate_bps: Optional[float], *, purpose: str,
             set_id: Optional[str] = None) -> Iterator[HostSet]:
    """Hosts owned by this process for the block: removed whatever way it ends (Ctrl-C and
    SIGTERM too, where nobody else handles them); after a SIGKILL, by ``kosmoss ghosts
    --kill``."""
    made = make_hosts(count, rate_bps, purpose=purpose, owner=ProcessId.of(os.getpid()),
                      set_id=set_id)
    try:
        with _stop_signals_end_the_block():
            yield made
    finally:
        remove_hosts(made)


@contextlib.contextmanager
def _stop_signals_end_the_block() -> Iterator[None]:
    """SIGTERM with no handler of the caller's would end the process without ``finally``:
    make it an exit that runs it (128 + 15, as a shell reports it)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- records and leftovers -------------------------------------------------------------

def recorded_sets() -> List[HostSet]:
    found = []
    for path in sorted(STATE_DIR.glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            found.append(HostSet.from_dict(json.loads(path.read_text())))
    return found


@dataclass(frozen=True)
class Leftover:
    """Namespaces of a host set nobody owns any more."""
    set_id: str
    namespaces: tuple
    record: Optional[HostSet]
    reason: str

    def remove(self) -> List[str]:
        return remove_namespaces(self.namespaces, STATE_DIR / f"{self.set_id}.json")


def set_id_of(namespace: str) -> Optional[str]:
    match = re.fullmatch(rf"{re.escape(PREFIX)}(.+)-(h\d+|{SWITCH})", namespace)
    return match.group(1) if match else None


def leftovers() -> List[Leftover]:
    """Host sets whose owner is gone (a launcher killed with SIGKILL), and kosmoss
    namespaces no record accounts for."""
    by_set: Dict[str, List[str]] = {}
    for name in existing_namespaces():
        if set_id_of(name):
            by_set.setdefault(set_id_of(name), []).append(name)
    records = {record.set_id: record for record in recorded_sets()}
    found = []
    for set_id in sorted(set(by_set) | set(records)):
        record = records.get(set_id)
        reason = _why_left(record)
        if reason:
            names = tuple(by_set.get(set_id, ()))
            found.append(Leftover(set_id, names, record, reason if names else
                                  f"{reason}; its namespaces are gone, only its record is left"))
    return found


def _why_left(record: Optional[HostSet]) -> Optional[str]:
    if record is None:
        return "no record names these kosmoss namespaces"
    if record.owner is None:
        return None  # `kosmoss hosts up`: the user's, until `kosmoss hosts down`
    if record.owner.is_alive():
        return None
    return f"its owner ({record.purpose}, pid {record.owner.pid}) is gone"


def check_no_leftovers() -> None:
    found = leftovers()
    if found:
        first = found[0]
        raise UsageError(f"--hosts netns: host set {first.set_id} was left by another run "
                         f"({first.reason}); remove it with `kosmoss ghosts --kill`, then "
                         "run again")


# --- which interface the ranks use -------------------------------------------------------

def check_socket_interfaces(environ: Optional[Dict[str, str]] = None) -> None:
    """Before any host is made: a GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME the user set must
    be the hosts' link to each other (every host has ``lo`` and ``kosmoss0``, nothing else):
    one line naming what each host would use, and what to use."""
    environ = os.environ if environ is None else environ
    for variable in SOCKET_VARIABLES:
        wanted = environ.get(variable)
        if wanted and wanted != INTERFACE:
            tried = _interface_use({"lo": ["127.0.0.1"]}, wanted)
            raise UsageError(f"{variable}={wanted}: every host {tried}; the hosts reach each "
                             f"other only over {INTERFACE} (one address each on the host "
                             f"set's subnet): unset {variable} (kosmoss sets it per host) or "
                             f"set {variable}={INTERFACE}")


def _interface_use(addresses: Dict[str, List[str]], name: str) -> str:
    if name not in addresses:
        return f"would look for {name} and has none (only {', '.join([*addresses, INTERFACE])})"
    return f"would use {name} ({', '.join(addresses[name])}, its own loopback)"


def interface_addresses(namespace: Optional[str] = None) -> Dict[str, List[str]]:
    """Interface name → its IPv4 addresses, in ``namespace`` (None: this process's)."""
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", [])
                             if a.get("family") == "inet"]
            for link in _json(["addr"], namespace=namespace)}


def check_rank_interface(environ: Optional[Dict[str, str]] = None) -> None:
    """In a rank started by another launcher (torchrun in a host, srun): a socket interface
    variable that names a missing interface, or one with only loopback addresses while
    MASTER_ADDR is another host's, fails here in one line naming the interface to use,
    instead of in gloo's connect minutes later."""
    environ = os.environ if environ is None else environ
    master = environ.get("MASTER_ADDR", "")
    for variable in SOCKET_VARIABLES:
        wanted = environ.get(variable)
        if not wanted or "," in wanted or wanted.startswith(("^", "=")) or shutil.which("ip") \
                is None:
            continue  # NCCL's lists and prefixes are NCCL's to judge
        problem = _rank_interface_problem(wanted, master)
        if problem:
            raise UsageError(f"{variable}={wanted}: {problem}")


def _rank_interface_problem(wanted: str, master: str) -> Optional[str]:
    addresses = interface_addresses()
    route = _route_to(master)
    advice = f"set it to {route} (the route to MASTER_ADDR {master}) or unset it" if route \
        else "unset it or name an interface of `ip addr`"
    if wanted not in addresses:
        return f"this host has no such interface ({', '.join(sorted(addresses))}); {advice}"
    remote = master and not _is_loopback(master)
    if remote and all(_is_loopback(a) for a in addresses[wanted]):
        return (f"a loopback interface ({', '.join(addresses[wanted]) or 'no address'}) cannot "
                f"reach MASTER_ADDR {master}; {advice}")
    return None


def _route_to(address: str) -> Optional[str]:
    try:
        ipaddress.ip_address(address)
        routes = _json(["route", "get", address])
    except (ValueError, HostError):
        return None
    return routes[0].get("dev") if routes else None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


# --- entering a host ------------------------------------------------------------------

CLONE_NEWNET = 0x40000000  # from <sched.h>


def enter(namespace: str) -> None:
    """Move this thread (and the threads it starts later) into a host's network namespace:
    a rank started by torch.multiprocessing joins its host before it opens a socket.
    (os.setns is Python 3.12's; libc's is the same call.)"""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)


# --- link state, for a run that lost a host ----------------------------------------------

def unreachable_hosts(made: HostSet) -> List[str]:
    """Hosts whose link is down (its interface or its bridge port), as a cluster's health
    check would name them."""
    lost = []
    ports = {link["ifname"]: link for link in _safe_json(["link"], made.switch)}
    for host in made.hosts:
        mine = {link["ifname"]: link for link in _safe_json(["link"], host.namespace)}
        own, port = mine.get(INTERFACE, {}), ports.get(f"p{host.index}", {})
        if "UP" not in own.get("flags", []) or "UP" not in port.get("flags", []):
            lost.append(f"host {host.index} ({host.namespace}, {host.address}): its link "
                        f"{INTERFACE} is down")
    return lost


def _safe_json(args: Sequence[str], namespace: str) -> list:
    try:
        return _json(args, namespace=namespace)
    except (HostError, ValueError):
        return []
