"""Nothing outlives its launcher: ``kill -9`` of the process the user started takes every
rank, node and data worker of the run with it within seconds, and frees the port
(kosmoss.launch: the parent-death signal). A run.json left ``running`` is then settled
``killed`` (kosmoss.launch.records.settle_if_gone, what ``kosmoss ghosts`` calls). A killed data
worker ends its run with one line."""
import os
import signal
import time

import pytest
from fault_helpers import (end_all, exit_code, processes_of, rank_1_started, records, run_dir,
                           start, stderr_of, trained, wait_for)

from kosmoss.launch import records as run_records
from kosmoss.launch.ports import port_is_free

GONE_WITHIN_S = 10


def _assert_all_gone(home, port):
    start = time.monotonic()
    wait_for(lambda: not processes_of(home), "every process of the run to end",
             timeout=GONE_WITHIN_S)
    assert time.monotonic() - start <= GONE_WITHIN_S
    wait_for(lambda: port_is_free(port), f"port {port} to be free", timeout=5)


@pytest.mark.slow
def test_sigkill_of_the_launcher_during_start_up_takes_rank_1_with_it(shared_home, tmp_path):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-processes", "2")
    try:
        rank_1 = wait_for(lambda: rank_1_started(launcher), "Lightning to start rank 1")
        port = int(rank_1.environ()["MASTER_PORT"])
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _assert_all_gone(home, port)  # without the parent-death signal rank 1 waited 2 min
        folder = run_dir(home)
        assert run_records.read_run(folder)["state"] == run_records.RUNNING  # nobody said
        assert run_records.settle_if_gone(folder) == run_records.KILLED
        assert run_records.read_run(folder)["state"] == run_records.KILLED
    finally:
        end_all(home, launcher)


@pytest.mark.slow
def test_sigkill_of_the_simulated_nodes_parent_ends_the_training_nodes(shared_home, tmp_path):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-nodes", "2")
    try:
        wait_for(lambda: trained(home, ranks=2, step=1), "both nodes to train a step")
        port = next(r["master_port"] for r in records(home) if r.get("master_port"))
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _assert_all_gone(home, port)  # the nodes trained on, in their own sessions, before
        assert run_records.settle_if_gone(run_dir(home)) == run_records.KILLED
    finally:
        end_all(home, launcher)


@pytest.mark.slow
def test_sigkill_of_the_launcher_takes_its_data_workers_with_it(shared_home, tmp_path):
    """Data workers are torch's to end: each checks every MP_STATUS_CHECK_INTERVAL (5 s)
    that its parent is still the rank that forked it, and exits otherwise."""
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-workers", "2")
    try:
        wait_for(lambda: trained(home, ranks=1, step=1), "a trained step")
        # Persistent workers: the training loader's 2 and, after a validation, its own 2.
        workers = {r["pid"] for r in records(home) if r["role"] == "worker"} & _pids(home)
        assert len(workers) >= 2
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        start_s = time.monotonic()
        wait_for(lambda: not processes_of(home), "the data workers to end",
                 timeout=GONE_WITHIN_S)
        assert time.monotonic() - start_s <= GONE_WITHIN_S
    finally:
        end_all(home, launcher)


def _pids(home):
    return {proc.pid for proc in processes_of(home)}


@pytest.mark.slow
def test_a_killed_data_worker_ends_the_run_with_one_line(shared_home, tmp_path):
    home = tmp_path / "home"
    launcher = start(home, shared_home / "data" / "tiny", "--num-workers", "1")
    try:
        wait_for(lambda: trained(home, ranks=1, step=1), "a trained step")
        worker = next(r["pid"] for r in records(home) if r["role"] == "worker")
        os.kill(worker, signal.SIGKILL)
        assert exit_code(home, launcher, timeout=60) == 1
        lines = [line for line in stderr_of(home).splitlines()
                 if line.startswith("trainup_cpu.py:")]
        assert len(lines) == 1 and f"a data worker (pid {worker}) of this rank died" in lines[0]
        assert run_records.read_run(run_dir(home))["state"] == run_records.FAILED
        wait_for(lambda: not processes_of(home), "every process of the run to end", timeout=10)
    finally:
        end_all(home, launcher)
