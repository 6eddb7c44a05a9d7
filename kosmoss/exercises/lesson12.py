"""Lesson 12 (a cluster on your laptop): the step time of DDP across hosts from the α–β
model and a link's rate, and the interface a rank must use to reach MASTER_ADDR.

    kosmoss check 12
"""
from __future__ import annotations

import ipaddress
import math
from typing import Dict, List, Optional

from .core import Exercise, Mistake, failed, learner, number, passed, show

# ---------------------------------------------------------------- 12.step_time

STEP_STATEMENT = """\
**Predict a DDP step across hosts from the link's rate.**

Write `predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s)`: the
seconds of one training step of DDP with one rank per host, when the gradients'
all-reduce is not hidden behind backward (CPU ranks that fill the cores): the compute,
plus a ring all-reduce of `gradient_bytes` over `hosts` hosts whose links carry
`rate_bits` bits per second each way, each of the ring's steps paying the hop latency
`latency_s`. One host has nothing to reduce. The checker compares with the α–β model at
1 to 8 hosts, from 10 Mbit/s to 100 Gbit/s, with and without latency.
"""

STEP_SKELETON = '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    """Seconds of one DDP step: compute + the ring all-reduce of the gradients."""
    raise NotImplementedError("your code here")
'''

STEP_REFERENCE = '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)  # reduce-scatter, then all-gather
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes / (rate_bits / 8)
'''

STEP_WRONG = {
    "bits taken for bytes": Mistake('''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes / rate_bits
''', "bits taken for bytes"),
    "the whole buffer over the link": Mistake('''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    return compute_s + 2 * (hosts - 1) * latency_s + gradient_bytes / (rate_bits / 8)
''', "the whole buffer over the link"),
    "reduce-scatter only": Mistake('''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = hosts - 1
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes / (rate_bits / 8)
''', "reduce-scatter only"),
    "latency paid once": Mistake('''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + latency_s + steps / hosts * gradient_bytes / (rate_bits / 8)
''', "latency paid once"),
    "one host still reduces": Mistake('''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    steps = 2 * max(hosts - 1, 1)
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes / (rate_bits / 8)
''', "one host still reduces"),
}

# (compute_s, gradient_bytes, hosts, rate_bits, latency_s): the edges the statement names.
STEP_CASES = ((0.02, 1_952_256, 2, 1e8, 0.0), (0.02, 1_952_256, 3, 1e9, 50e-6),
              (0.005, 25 * 2**20, 8, 1e11, 5e-6), (0.1, 1_952_256, 1, 1e9, 1e-3),
              (0.0, 4096, 4, 1e7, 2e-3), (0.03, 1_952_256, 2, 1e10, 30e-6))


def ring_step_s(compute_s: float, gradient_bytes: float, hosts: int, rate_bits: float,
                latency_s: float) -> float:
    """The α–β model of kosmoss.scaling.projection (ring_allreduce_s), exposed in full."""
    from ..scaling.projection import Link, ring_allreduce_s

    link = Link("case", latency_s, rate_bits / 8, "lesson 12")
    return compute_s + ring_allreduce_s(gradient_bytes, hosts, link)


def mistake(wrong: Dict[str, Mistake], name: str, cases: tuple, answers: list) -> str:
    """The catalogued mistake that gives the learner's answer in every case, named."""
    for label, catalogued in wrong.items():
        scope: dict = {}
        exec(catalogued.body, scope)  # the catalogue's own cells: kosmoss's code
        if all(_same(scope[name](*case), got) for case, got in zip(cases, answers)):
            return f" — that is the answer of a known mistake: {label}"
    return ""


def _same(value, got) -> bool:
    if number(value) is not None and number(got) is not None and not isinstance(got, str):
        return math.isclose(number(value), number(got), rel_tol=1e-9)
    return value == got


def step_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "predicted_step_s")
    answers = [mine(*case) for case in STEP_CASES]
    for case, answer in zip(STEP_CASES, answers):
        right = ring_step_s(*case)
        got = number(answer)
        if got is None or not math.isclose(got, right, rel_tol=1e-9, abs_tol=1e-12):
            compute, size, hosts, rate, latency = case
            return failed(f"{hosts} host(s), {size:,} bytes at {rate:.3g} bit/s, latency "
                          f"{latency:g} s, compute {compute:g} s: yours is {show(got)} s, the "
                          f"α–β model's {right:.6g} s"
                          + mistake(STEP_WRONG, "predicted_step_s", STEP_CASES, answers))
    return passed(f"the α–β step in {len(STEP_CASES)} cases, one host and 8 hosts included")


# ---------------------------------------------------------------- 12.pick_interface

