"""Hang helpers without a hang: which errors are collective timeouts (on the messages torch
2.13's gloo, NCCL, TCPStore and monitored_barrier print, copied from real runs), the ranks
a monitored_barrier error names, and the flight-recorder variables torch really reads.
The real hang is in test_diagnose_faults.py."""
from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from kosmoss.diagnose import hang

GLOO_RECV = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
             "Timed out waiting 4000ms for recv operation to complete")
PEER_GONE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
             "closed by peer [127.0.0.1]:2714. This is typically caused by a remote worker "
             "crashing.")
BARRIER = "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms"
NCCL = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 milliseconds")
STORE = "Timed out after 121 seconds waiting for clients. 1/2 clients joined."


@pytest.mark.parametrize("error, timeout", [
    (RuntimeError(GLOO_RECV), True),
    (RuntimeError(BARRIER), True),
    (RuntimeError(NCCL), True),
    (torch.distributed.DistStoreError(STORE), True),
    (RuntimeError(PEER_GONE), False),  # a dead peer, not a timeout
    (RuntimeError("DataLoader worker (pid 42) timed out after 5 seconds"), False),
    (ValueError("timeout must be positive"), False),
])
def test_which_errors_are_collective_timeouts(error, timeout):
    assert hang.is_collective_timeout(error) is timeout


def test_a_timeout_is_found_behind_the_error_that_wraps_it():
    try:
        try:
            raise RuntimeError(GLOO_RECV)
        except RuntimeError as err:
            raise SystemError("the training loop gave up") from err
    except SystemError as outer:
        assert hang.is_collective_timeout(outer)


def test_the_ranks_a_monitored_barrier_names():
    assert hang.missing_ranks(RuntimeError(BARRIER)) == [1, 3]
    assert hang.missing_ranks(RuntimeError("[Rank 0]: Rank 2 failed to pass monitoredBarrier "
                                           "in 3000 ms")) == [2]
    assert hang.missing_ranks(RuntimeError(PEER_GONE)) == []
    error = hang.StartupTimeout([1, 3], 5, BARRIER)
    assert str(error).startswith("ranks 1, 3 did not reach the start-up check within 5 s")
    assert hang.is_collective_timeout(error)


def test_the_line_says_which_timeout_it_was():
    late = hang.timeout_line(torch.distributed.DistStoreError(STORE), 120)
    assert late.startswith("the ranks did not all meet at start-up within 120 s")
    assert "1/2 clients joined" in late and "--collective-timeout" in late
    try:  # behind Lightning's or torch's wrapping, as it reaches train()
        try:
            raise torch.distributed.DistStoreError(STORE)
        except RuntimeError as err:
            raise RuntimeError("setup failed") from err
    except RuntimeError as outer:
        assert hang.timeout_line(outer, 120) == late
    later = hang.timeout_line(RuntimeError(GLOO_RECV), 120)
    assert later.startswith("a collective waited longer than 120 s (--collective-timeout)")
    startup = hang.StartupTimeout([1], 5, BARRIER)
    assert hang.timeout_line(startup, 5) == str(startup)


def test_flight_recorder_variables_are_those_torch_reads(tmp_path):
    env = hang.flight_recorder_env(tmp_path)
    assert (tmp_path / "flight-recorder").is_dir()  # the recorder does not create it
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_FR_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "flight-recorder" / "rank-")
    # ProcessGroupNCCL's own variables are declared in its header (the CPU wheel has no
    # libtorch_cuda); the flight recorder's are read by libtorch_cpu.
    header = (Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" /
              "c10d" / "ProcessGroupNCCL.hpp")
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not (header.exists() and library.exists()):
        pytest.skip("torch's headers or libtorch_cpu.so not found: not a Linux wheel")
    declared = header.read_text()
    nccl = [name for name in env if f'"{name}"' in declared]
    assert {"TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ENABLE_MONITORING"} <= set(nccl)
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in declared
    with library.open("rb") as handle, mmap.mmap(handle.fileno(), 0,
                                                 access=mmap.ACCESS_READ) as binary:
        unknown = [name for name in env if name not in nccl and name not in declared
                   and binary.find(name.encode() + b"\0") < 0]
    assert unknown == []


