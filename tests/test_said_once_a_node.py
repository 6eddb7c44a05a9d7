"""Bad input under a launcher that ends every rank once one exits (torchrun, srun): every
rank finds it, local rank 0 says it, and the others exit after it, not before: a silent rank
that left first got the speaking one killed mid-way (no line at all, seen in CI 2026-11-28).
The launcher here is a few lines that do what torchrun's agent does (SIGTERM to the rest
when one rank fails); the speaking rank is made slower than the others."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

RANK = textwrap.dedent("""
    import os, sys, time
    from kosmoss.core.commandline import OneLineParser, run_command
    from kosmoss.core.errors import UsageError

    from kosmoss.core import commandline

    commandline.SPEAKER_WAIT_S = float(os.environ.get("SPEAKER_WAIT_S", "20"))
    if os.environ["LOCAL_RANK"] == "0":
        time.sleep(float(os.environ["SPEAKER_LATE_S"]))  # imports slower on a loaded node
        if sys.argv[1] == "rank-1-only":  # what only rank 1 finds (its device, its file)
            time.sleep(60)
            sys.exit(0)

    def bad():
        raise UsageError("--max-epochs 0: must be >= 1")

    if sys.argv[1] == "parser":
        OneLineParser(prog="rank.py").parse_args(["--no-such-flag"])
    sys.exit(run_command("rank.py", bad))
""")


def _launch(kind: str, ranks: int, speaker_late_s: float, **extra: str):
    """Start ``ranks`` ranks; when the first ends with an error, SIGTERM the others."""
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "SPEAKER_LATE_S": str(speaker_late_s),
           **extra}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, kind], env={**env, "LOCAL_RANK": str(i)},
                              stderr=subprocess.PIPE, text=True) for i in range(ranks)]
    deadline = time.monotonic() + 60
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [(proc.wait(timeout=60), proc.stderr.read()) for proc in procs]


@pytest.mark.parametrize("kind, line", [
    ("run", "rank.py: error: --max-epochs 0: must be >= 1"),
    ("parser", "rank.py: error: unrecognized arguments: --no-such-flag (see --help)"),
])
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_speaking_rank_says_it_even_when_it_is_the_slowest(kind, line, ranks):
    ended = _launch(kind, ranks, speaker_late_s=1.5)
    said = [err for _, err in ended if err.strip()]
    assert said == [line + "\n"], ended
    assert ended[0][0] == 2, ended  # the speaker ended on its own, not by the SIGTERM


def test_a_silent_rank_whose_speaker_is_gone_does_not_wait():
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "LOCAL_RANK": "1",
           "SPEAKER_LATE_S": "0"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", RANK, "run"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "", proc.stderr
    assert time.monotonic() - started < 20  # no sibling says it: nothing to wait for


def test_what_only_a_silent_rank_finds_it_says_itself_once_the_wait_is_over():
    ended = _launch("rank-1-only", 2, speaker_late_s=0, SPEAKER_WAIT_S="1")
    assert ended[1] == (2, "rank.py: error: --max-epochs 0: must be >= 1\n"), ended
    assert ended[0] == (-signal.SIGTERM, ""), ended  # ended by the launcher, as torchrun does


def test_under_torchrun_inside_srun_only_local_rank_0_speaks():
    from kosmoss.core.commandline import _rank_that_speaks, _rank_that_stays_silent

    srun_task = {"SLURM_LOCALID": "0", "SLURM_PROCID": "0", "TORCHELASTIC_RUN_ID": "x"}
    ranks = [{**srun_task, "LOCAL_RANK": str(i)} for i in range(3)]
    assert [_rank_that_speaks(env) for env in ranks] == [True, False, False]
    assert [_rank_that_stays_silent(env) for env in ranks] == [False, True, True]
    assert not _rank_that_speaks({})  # a process no launcher started waits for nobody
