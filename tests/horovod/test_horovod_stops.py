"""A signal to horovodrun, as a user or a job script sends it. SIGTERM is passed on by its
middlemen (horovod/runner/common/util/safe_shell_exec.py); SIGUSR1 kills horovodrun
(Python's default action), and its middlemen then send the ranks SIGTERM. Either way every
rank stops at one step with its checkpoint, the run is recorded stopped (the ranks' output,
which went through horovodrun, may be gone by then), and a resume under horovodrun ends as
the run never stopped."""
import json
import signal
import subprocess
import sys

import pytest
from helpers import REPO
from hvdrun import HOROVODRUN, clean_env
from reliability.fault_helpers import trained, wait_for
from reliability.stops import Finished, batches_per_epoch, compare

pytestmark = pytest.mark.slow


def _horovodrun(home, args, at=None, sig=None) -> int:
    launcher = subprocess.Popen([str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, *args],
                                cwd=REPO, env=clean_env(home), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        if sig is not None:
            wait_for(lambda: trained(home, 2, at), f"step {at} on 2 ranks")
            launcher.send_signal(sig)
        return launcher.wait(timeout=300)
    finally:
        launcher.kill()


def test_a_signal_to_horovodrun_stops_the_run_and_it_resumes_exactly(horovod_ready, shared_home,
                                                                      tmp_path):
    tiny = shared_home / "data" / "tiny"
    epoch = batches_per_epoch(tiny, 64, world_size=2)
    args = ["trainup_cpu.py", "--strategy", "horovod", "--dataset", str(tiny), "--batch-size",
            "64", "--hidden", "16", "--max-epochs", "100", "--max-steps", str(20 * epoch + 5),
            "--no-progress"]
    assert _horovodrun(tmp_path / "straight", args) == 0
    straight = Finished.of(next((tmp_path / "straight" / "runs").iterdir()))
    for sig, launcher_exit in ((signal.SIGTERM, 0), (signal.SIGUSR1, -signal.SIGUSR1)):
        home = tmp_path / sig.name
        assert _horovodrun(home, args, 2 * epoch + 3, sig) == launcher_exit
        (run_dir,) = (home / "runs").iterdir()
        ranks = run_dir / "processes"
        wait_for(lambda: all(json.loads(p.read_text())["state"] != "running"
                             for p in ranks.iterdir()), "the ranks' records")  # middlemen: 5 s
        run = json.loads((run_dir / "run.json").read_text())
        result = json.loads((run_dir / "result.json").read_text())
        assert (run["state"], result["stopped_by"]) == ("stopped", "SIGTERM"), (sig, run)
        assert (run_dir / "checkpoints" / "preempted.ckpt").is_file()
        assert _horovodrun(home, args + ["--resume", run_dir.name]) == 0
        resumed = Finished.of(run_dir)
        assert resumed.result["resumed_from_step"] == result["global_step"]
        assert compare(resumed, straight) is None, (sig, compare(resumed, straight))
