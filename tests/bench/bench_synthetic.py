"""Synthetic measurements for the bench's tests (no process is run)."""
from kosmoss.bench import figures
from kosmoss.bench.setups import BY_ID


def measured(samples_per_s, val_loss=0.5, curve=(), first=3.0, host=400.0, gpu=None, error=None):
    return {"samples_per_s": samples_per_s, "val_loss": val_loss, "val_curve": list(curve),
            "time_to_first_step_s": first, "peak_host_mib": host, "peak_gpu_mib": gpu,
            "error": error}


def synthetic_rows():
    curve_1 = [{"step": 7, "t_s": 4.0, "val_loss": 0.9},
               {"step": 14, "t_s": 6.0, "val_loss": 0.50}]
    curve_2 = [{"step": 7, "t_s": 8.0, "val_loss": 0.9},
               {"step": 14, "t_s": 11.0, "val_loss": 0.52}]
    slow = [{"step": 14, "t_s": 12.0, "val_loss": 0.8}]
    setups = [BY_ID[i] for i in ("raw-cpu", "kosmoss-cpu", "ddp-cpu-2", "nodes-cpu-2x1",
                                 "loader-course", "loader-kosmoss", "raw-gpu")]
    runs = {
        "raw-cpu": [measured(40.0), measured(44.0)],
        "kosmoss-cpu": [measured(36.0, 0.50, curve_1), measured(38.0, 0.50, curve_1)],
        "ddp-cpu-2": [measured(60.0, 0.51, curve_2), measured(64.0, 0.51, slow)],
        "nodes-cpu-2x1": [measured(50.0, 0.52, curve_2), measured(None, error="exit code 1")],
        "loader-course": [measured(2000.0)],
        "loader-kosmoss": [measured(250000.0)],
    }
    rows = {s.id: figures.build_row(s, 256, runs.get(s.id, []),
                                    skipped=None if s.id in runs else "no CUDA GPU")
            for s in setups}
    return setups, rows