def test_the_startup_check_does_nothing_without_a_process_group():
    check = hang.StartupCheck(timeout_s=1)
    check.setup(trainer=None, pl_module=None, stage="fit")
    assert check.passed_in_s is None


def _rank(rank: int, frames, state="sleeping", program=True, record=None):
    """A rank's stack as py-spy reads it: ``frames`` innermost first, in a program's main
    module (``program``; else as at exit, atexit or finalisers running)."""
    from kosmoss.diagnose.runs import RunProcess
    from kosmoss.diagnose.stacks import Frame, ProcessStacks, Thread

    pid = 1000 + rank
    process = RunProcess(pid, 0.0, "rank", rank, f"rank {rank}", record)
    frames = list(frames) + ([("<module>", "trainup_cpu.py", 47)] if frames and program else [])
    stack = [Frame(name, path, line) for name, path, line in frames]
    return ProcessStacks(process, [Thread("MainThread", pid, stack)], state=state)


ALL_REDUCE = [("all_reduce", "site-packages/torch/distributed/distributed_c10d.py", 2800),
              ("training_step", "kosmoss/model.py", 97)]
BROADCAST = [("broadcast", "site-packages/torch/distributed/distributed_c10d.py", 2700),
             ("on_train_batch_end", "kosmoss/run/preemption.py", 70)]
SLEEPS = [("training_step", "kosmoss/model.py", 96), ("fit", "pytorch_lightning/trainer.py", 1)]


def _who(*ranks):
    from kosmoss.diagnose.stacks import RunStacks, group

    return hang.who_hangs(RunStacks(None, list(ranks), group(list(ranks)), False, "py-spy"))


def test_the_rank_the_others_wait_for_is_named_in_the_timeout_line():
    stopped = _who(_rank(0, ALL_REDUCE), _rank(1, SLEEPS, state="stopped"))
    assert stopped.startswith("rank 1 (pid 1001) is stopped (state T") and \
        "`kill -CONT 1001`" in stopped
    straggler = _who(_rank(0, ALL_REDUCE), _rank(1, ALL_REDUCE), _rank(2, SLEEPS))
    assert straggler.startswith("rank 2 (pid 1002) is not in a collective: ") and \
        "training_step" in straggler
    deadlock = _who(_rank(0, ALL_REDUCE), _rank(1, BROADCAST))
    assert deadlock.startswith("the ranks wait in different collectives (a deadlock): ")
    assert "rank 0 (pid 1000) in all_reduce" in deadlock and "rank 1 (pid 1001) in broadcast" \
        in deadlock
    elsewhere = _who(_rank(0, ALL_REDUCE), _rank(1, ALL_REDUCE))  # the rank is elsewhere
    assert elsewhere.startswith("every rank seen here waits in one collective (in all_reduce "
                                "(torch.distributed) from training_step)")
    line = hang.timeout_line(RuntimeError(GLOO_RECV), 30, stopped)
    assert line == f"a collective waited longer than 30 s (--collective-timeout): {stopped}"


def test_a_fresh_step_says_the_run_moves_unless_a_rank_has_stopped_since():
    from kosmoss.diagnose.stacks import RunStacks, _moving_line, group

    def line(*ranks):
        return _moving_line(RunStacks(None, list(ranks), group(list(ranks)), False, "py-spy",
                                      moving_s=4.0))

    assert line(_rank(0, ALL_REDUCE), _rank(1, SLEEPS)) == \
        "a rank reported a step 4.0 s ago: the run moves, and these stacks are one moment of it"
    assert line(_rank(0, ALL_REDUCE), _rank(1, SLEEPS, state="stopped")) == \
        "a rank reported a step 4.0 s ago, but rank 1 (pid 1001) is stopped: the other ranks " \
        "wait for it (`kill -CONT 1001`)"
    two = line(_rank(0, ALL_REDUCE), _rank(1, SLEEPS, state="stopped"),
               _rank(2, SLEEPS, state="stopped"))
    assert "rank 1 (pid 1001), rank 2 (pid 1002) are stopped" in two and \
        "wait for them (`kill -CONT 1001 1002`)" in two


