"""The matrix: why a set-up is skipped, and the command each one runs."""
import subprocess
import sys
from pathlib import Path

import pytest

from kosmoss.bench import baselines, setups
from kosmoss.bench.setups import BY_ID, MATRIX, Machine, Plan, command, skip_reason
from kosmoss.data.splits import SPLITS

GIB = 2**30


def machine(**changes) -> Machine:
    facts = dict(cuda=True, bf16=True, horovod_missing=None, scripts_missing=None,
                 free_ram_bytes=64 * GIB, free_gpu_bytes=70 * GIB)
    return Machine(**{**facts, **changes})


def plan(n_samples=2048, **changes) -> Plan:
    facts = dict(dataset=Path("/data/tiny"), n_samples=n_samples, n_train=int(0.8 * n_samples),
                 bytes_per_sample=4 * (4128 + 552), batch_size=256, gpu_batch_size=512,
                 steps=30, repeats=2)
    return Plan(**{**facts, **changes})


def test_a_machine_with_everything_runs_every_row():
    assert [skip_reason(s, machine(), plan()) for s in MATRIX] == [None] * len(MATRIX)


def test_no_gpu_skips_exactly_the_gpu_rows():
    reasons = {s.id: skip_reason(s, machine(cuda=False, bf16=False, free_gpu_bytes=0), plan())
               for s in MATRIX}
    gpu_rows = {s.id for s in MATRIX if s.device == "gpu"}
    ladder = {f"ladder-{name}" for name in ("host", "resident", "bf16", "fused", "compile",
                                            "graphs", "graphs-k8", "bf16-store", "top-65536",
                                            "top-max")}
    assert gpu_rows == {"raw-gpu", "lightning-gpu", "fabric-gpu", "kosmoss-gpu", "nodes-gpu-2x1",
                        "raw-gpu-bf16", "kosmoss-gpu-bf16", "horovod-gpu-2", "kosmoss-gpu-top",
                        "kosmoss-gpu-top-max"} | ladder
    assert {i for i, r in reasons.items() if r} == gpu_rows
    assert {reasons[i] for i in gpu_rows} == {"no CUDA GPU"}


def test_no_bf16_and_no_horovod():
    reasons = {s.id: skip_reason(s, machine(bf16=False, horovod_missing="Horovod not installed: "
                                            "run scripts/install_horovod.sh"), plan())
               for s in MATRIX}
    assert reasons["kosmoss-gpu-bf16"].startswith("this GPU has no bf16")
    assert reasons["raw-gpu-bf16"] == reasons["kosmoss-gpu-bf16"]
    assert reasons["horovod-cpu-2"] == reasons["horovod-gpu-2"] == \
        "Horovod not installed: run scripts/install_horovod.sh"
    assert reasons["kosmoss-gpu"] is None and reasons["ddp-cpu-2"] is None


def test_without_the_entry_points_only_the_baselines_run():
    reasons = {s.id: skip_reason(s, machine(scripts_missing="not a checkout"), plan())
               for s in MATRIX}
    assert {i for i, r in reasons.items() if r} == {s.id for s in MATRIX if s.kind == "kosmoss"}


def test_the_raw_loop_is_skipped_when_its_tensors_do_not_fit():
    large = plan(n_samples=1_048_576)  # 18 GB of tensors
    reason = skip_reason(BY_ID["raw-cpu"], machine(free_ram_bytes=16 * GIB), large)
    assert reason == ("its tensors need 16.5 GiB of RAM, 16.0 GiB free: use a smaller --dataset")
    assert "GPU memory" in skip_reason(BY_ID["raw-gpu"], machine(free_gpu_bytes=10 * GIB), large)
    assert skip_reason(BY_ID["raw-gpu"], machine(), large) is None
    assert skip_reason(BY_ID["lightning-cpu"], machine(free_ram_bytes=16 * GIB), large) == reason
    assert skip_reason(BY_ID["raw-cpu"], machine(free_ram_bytes=GIB), None) is None  # --list


def test_horovod_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(setups.importlib.util, "find_spec", lambda name: None)
    assert setups.horovod_missing() == "Horovod not installed: run scripts/install_horovod.sh"


def test_horovod_that_does_not_import_or_has_no_horovodrun(monkeypatch):
    monkeypatch.setattr(setups.importlib.util, "find_spec", lambda name: object())
    failing = subprocess.CompletedProcess([], 1, "", "Traceback\nImportError: undefined symbol\n")
    monkeypatch.setattr(setups.subprocess, "run", lambda *a, **k: failing)
    assert setups.horovod_missing() == ("import horovod.torch fails (ImportError: undefined "
                                        "symbol): run scripts/install_horovod.sh")
    no_gloo = subprocess.CompletedProcess([], 3, "", "")
    monkeypatch.setattr(setups.subprocess, "run", lambda *a, **k: no_gloo)
    assert setups.horovod_missing().startswith("Horovod was built without gloo")
    monkeypatch.setattr(setups.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess([], 0, "", ""))
    monkeypatch.setattr(setups, "horovodrun", lambda: None)
    assert setups.horovod_missing().startswith("horovodrun not on PATH")


