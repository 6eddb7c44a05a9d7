"""One measurement: its environment, its figures, a failure, a run that hangs."""
import sys
import time
from pathlib import Path

import psutil

from kosmoss.bench import measure
from kosmoss.bench.setups import BY_ID, Plan


def test_figures_are_timed_from_the_launch():
    result = {"train_samples_per_s": 1234.0, "first_step_unix": 1005.0, "val_loss": 0.4,
              "val_curve": [{"step": 7, "unix_time": 1010.0, "val_loss": 0.6}],
              "peak_host_rss_mib": [300.0, 420.0], "peak_gpu_mib": [0.0, 0.0], "world_size": 2}
    found = measure.figures_from(result, launched_unix=1000.0)
    assert found["samples_per_s"] == 1234.0 and found["time_to_first_step_s"] == 5.0
    assert found["val_curve"] == [{"step": 7, "t_s": 10.0, "val_loss": 0.6}]
    assert found["peak_host_mib"] == 420.0 and found["peak_gpu_mib"] is None  # CPU: no GPU peak
    baseline = measure.figures_from({"samples_per_s": 9.0, "first_step_unix": None}, 0.0)
    assert baseline["samples_per_s"] == 9.0 and baseline["time_to_first_step_s"] is None


def test_a_row_starts_clean_of_any_launcher_around_the_bench(monkeypatch, tmp_path):
    for name, value in (("LOCAL_RANK", "1"), ("MASTER_PORT", "29500"), ("SLURM_NTASKS", "2"),
                        ("TORCHELASTIC_RUN_ID", "x"), ("HOROVOD_RANK", "1"), ("KEEP_ME", "yes")):
        monkeypatch.setenv(name, value)
    env = measure.row_environment(BY_ID["nodes-cpu-2x1"], tmp_path)
    for name in ("LOCAL_RANK", "MASTER_PORT", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID",
                 "HOROVOD_RANK"):
        assert name not in env
    assert env["KEEP_ME"] == "yes" and env["KOSMOSS_HOME"] == str(tmp_path)
    assert env["KOSMOSS_MACHINE_GPU"] == "none"


def tiny_plan(tmp_path, timeout_s=60.0) -> Plan:
    return Plan(dataset=tmp_path / "tiny", n_samples=2048, n_train=1638, bytes_per_sample=18720,
                batch_size=256, gpu_batch_size=512, steps=3, repeats=1, timeout_s=timeout_s)


def test_a_failing_row_reports_its_last_line(monkeypatch, tmp_path):
    script = ("import sys; print('loading'); "
              "print('trainup_cpu.py: error: --x bad', file=sys.stderr); sys.exit(2)")
    monkeypatch.setattr(measure, "command", lambda *args: [sys.executable, "-c", script])
    found = measure.measure_once(BY_ID["kosmoss-cpu"], tiny_plan(tmp_path), tmp_path, repeat=0)
    assert found["error"].startswith("exit code 2: trainup_cpu.py: error: --x bad (log: ")
    assert Path(found["log"]).read_text().startswith("loading")
    assert found["repeat"] == 1 and found["wall_s"] > 0


def test_a_row_that_ran_with_the_wrong_world_size_is_an_error(monkeypatch, tmp_path):
    def fake(setup, plan, result_json):
        body = '{"world_size": 1, "train_samples_per_s": 5.0}'
        return [sys.executable, "-c", f"open({str(result_json)!r}, 'w').write({body!r})"]

    monkeypatch.setattr(measure, "command", fake)
    found = measure.measure_once(BY_ID["ddp-cpu-2"], tiny_plan(tmp_path), tmp_path, repeat=1)
    assert found["error"].startswith("ran with world size 1, not 2")


def test_a_row_that_hangs_is_ended_with_its_children(monkeypatch, tmp_path):
    child_pid = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
              f"'import time; time.sleep(120)']); open({str(child_pid)!r}, 'w').write(str(p.pid)); "
              "time.sleep(120)")
    monkeypatch.setattr(measure, "command", lambda *args: [sys.executable, "-c", script])
    start = time.monotonic()
    found = measure.measure_once(BY_ID["kosmoss-cpu"], tiny_plan(tmp_path, timeout_s=3.0),
                                 tmp_path, repeat=0)
    assert found["error"].startswith("timed out after 3 s")
    assert time.monotonic() - start < 60
    assert ended(int(child_pid.read_text()))


def ended(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
