"""kosmoss comm across hosts: the fitted link bandwidth is the rate set (busbw, nccl-tests'
factor), at 2 and 3 hosts; kosmoss project then counts one machine's cores for all."""
import json
import os
import subprocess
import sys

import pytest

from host_helpers import kosmoss_namespaces, needs_hosts
from kosmoss.launch import hosts

pytestmark = [pytest.mark.slow, needs_hosts]


@pytest.mark.parametrize("nodes", [2, 3])
def test_the_fitted_bandwidth_is_the_set_rate(tmp_path, nodes):
    before = kosmoss_namespaces()
    out = tmp_path / "comm"
    proc = subprocess.run([sys.executable, "-m", "kosmoss", "comm", "--ranks", str(nodes),
                           "--nodes", str(nodes), "--hosts", "netns", "--link-rate", "100mbit",
                           "--sizes", "256K", "1M", "2M", "--repeats", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    comm = json.loads((out / "comm.json").read_text())
    fit = comm["groups"]["world"]["fit"]
    rate = hosts.parse_rate("100mbit", "--link-rate") / 8
    assert 0.85 < fit["link_bandwidth_Bps"] / rate < 1.15, fit
    assert comm["plan"]["link_rate"] == "100mbit" and len(comm["plan"]["host_namespaces"]) == nodes
    assert kosmoss_namespaces() == before
    projected = subprocess.run([sys.executable, "-m", "kosmoss", "project", "--comm",
                                str(out / "comm.json"), "--devices", "1", "--nodes", "1", "2",
                                "--batch-size", "256", "--json"],
                               capture_output=True, text=True, timeout=600)
    assert projected.returncode == 0, projected.stderr[-2000:]
    report = json.loads(projected.stdout)
    assert report["one_machine"] and report["links"]["inter"]["name"] == "measured"
    one, two = report["rows"]
    assert two["exposed_comm_s"] > 0.5 * 2 * (1 / 2) * report["model"]["gradient_bytes"] / rate


def test_bad_host_flags_of_comm_are_one_line(tmp_path):
    for args, said in ((["--link-rate", "1gbit"], "--link-rate 1gbit: only with --hosts netns"),
                       (["--hosts", "netns"], "--hosts netns: give --nodes 2 or more"),
                       (["--nodes", "2", "--hosts", "netns", "--link-rate", "x"],
                        "--link-rate x: not a link rate"),
                       # 256 MiB over 1 Mbit/s: past the ranks' timeout, after an hour
                       (["--nodes", "2", "--hosts", "netns", "--link-rate", "1mbit"],
                        "--link-rate 1mbit: an all-reduce of 256 MiB takes at least 2,147 s "
                        "over it, past half the ranks' 120 s timeout; give --max-size 4MiB or "
                        "less, or a faster rate")):
        proc = subprocess.run([sys.executable, "-m", "kosmoss", "comm", "--ranks", "2", *args],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KOSMOSS_HOME": str(tmp_path)})
        assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1


def test_a_shaped_comm_says_how_long_it_takes_at_least():
    from kosmoss.commands.comm import _check_link_time, least_duration_s
    from kosmoss.comm.measure import make_plan
    from kosmoss.scaling.allreduce import parse_size

    plan = make_plan(2, 2, "gloo", "cpu", None, parse_size("4MiB", "--max-size"), 10, 2, 0.0)
    _check_link_time(plan, 1e6)  # the advised --max-size passes
    # 4 KiB..4 MiB by 4x and the MLP's 1.86 MiB gradients, 12 all-reduces each, 8 bits a byte
    assert least_duration_s(plan, 1e6) == pytest.approx(
        12 * 8 * (sum(4096 * 4**k for k in range(6)) + 1_955_408) / 1e6, rel=1e-9)
    assert least_duration_s(plan, None) is None
