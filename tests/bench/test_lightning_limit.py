"""The bench's Lightning rows: the raw loop's step inside Trainer(barebones=True), and the
raw loop on Lightning Fabric, so that a run shows how much of the limit Lightning's own
loop keeps, what kosmoss adds, and what a loop of one's own on Fabric would keep."""
import pytest
import torch

from kosmoss.bench.baselines import LOOPS, lightning_loop, raw_loop
from kosmoss.bench.figures import checks, complete
from kosmoss.bench.setups import BY_ID
from kosmoss.data.store import open_dataset

CPU = torch.device("cpu")


def test_lightnings_loop_does_the_raw_loops_work_bit_for_bit(shared_home):
    tiny = open_dataset(shared_home / "data" / "tiny", verify=False)
    raw = raw_loop(tiny, 256, 9, CPU, bf16=False, seed=42)
    alone = lightning_loop(tiny, 256, 9, CPU, bf16=False, seed=42)
    assert alone["global_step"] == raw["global_step"] == 10
    # 7 batches an epoch: a validation after the first epoch and one at the end, each the
    # same loss to the last bit (same data, weights, batch order, step).
    assert [(p["step"], p["val_loss"]) for p in alone["val_curve"]] == \
        [(p["step"], p["val_loss"]) for p in raw["val_curve"]]
    assert len(alone["val_curve"]) == 2
    assert alone["samples_per_s"] > 0 and alone["page_faults_per_step"] is not None


def test_the_fabric_row_is_the_raw_loop_bit_for_bit_through_fabric(shared_home, monkeypatch):
    from lightning_fabric.wrappers import _FabricOptimizer

    tiny = open_dataset(shared_home / "data" / "tiny", verify=False)
    raw = raw_loop(tiny, 256, 9, CPU, bf16=False, seed=42)
    seen, original = [], _FabricOptimizer.step
    monkeypatch.setattr(_FabricOptimizer, "step",
                        lambda self, *a, **k: seen.append(self) or original(self, *a, **k))
    fabric = LOOPS["fabric"](tiny, 256, 9, CPU, bf16=False, seed=42)
    assert len(seen) == 10  # every step went through Fabric's optimizer wrapper
    assert [(p["step"], p["val_loss"]) for p in fabric["val_curve"]] == \
        [(p["step"], p["val_loss"]) for p in raw["val_curve"]]
    assert fabric["samples_per_s"] > 0 and fabric["global_step"] == 10


def rows(with_lightning: bool, with_fabric: bool = False) -> dict:
    def row(setup_id, *speeds):
        return {"id": setup_id, "status": "measured", "batch_size": 256, "samples_per_s": speeds[0],
                "repeats": [{"samples_per_s": s} for s in speeds]}
    found = {"raw-cpu": row("raw-cpu", 100.0, 110.0),
             "kosmoss-cpu": row("kosmoss-cpu", 81.0, 89.1)}
    if with_lightning:
        found["lightning-cpu"] = row("lightning-cpu", 90.0, 99.0)
    if with_fabric:
        found["fabric-cpu"] = row("fabric-cpu", 97.0, 106.7)
    complete([BY_ID[i] for i in found], found)
    return found


def verdict(found: dict) -> dict:
    return {c["name"]: c for c in checks(found, 2048)}[
        "kosmoss on 1 CPU process ÷ raw CPU loop, batch 256-1023"]


def test_the_ratio_check_says_how_much_is_lightnings_and_how_much_kosmoss():
    check = verdict(rows(with_lightning=True))
    assert check["value"] == pytest.approx(0.81) and check["passed"] is False
    assert check["context"] == ("Lightning's loop alone, lightning-cpu: 0.90 of the limit; "
                                "kosmoss ÷ it: 0.90")
    assert verdict(rows(with_lightning=False))["context"] is None
    assert verdict(rows(with_lightning=True, with_fabric=True))["context"].endswith(
        "kosmoss ÷ it: 0.90; the raw loop on Fabric, fabric-cpu: 0.97")