# torch 2.13: DDP's start-up broadcast is in torch/distributed/utils.py, not torch/nn/parallel.
DDP_START = [("_sync_params_and_buffers", "site-packages/torch/distributed/utils.py", 326),
             ("_sync_module_states", "site-packages/torch/distributed/utils.py", 315),
             ("__init__", "site-packages/torch/nn/parallel/distributed.py", 1066),
             ("setup", "pytorch_lightning/strategies/ddp.py", 172)]
# A rank whose own timeout came first, read while it writes its stacks.
DUMPING = [("collect", "kosmoss/diagnose/stacks.py", 180),
           ("dump_stacks", "kosmoss/diagnose/hang.py", 178),
           ("_stacks_on_timeout", "kosmoss/run/train.py", 164),
           ("train", "kosmoss/run/train.py", 108)]


def test_ranks_that_all_time_out_in_one_collective_are_not_taken_for_a_hung_rank():
    """Over a link too slow for the timeout both ranks time out in DDP's first broadcast
    and each reads the other writing its stacks: that rank is no odd one out, and the two
    summaries are no deadlock."""
    from kosmoss.diagnose.stacks import describe

    assert describe(_rank(0, DDP_START)) == \
        ("broadcast of the parameters (DDP start-up) ← setup", True)
    for ranks in ((_rank(0, DDP_START), _rank(1, DUMPING)),
                  (_rank(0, ALL_REDUCE), _rank(1, ALL_REDUCE), _rank(2, DUMPING))):
        said = _who(*ranks)
        assert said.startswith("every rank seen here waits in one collective (") and \
            "the transfer outlasted the timeout (a slow or cut link)" in said, said
    assert _who(_rank(0, DDP_START), _rank(1, SLEEPS)).startswith(
        "rank 1 (pid 1001) is not in a collective")
    assert _who(_rank(0, ALL_REDUCE)) is None  # one rank seen: the others are elsewhere


def test_a_rank_with_no_python_frame_left_is_not_taken_for_the_one_the_others_wait_for():
    """The first rank to time out exits; read by the next one, its main thread has no
    Python frame left. It was marked the odd one out, "not in a collective"."""
    from kosmoss.diagnose.stacks import NO_PYTHON_FRAME, describe, group

    exiting = _rank(0, [])
    assert describe(exiting) == (NO_PYTHON_FRAME, False)
    finalising = _rank(3, [("_del_library", "site-packages/torch/library.py", 665),
                           ("__call__", "weakref.py", 590), ("_exitfunc", "weakref.py", 666)],
                       program=False)
    assert describe(finalising)[0].startswith("exiting: in _del_library") and \
        describe(finalising)[0].endswith("← _exitfunc")
    assert _who(finalising, _rank(1, ALL_REDUCE), _rank(2, ALL_REDUCE)).startswith(
        "every rank seen here waits in one collective")
    ranks = [exiting, _rank(1, DDP_START), _rank(2, DUMPING), _rank(3, DUMPING)]
    assert not [g for g in group(ranks) if g.odd]
    assert _who(*ranks).startswith("every rank seen here waits in one collective (broadcast "
                                   "of the parameters (DDP start-up) ← setup) or timed out")
    # Beside a rank that works on while the others wait, it changes nothing.
    assert _who(exiting, _rank(1, ALL_REDUCE), _rank(2, SLEEPS)).startswith(
        "rank 2 (pid 1002) is not in a collective")


def test_an_exiting_rank_that_failed_on_its_own_is_named_first():
    """An exiting rank is ignored as the odd one out unless its record holds a failure of
    its own: then it failed before the others timed out waiting for it."""
    crashed = _rank(1, [], record={"error": "ValueError: a NaN in the batch\nTraceback"})
    said = _who(_rank(0, ALL_REDUCE), crashed)
    assert said == "rank 1 (pid 1001) failed first and is exiting: ValueError: a NaN in the batch"
    for consequence in (PEER_GONE, "RunFailed: a collective waited longer than 5 s"):
        ended = _rank(1, [], record={"error": f"RuntimeError: {consequence}"})
        assert _who(_rank(0, ALL_REDUCE), _rank(2, ALL_REDUCE), ended).startswith(
            "every rank seen here waits in one collective")