PICK_STATEMENT = """\
**Pick the interface that reaches MASTER_ADDR, as GLOO_SOCKET_IFNAME must name it.**

Write `pick_interface(interfaces, master_addr)`: `interfaces` maps each interface's name
to its addresses as `"address/prefix"` strings (what `ip addr` shows, e.g.
`{"lo": ["127.0.0.1/8"], "kosmoss0": ["10.213.0.2/24"]}`); return the name of the
interface whose network holds `master_addr`, the most specific one (longest prefix) when
several do, as a routing table decides, and the first of them in `interfaces`' order when
their prefixes tie; `None` when none does. A master on this host (`127.0.0.1`) is reached
over the loopback. The checker tries hosts with several interfaces, overlapping networks,
equally specific ones, a master on no network, interfaces without address, IPv6
addresses beside the IPv4 ones and an IPv6 `master_addr`.
"""

PICK_SKELETON = '''
import ipaddress


def pick_interface(interfaces, master_addr):
    """The interface whose network holds master_addr (longest prefix), or None."""
    raise NotImplementedError("your code here")
'''

PICK_REFERENCE = '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        for address in addresses:
            network = ipaddress.ip_interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
'''

PICK_WRONG = {
    "the first interface that is not the loopback": Mistake('''
def pick_interface(interfaces, master_addr):
    return next((name for name in interfaces if name != "lo"), None)
''', "the first interface that is not the loopback"),
    "the first network that holds it, not the most specific": Mistake('''
import ipaddress


def pick_interface(interfaces, master_addr):
    for name, addresses in interfaces.items():
        for address in addresses:
            if ipaddress.ip_address(master_addr) in ipaddress.ip_interface(address).network:
                return name
    return None
''', "the first network that holds it, not the most specific"),
    "the address compared, not its network": Mistake('''
def pick_interface(interfaces, master_addr):
    for name, addresses in interfaces.items():
        if any(address.split("/")[0] == master_addr for address in addresses):
            return name
    return None
''', "the address compared, not its network"),
    "the prefix ignored (a /8 of the first octet)": Mistake('''
def pick_interface(interfaces, master_addr):
    for name, addresses in interfaces.items():
        for address in addresses:
            if address.split(".")[0] == master_addr.split(".")[0]:
                return name
    return None
''', "the prefix ignored (a /8 of the first octet)"),
    "the first of several addresses only": Mistake('''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        if not addresses:
            continue
        network = ipaddress.ip_interface(addresses[0]).network
        if target in network and network.prefixlen > best_prefix:
            best, best_prefix = name, network.prefixlen
    return best
''', "the first of several addresses only"),
    "a fallback instead of None": Mistake('''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = "eth0", -1
    for name, addresses in interfaces.items():
        for address in addresses:
            network = ipaddress.ip_interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
