"""Hosts in network namespaces: made and removed fast, isolated from the machine, shaped,
and never left behind (exit, Ctrl-C, SIGTERM; after a SIGKILL, `kosmoss ghosts --kill`)."""
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import REPO
from host_helpers import in_host, namespaces_of, needs_hosts, remove_set
from kosmoss.core.errors import UsageError
from kosmoss.devices.cpus import cores_per_process
from kosmoss.launch import host_slurm, hosts


# --- the rate and the subnet, without a namespace ------------------------------------

@given(st.floats(min_value=1, max_value=400_000), st.sampled_from(["mbit", "gbit"]))
def test_a_rate_reads_back_as_its_bits_per_second(value, unit):
    text = f"{value:g}{unit}"
    rate = hosts.parse_rate(text, "--link-rate")
    assert rate == pytest.approx(float(f"{value:g}") * hosts.RATE_UNITS[unit])
    assert hosts.parse_rate(hosts.rate_name(rate), "--link-rate") == pytest.approx(rate)


@pytest.mark.parametrize("text", ["fast", "1", "1 gigabit", "-1gbit", "0mbit", "1e3mbit",
                                  "999kbit", "gbit", ""])
def test_a_rate_that_does_not_parse_names_the_flag(text):
    with pytest.raises(UsageError, match=r"^--link-rate .*(link rate|1mbit or more)"):
        hosts.parse_rate(text, "--link-rate")


@pytest.mark.parametrize("text", [None, "none", "NONE", " unshaped "])
def test_none_is_an_unshaped_link(text):
    assert hosts.parse_rate(text, "--link-rate") is None
    assert hosts.rate_name(None) == "unshaped"


networks = st.builds(lambda a, prefix: ipaddress.ip_network(f"{a}/{prefix}", strict=False),
                     st.ip_addresses(v=4), st.integers(min_value=8, max_value=32))


@settings(deadline=None)
@given(st.lists(networks, max_size=20))
def test_the_chosen_subnet_overlaps_no_route(taken):
    space = hosts.SUBNET_SPACE
    if any(space.subnet_of(n) for n in taken if n.version == 4):
        with pytest.raises(UsageError, match="every /24 of 10.0.0.0/8 overlaps"):
            hosts.choose_subnet(taken)
        return
    chosen = hosts.choose_subnet(taken)
    assert chosen.prefixlen == 24 and chosen.subnet_of(hosts.SUBNET_SPACE)
    assert not any(chosen.overlaps(other) for other in taken)


def test_a_machine_that_routes_all_of_10_slash_8_is_told_so():
    with pytest.raises(UsageError, match="every /24 of 10.0.0.0/8 overlaps"):
        hosts.choose_subnet([ipaddress.ip_network("10.0.0.0/8")])
    # One /24 left, far from where the search starts: found.
    left = ipaddress.ip_network("10.1.2.0/24")
    taken = [n for n in ipaddress.ip_network("10.0.0.0/8").subnets(new_prefix=16)
             if not left.subnet_of(n)] + [n for n in ipaddress.ip_network("10.1.0.0/16").subnets(
                 new_prefix=24) if n != left]
    assert hosts.choose_subnet(taken) == left


def test_more_hosts_than_the_subnet_or_the_cores_allow():
    with pytest.raises(UsageError, match="--num-nodes 254: a host set's /24 subnet holds 253"):
        hosts.check_count(254, "--num-nodes", cores=1000)
    with pytest.raises(UsageError, match="--num-nodes 9: 9 hosts on 2 core"):
        hosts.check_count(9, "--num-nodes", cores=2)
    hosts.check_count(8, "--num-nodes", cores=2)  # the limit itself is allowed


def test_no_root_is_one_line_naming_the_flag(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UsageError, match=r"^--hosts netns: making network namespaces needs root"):
        hosts.check_support("--hosts netns")
    assert "needs root" in hosts.support_missing()