def test_horovod_is_probed_only_for_its_rows(monkeypatch):
    probed = []
    monkeypatch.setattr(setups, "horovod_missing", lambda: probed.append(1) or "missing")
    assert setups.probe([BY_ID["raw-cpu"]]).horovod_missing is None and not probed
    assert setups.probe([BY_ID["horovod-cpu-2"]]).horovod_missing == "missing"


def test_this_checkout_has_its_entry_points():
    assert setups.scripts_missing() is None
    assert (setups.scripts_root() / "trainup_gpu.py").is_file()


def test_kosmoss_rows_run_the_real_entry_points(tmp_path):
    out = tmp_path / "r.json"
    ddp = command(BY_ID["ddp-cpu-2"], plan(), out)
    scripts = setups.scripts_root()
    assert ddp[:4] == [sys.executable, str(scripts / "trainup_cpu.py"), "--num-processes", "2"]
    def value(flag):
        return ddp[ddp.index(flag) + 1]

    assert value("--max-steps") == "31" and value("--batch-size") == "256"  # 1 warm-up + 30
    assert value("--result-json") == str(out) and value("--dataset") == "/data/tiny"
    assert "--no-progress" in ddp
    nodes = command(BY_ID["nodes-gpu-2x1"], plan(), out)
    assert nodes[1:6] == [str(scripts / "trainup_gpu.py"), "--num-nodes", "2", "--gpus", "1"]
    assert "--require-gpu" in nodes and nodes[nodes.index("--batch-size") + 1] == "512"
    bf16 = command(BY_ID["kosmoss-gpu-bf16"], plan(), out)
    assert bf16[bf16.index("--precision") + 1] == "bf16-mixed"
    horovod = command(BY_ID["horovod-cpu-2"], plan(), out)
    assert Path(horovod[0]).name == "horovodrun" and horovod[1:4] == ["-np", "2", "--gloo"]
    # Every CPU row runs through trainup_cpu.py: it has every flag a CPU set-up needs.
    assert horovod[4:8] == [sys.executable, str(scripts / "trainup_cpu.py"), "--strategy",
                            "horovod"]
    cpu_nodes = command(BY_ID["nodes-cpu-2x1"], plan(), out)
    assert cpu_nodes[1:6] == [str(scripts / "trainup_cpu.py"), "--num-nodes", "2",
                              "--num-processes", "1"]


def test_baseline_rows_run_the_baselines_module(tmp_path):
    raw = command(BY_ID["raw-gpu-bf16"], plan(), tmp_path / "r.json")
    assert raw[1:4] == ["-m", "kosmoss.bench.baselines", "raw"]
    assert raw[raw.index("--device") + 1] == "cuda" and "--bf16" in raw
    lightning = command(BY_ID["lightning-cpu"], plan(), tmp_path / "r.json")
    assert lightning[3] == "lightning" and lightning[lightning.index("--device") + 1] == "cpu"
    loader = command(BY_ID["loader-course"], plan(), tmp_path / "r.json")
    assert loader[3] == "loader-course" and loader[loader.index("--device") + 1] == "cpu"


def test_cpu_rows_hide_the_gpu():
    assert setups.environment(BY_ID["nodes-cpu-2x1"]) == {"KOSMOSS_MACHINE_GPU": "none"}
    assert setups.environment(BY_ID["nodes-gpu-2x1"]) == {}


def test_baselines_split_like_a_kosmoss_run():
    assert baselines.SPLITS == SPLITS


@pytest.mark.parametrize("text, line", [("a\n\n  b  \n\n", "b"), ("", "no output")])
def test_last_line(text, line):
    assert setups.last_line(text) == line


def test_the_ladder_rows_run_the_ladder_one_rung_each():
    ladder = [s for s in MATRIX if s.kind == "ladder" and s.device == "gpu"]
    assert [s.versus for s in ladder[1:8]] == [s.id for s in ladder[:7]]  # ÷ the rung below
    argv = command(BY_ID["ladder-graphs"], plan(), Path("/tmp/row.json"))
    assert argv[1:3] == ["-m", "kosmoss.bench.ladder"]
    assert argv[argv.index("--rungs") + 1] == "graphs" and argv[argv.index("--device") + 1] == "cuda"
    assert argv[argv.index("--batch-size") + 1] == "512"  # the plan's GPU batch
    top = command(BY_ID["ladder-top-max"], plan(), Path("/tmp/row.json"))
    assert top[top.index("--batch-size") + 1] == "1024"  # 1638 training samples
    cpu = command(BY_ID["compile-cpu"], plan(), Path("/tmp/row.json"))
    assert cpu[cpu.index("--rungs") + 1] == "compile-fp32" and "cpu" in cpu
    assert "GPU memory" in skip_reason(BY_ID["ladder-resident"], machine(free_gpu_bytes=GIB),
                                       plan(n_samples=1_048_576))
    kosmoss_top = command(BY_ID["kosmoss-gpu-top-max"], plan(), Path("/tmp/row.json"))
    assert "--cuda-graphs" in kosmoss_top and "--compile" in kosmoss_top
    assert kosmoss_top[kosmoss_top.index("--batch-size") + 1] == "1024"
    assert BY_ID["kosmoss-gpu-top"].versus == "ladder-bf16-store"  # the same features