''', "a fallback instead of None"),
    "the last of equally specific networks, not the first given": Mistake(PICK_REFERENCE.replace(
        "network.prefixlen > best_prefix", "network.prefixlen >= best_prefix"),
        "the last of equally specific networks, not the first given"),
}

HOST = {"lo": ["127.0.0.1/8"], "kosmoss0": ["10.213.0.2/24"]}
PICK_CASES = (
    (HOST, "10.213.0.1"),
    (HOST, "127.0.0.1"),
    ({"eth0": ["192.168.1.5/24"], "ib0": ["10.1.0.5/16"], "lo": ["127.0.0.1/8"]}, "10.1.7.9"),
    ({"lo": ["127.0.0.1/8"], "wide": ["10.0.0.3/8"], "narrow": ["10.7.0.3/24"]}, "10.7.0.1"),
    ({"narrow": ["10.7.0.3/24"], "wide": ["10.0.0.3/8"]}, "10.9.0.1"),
    ({"lo": ["127.0.0.1/8"], "eth0": ["192.0.2.2/24"], "down": []}, "10.213.0.1"),
    ({"eth0": ["11.0.0.2/24"], "ib0": ["11.200.0.2/24"]}, "11.200.0.9"),
    # more octets in common with ib0's address, but eth0's network is the narrower
    ({"eth0": ["10.1.0.5/16"], "ib0": ["10.1.7.2/8"]}, "10.1.7.9"),
    # a /22 is no whole number of octets: 10.1.9.9 is outside 10.1.4.0/22, 10.1.6.1 inside
    ({"eth0": ["10.1.4.5/22"], "ib0": ["10.0.0.3/8"]}, "10.1.9.9"),
    ({"eth0": ["10.1.4.5/22"], "ib0": ["10.0.0.3/8"]}, "10.1.6.1"),
    # as `ip addr` shows an interface that is up: an IPv6 address beside the IPv4 one
    ({"lo": ["127.0.0.1/8", "::1/128"], "eth0": ["fe80::1/64", "10.5.0.2/16"]}, "10.5.3.3"),
    # the loopback under macOS's name: the one whose network holds 127.0.0.1, whatever it is
    ({"lo0": ["127.0.0.1/8"], "en0": ["192.168.1.20/24"]}, "127.0.0.1"),
    # an interface with several addresses (a secondary one added by `ip addr add`): the
    # route may go over any of them, not only the first
    ({"lo": ["127.0.0.1/8"], "eth0": ["192.168.1.5/24", "10.213.0.2/24", "172.17.0.1/16"]},
     "10.213.0.1"),
    # four NICs on the same /24: the first in the order given, not the last, nor the first
    # or last by name
    ({"lo": ["127.0.0.1/8"], "eth1": ["10.5.0.2/24"], "eth0": ["10.5.0.3/24"],
      "ib1": ["10.5.0.4/24"], "ib0": ["10.5.0.5/24"]}, "10.5.0.1"),
    # an IPv6 MASTER_ADDR (torch takes one): the IPv6 networks decide, as the IPv4 ones do
    ({"lo": ["127.0.0.1/8", "::1/128"], "eth0": ["10.5.0.2/16", "fd00:5::2/64"]}, "fd00:5::1"),
)


def pick_right(interfaces: Dict[str, List[str]], master: str) -> Optional[str]:
    target = ipaddress.ip_address(master)
    matches = [(ipaddress.ip_interface(a).network.prefixlen, name)
               for name, addresses in interfaces.items() for a in addresses
               if target in ipaddress.ip_interface(a).network]
    # max keeps the first of equal prefixes: the first interface in the order given
    return max(matches, key=lambda match: match[0])[1] if matches else None


def pick_judge(namespace: dict) -> tuple:
    mine = learner(namespace, "pick_interface")
    answers = [mine(dict(interfaces), master) for interfaces, master in PICK_CASES]
    for (interfaces, master), got in zip(PICK_CASES, answers):
        right = pick_right(interfaces, master)
        if got != right:
            return failed(f"interfaces {interfaces}, MASTER_ADDR {master}: yours is {got!r}, "
                          f"the route goes over {right!r}"
                          + (mistake(PICK_WRONG, "pick_interface", PICK_CASES, answers)
                             or _unknown_hint(got, interfaces)
                             or _several_hint(got, right, interfaces)
                             or _tie_hint(got, master, interfaces)
                             or _octets_hint(interfaces)))
    return passed(f"the route's interface in {len(PICK_CASES)} cases, overlapping networks "
                  "and no route included")


def _unknown_hint(got, interfaces: Dict[str, List[str]]) -> str:
    if got is None or got in interfaces:
        return ""
    return (f": {got!r} is no interface of this host — return one of the names in "
            "`interfaces`, the one whose network holds MASTER_ADDR (the loopback too has "
            "another name on another system)")


def _several_hint(got, right: Optional[str], interfaces: Dict[str, List[str]]) -> str:
    if got is not None or right is None or len(interfaces[right]) < 2:
        return ""
    return (f": {right!r} has several addresses ({', '.join(interfaces[right])}) — look at "
            "each of them, not at the first only")


def _tie_hint(got, master: str, interfaces: Dict[str, List[str]]) -> str:
    target = ipaddress.ip_address(master)
    prefixes = {name: max((ipaddress.ip_interface(a).network.prefixlen for a in addresses
                           if target in ipaddress.ip_interface(a).network), default=-1)
                for name, addresses in interfaces.items()}
    best = max(prefixes.values())
    tied = [name for name, prefix in prefixes.items() if prefix == best >= 0]
    if got not in tied[1:]:
        return ""
    return (f": {', '.join(tied)} are all on a /{best} that holds it — take the first of them "
            "in the order given, as the statement says")


def _octets_hint(interfaces: Dict[str, List[str]]) -> str:
    odd = [a for addresses in interfaces.values() for a in addresses
           if int(a.partition("/")[2] or 32) % 8]
    if not odd:
        return ""
    return (f": {odd[0]} is no whole number of octets — a network holds the addresses whose "
            "first prefix bits match its own (ipaddress.ip_interface(a).network), not whole "
            "octets")


EXERCISES = [
    Exercise("12.step_time", STEP_STATEMENT, STEP_SKELETON, STEP_REFERENCE, STEP_WRONG,
             step_judge, names=("predicted_step_s",), forbidden=("kosmoss.scaling",)),
    Exercise("12.pick_interface", PICK_STATEMENT, PICK_SKELETON, PICK_REFERENCE, PICK_WRONG,
             pick_judge, names=("pick_interface",), forbidden=("kosmoss.launch",)),
]