@pytest.mark.parametrize("wanted, said", [
    ("lo", "every host would use lo (127.0.0.1, its own loopback)"),
    ("eth9", "every host would look for eth9 and has none (only lo, kosmoss0)"),
])
def test_a_socket_interface_that_is_not_the_hosts_link(wanted, said):
    for variable in hosts.SOCKET_VARIABLES:
        with pytest.raises(UsageError) as caught:
            hosts.check_socket_interfaces({variable: wanted})
        assert str(caught.value).startswith(f"{variable}={wanted}: {said}")
        assert str(caught.value).endswith(f"set {variable}=kosmoss0")
    hosts.check_socket_interfaces({"GLOO_SOCKET_IFNAME": "kosmoss0"})
    hosts.check_socket_interfaces({})


def test_a_rank_whose_interface_cannot_reach_master_addr(monkeypatch):
    monkeypatch.setattr(hosts, "interface_addresses",
                        lambda namespace=None: {"lo": ["127.0.0.1"], "eth0": ["10.9.0.2"]})
    monkeypatch.setattr(hosts, "_route_to", lambda address: "eth0")
    with pytest.raises(UsageError, match=r"^GLOO_SOCKET_IFNAME=lo: a loopback interface "
                                         r"\(127.0.0.1\) cannot reach MASTER_ADDR 10.9.0.1; "
                                         "set it to eth0"):
        hosts.check_rank_interface({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "10.9.0.1"})
    with pytest.raises(UsageError, match="NCCL_SOCKET_IFNAME=ib0: this host has no such "
                                         r"interface \(eth0, lo\); set it to eth0"):
        hosts.check_rank_interface({"NCCL_SOCKET_IFNAME": "ib0", "MASTER_ADDR": "10.9.0.1"})
    # Loopback is right when the master is this host; NCCL's own lists are NCCL's.
    hosts.check_rank_interface({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
    hosts.check_rank_interface({"NCCL_SOCKET_IFNAME": "^docker,lo", "MASTER_ADDR": "10.9.0.1"})
    hosts.check_rank_interface({"GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "10.9.0.1"})


@needs_hosts
@pytest.mark.parametrize("flags, said", [
    (dict(collective_timeout_s=5), "--collective-timeout 5 s: over the hosts' 1mbit link the "
     "model's 1.96 MB of gradients take 16 s to cross once, as every step's all-reduce must; "
     "give --collective-timeout 32 or more, or a faster --link-rate"),
    (dict(hidden=(4096, 4096)), "the default --collective-timeout 120 s: over the hosts' 1mbit "
     "link the model's 144 MB of gradients take 1,151 s to cross once, as every step's "
     "all-reduce must; give --collective-timeout 2302 or more"),
    (dict(), None), (dict(collective_timeout_s=5, link_rate="10mbit"), None)])
def test_a_link_too_slow_for_the_collective_timeout_is_refused_before_any_host(
        shared_home, monkeypatch, flags, said):
    """At 1mbit a step's all-reduce outlasts a short timeout: every run failed after its
    start-up with "a rank hangs or is far slower than the others"."""
    from kosmoss.core.errors import ConfigError
    from kosmoss.run import RunConfig
    from kosmoss.run.flags import in_flag_terms
    from kosmoss.run.plan import prepare

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    flags = dict(dict(dataset="tiny", num_nodes=2, hosts="netns", link_rate="1mbit"), **flags)
    config = RunConfig(**flags, given=frozenset(flags))
    if said is None:
        prepare(config)
        return
    with pytest.raises(ConfigError) as refused:
        prepare(config)
    assert in_flag_terms(refused.value).startswith(said), in_flag_terms(refused.value)


# --- real namespaces ---------------------------------------------------------------------

@needs_hosts
def test_two_hosts_are_made_and_removed_within_a_second(made_hosts):
    start = time.perf_counter()
    made = made_hosts(2, hosts.parse_rate("1gbit", "--link-rate"))
    hosts.remove_hosts(made)
    took = time.perf_counter() - start
    assert not namespaces_of(made.set_id)
    assert not (hosts.STATE_DIR / f"{made.set_id}.json").exists()
    assert took < 1.0, f"making and removing 2 hosts took {took:.2f} s"


@needs_hosts
def test_each_host_has_its_own_address_and_a_shaped_link_and_no_way_out(made_hosts):
    made = made_hosts(3, 100e6)
    subnet = ipaddress.ip_network(made.subnet)
    assert not any(subnet.overlaps(n) for n in hosts.taken_networks()
                   if n != subnet)  # the machine's own routes are untouched by it
    assert made.master_addr == made.hosts[0].address
    for host in made.hosts:
        assert hosts.interface_addresses(host.namespace) == {"lo": ["127.0.0.1"],
                                                             "kosmoss0": [host.address]}
        assert "tbf" in in_host(host.namespace, "tc", "qdisc", "show", "dev", "kosmoss0")
        assert "rate 100Mbit" in in_host(host.namespace, "tc", "qdisc", "show")
        routes = json.loads(in_host(host.namespace, "ip", "-j", "route"))
        assert [r["dst"] for r in routes] == [made.subnet]  # no default route: nothing leaves
        # The host's name and every other host's resolve inside it, without DNS.
        found = ipaddress.ip_address(in_host(host.namespace, "getent", "hosts", "h2").split()[0])
        # glibc may answer in IPv4-mapped IPv6 (::ffff:a.b.c.d): the same address.
        found = getattr(found, "ipv4_mapped", None) or found
        assert str(found) == made.hosts[2].address
    # Nothing of the set is in the machine's own namespace.
    own = {link["ifname"] for link in hosts._json(["link"])}
    assert not own & {"br0", "kosmoss0", "p0", "p1", "p2"}


@needs_hosts
def test_the_hosts_reach_each_other_over_the_bridge(made_hosts):
    made = made_hosts(2)
    server = subprocess.Popen(made.hosts[1].command(
        [sys.executable, "-c", "import socket; s = socket.create_server(('', 5201)); "
         "c, a = s.accept(); c.sendall(a[0].encode())"]), stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    client = subprocess.run(made.hosts[0].command(
        [sys.executable, "-c", "import socket; print(socket.create_connection(("
                               f"'{made.hosts[1].address}', 5201), timeout=10)"
                               ".recv(64).decode())"]),
        capture_output=True, text=True, timeout=30)
    server.wait(timeout=10)
    assert client.stdout.strip() == made.hosts[0].address  # the server saw host 0's address


@needs_hosts
def test_a_leftover_set_of_another_run_is_refused_then_found_and_removed_by_ghosts(tmp_path):
    code = ("from kosmoss.launch import hosts; import time\n"
            "with hosts.host_set(2, 1e9, purpose='run leftover-test') as made:\n"
            "    print(made.set_id, flush=True); time.sleep(300)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=REPO)
    set_id = owner.stdout.readline().strip()
    try:
        os.kill(owner.pid, signal.SIGKILL)  # nothing of the owner's runs: the set stays
        owner.wait()
        assert len(namespaces_of(set_id)) == 3
        with pytest.raises(UsageError, match=rf"--hosts netns: host set {set_id} was left by "
                                             r"another run \(its owner \(run leftover-test"):
            hosts.make_hosts(2, None, purpose="test", owner=None)
        env = {**os.environ, "KOSMOSS_HOME": str(tmp_path)}
        listed = json.loads(subprocess.run([sys.executable, "-m", "kosmoss", "ghosts", "--json"],
                                           capture_output=True, text=True, env=env).stdout)
        mine = [g for g in listed if g["kind"] == "hosts-left" and set_id in g["reason"]]
        assert len(mine) == 1 and mine[0]["pid"] is None
        assert mine[0]["run_id"] == "leftover-test" and mine[0]["killable"]
        killed = subprocess.run([sys.executable, "-m", "kosmoss", "ghosts", "--kill"],
                                capture_output=True, text=True, env=env)
        assert killed.returncode == 0, killed.stderr
        assert f"removed host set(s) {set_id}" in killed.stdout
        assert not namespaces_of(set_id)
        assert not (hosts.STATE_DIR / f"{set_id}.json").exists()
    finally:
        remove_set(set_id)


@needs_hosts
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_owner_removes_its_hosts_and_what_runs_in_them(sig):
    code = ("import subprocess, sys, time\nfrom kosmoss.launch import hosts\n"
            "with hosts.host_set(2, None, purpose='run stop-test') as made:\n"
            "    sleeper = subprocess.Popen(made.hosts[1].command(['sleep', '300']))\n"
            "    print(made.set_id, sleeper.pid, flush=True); time.sleep(300)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
    set_id, sleeper = owner.stdout.readline().split()
    try:
        assert len(namespaces_of(set_id)) == 3
        os.kill(owner.pid, sig)
        owner.wait(timeout=30)
        assert not namespaces_of(set_id)
        assert not os.path.exists(f"/proc/{sleeper}")  # killed with its host
    finally:
        remove_set(set_id)


@needs_hosts
def test_the_hosts_command_up_exec_status_down(tmp_path):
    env = {**os.environ, "KOSMOSS_HOME": str(tmp_path)}

    def kosmoss(*args):
        return subprocess.run([sys.executable, "-m", "kosmoss", "hosts", *args],
                              capture_output=True, text=True, env=env, timeout=60)

    up = kosmoss("up", "--count", "2", "--link-rate", "1gbit", "--json")
    made = json.loads(up.stdout)
    try:
        assert made["rate"] == "1gbit" and len(made["hosts"]) == 2
        assert made["torchrun"][1].startswith(f"ip netns exec {made['hosts'][1]['namespace']} "
                                              "env GLOO_SOCKET_IFNAME=kosmoss0")
        # the hosts share this machine's cores: each rank its share, as a simulated node's
        share = f"OMP_NUM_THREADS={cores_per_process(2)} torchrun"
        assert all(share in line for line in made["torchrun"]), made["torchrun"]
        assert "--node-rank 1 --rdzv-backend c10d --rdzv-endpoint " \
               f"{made['hosts'][0]['address']}:29400" in made["torchrun"][1]
        shown = kosmoss("exec", "--set", made["set_id"], "1", "--", "sh", "-c",
                        "echo $GLOO_SOCKET_IFNAME $MASTER_ADDR; ip -br -4 addr show kosmoss0")
        assert shown.stdout.split()[:2] == ["kosmoss0", made["hosts"][0]["address"]]
        assert f"{made['hosts'][1]['address']}/24" in shown.stdout
        assert made["set_id"] in kosmoss("status").stdout
        assert kosmoss("exec", "--set", made["set_id"], "5", "--", "true").returncode == 2
        assert kosmoss("up", "--count", "0").returncode == 2
        bad = kosmoss("up", "--link-rate", "fast")
        assert (bad.returncode, bad.stderr.count("\n")) == (2, 1)
        down = kosmoss("down", made["set_id"])
        assert down.returncode == 0 and not namespaces_of(made["set_id"])
        assert kosmoss("down", "nosuchset").returncode == 2
    finally:
        remove_set(made["set_id"])


# --- Slurm on the hosts: its configuration, and no Slurm ----------------------------

def _a_set(count, set_id="cafe0001"):
    addresses = [f"10.213.7.{i + 1}" for i in range(count)]
    made = tuple(hosts.Host(i, f"{hosts.PREFIX}{set_id}-h{i}", address)
                 for i, address in enumerate(addresses))
    return hosts.HostSet(set_id, made, "10.213.7.0/24", None, "test", None, 0.0)


@pytest.mark.parametrize("count", [2, 3, 4])
def test_slurm_conf_names_every_host_as_a_node_at_its_address(tmp_path, count):
    conf = host_slurm.conf_text(_a_set(count), tmp_path, cores=2)
    settings_ = dict(line.split("=", 1) for line in conf.splitlines()
                     if "=" in line and not line.startswith(("NodeName", "PartitionName")))
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert settings_["SlurmctldHost"] == "h0(10.213.7.1)"
    assert nodes == [f"NodeName=h{i} NodeAddr=10.213.7.{i + 1} CPUs=2 State=UNKNOWN"
                     for i in range(count)]
    names = ",".join(f"h{i}" for i in range(count))
    assert f"PartitionName=hosts Nodes={names} Default=YES" in conf
    # every slurmd has its own spool, pid file and log: they share one file system
    assert {settings_[key].endswith("%n") or "-%n." in settings_[key]
            for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile")} == {True}


@given(st.text(min_size=1, max_size=40))
def test_each_cluster_numbers_its_jobs_from_its_own_start(set_id):
    first = host_slurm.first_job_id(set_id)
    assert 1000 <= first < 67_043_328 - 1_000_000  # Slurm's MaxJobId, with room for jobs
    assert first == host_slurm.first_job_id(set_id)


def test_two_clusters_start_their_job_ids_apart():
    firsts = {host_slurm.first_job_id(f"{4_000_000_000 - 7919 * i:08x}") for i in range(200)}
    assert len(firsts) == 200  # a new cluster's job does not land in an old run's folder


def test_a_node_runs_in_its_hosts_network_with_its_own_hostname_and_hosts_file():
    host = _a_set(2).hosts[1]
    argv = host_slurm.node_command(host, ["slurmd", "-f", "/x/slurm.conf"])
    assert argv[:5] == ["unshare", "--mount", "--uts", "--propagation", "private"]
    assert f"--net={hosts.NETNS_DIR / host.namespace}" in argv
    assert argv[-3:] == ["slurmd", "-f", "/x/slurm.conf"]
    script = argv[argv.index("-c") + 1]
    assert f"/etc/netns/{host.namespace}/hosts /etc/hosts" in script
    assert "hostname h1 " in script and script.endswith('exec "$@"')


@needs_hosts
def test_hosts_up_slurm_without_slurm_is_one_line_and_makes_nothing(tmp_path):
    tools = tmp_path / "bin"  # iproute2, no Slurm
    tools.mkdir()
    for tool in ("ip", "tc"):
        (tools / tool).symlink_to(shutil.which(tool))
    before = hosts.existing_namespaces()
    proc = subprocess.run([sys.executable, "-m", "kosmoss", "hosts", "up", "--slurm"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(tools), "KOSMOSS_HOME": str(tmp_path)})
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), proc.stderr
    assert "--slurm: slurmctld, slurmd, sbatch, munged, unshare, nsenter not found" in proc.stderr
    assert hosts.existing_namespaces() == before


SLURM_MISSING = host_slurm.slurm_missing()


@pytest.mark.skipif(SLURM_MISSING is not None, reason=f"Slurm across hosts: {SLURM_MISSING}")
@pytest.mark.parametrize("count", [3, 4])
def test_slurm_on_hosts_runs_a_task_on_each_node_and_goes_with_them(tmp_path, count):
    """One srun task per node, each on its own host (its hostname, its address); `hosts
    down` ends every daemon and removes the cluster's folder."""
    env = {**os.environ, "KOSMOSS_HOME": str(tmp_path)}

    def kosmoss(*args):
        return subprocess.run([sys.executable, "-m", "kosmoss", "hosts", *args],
                              capture_output=True, text=True, env=env, timeout=120)

    up = kosmoss("up", "--count", str(count), "--slurm", "--json")
    assert up.returncode == 0, up.stderr
    made = json.loads(up.stdout)
    folder = host_slurm.slurm_folder(made["set_id"])
    try:
        assert f"sbatch -N {count} --ntasks-per-node 1 slurm/submit.sbatch" in made["sbatch"]
        shown = kosmoss("exec", "--set", made["set_id"], "0", "--", "srun", "-N", str(count),
                        "--ntasks-per-node", "1", "sh", "-c",
                        "echo $(hostname) $(ip -br -4 addr show kosmoss0 | awk '{print $3}')")
        assert shown.returncode == 0, shown.stderr
        assert sorted(shown.stdout.split("\n")[:-1]) == [
            f"h{h['index']} {h['address']}/24" for h in made["hosts"]]
        daemons = [p.pid for p in psutil.process_iter(["cmdline"])
                   if str(folder) in " ".join(p.info["cmdline"] or [])]
        assert len(daemons) == 1 + count  # slurmctld and a slurmd per host
        assert kosmoss("down", made["set_id"]).returncode == 0
        assert not [pid for pid in daemons if psutil.pid_exists(pid) and
                    psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not folder.exists()
    finally:
        remove_set(made["set_id"])
