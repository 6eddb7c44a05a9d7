"""python -m kosmoss.bench.ddp_anatomy: every variant measured on real gloo ranks, in the
order that splits the cost of N-rank DDP into its parts; bad input is one line."""
import json
import subprocess
import sys

import pytest
import torch
from helpers import REPO

from kosmoss.bench import ddp_anatomy


def _anatomy(*args):
    return subprocess.run([sys.executable, "-m", "kosmoss.bench.ddp_anatomy", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU])])
def test_every_variant_runs_and_ddp_moves_the_whole_gradient(random_dataset, tmp_path, device):
    out = tmp_path / "rows.json"
    done = _anatomy("--dataset", random_dataset.path, "--batch-size", "64", "--steps", "3",
                    "--repeats", "1", "--device", device, "--json", out)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == [v.name for v in ddp_anatomy.variants(2, device)]
    assert all(r["samples_per_s"] > 0 for r in rows) and rows[0]["ratio_to_1_process"] == 1.0
    gradient_bytes = 4 * sum(p.numel() for p in _model(random_dataset).parameters())
    for row in rows:
        buckets = row["bucket_bytes"]
        assert (buckets is None) == ("DDP" not in row["variant"]), row
        if buckets:  # DDP's buckets after its rebuild hold every gradient once
            assert sum(int(b) for b in buckets.split(",")) == gradient_bytes
    assert "x 1 process" in done.stdout  # the table


def _model(dataset):
    from kosmoss.core.defaults import DEFAULT_HIDDEN
    from kosmoss.model import mlp

    return mlp(dataset.n_x, DEFAULT_HIDDEN, dataset.n_y)


def test_bad_input_is_one_line(tmp_path):
    for args, flag in ((("--dataset", tmp_path, "--ranks", "1"), "--ranks 1"),
                       (("--dataset", tmp_path), f"--dataset {tmp_path}"),
                       (("--dataset", tmp_path, "--batch-size", "7"), "--batch-size 7"),
                       (("--dataset", tmp_path, "--variants", "0"), "--variants 0"),
                       *([] if torch.cuda.is_available() else
                         [(("--dataset", tmp_path, "--device", "cuda"), "--device cuda")])):
        done = _anatomy(*args)
        assert done.returncode == 2 and flag in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
