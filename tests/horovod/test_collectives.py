"""The Horovod strategy's reduce / all_gather / broadcast / barrier give what Lightning's
DDPStrategy over torch.distributed (gloo) gives, rank by rank, on the same inputs."""
import json
from pathlib import Path

import pytest

from hvdrun import horovodrun, torchrun

PROBE = Path(__file__).with_name("collectives_probe.py")


@pytest.mark.slow
def test_collectives_match_torch_distributed(horovod_ready, tmp_path):
    for launch, engine in ((horovodrun, "horovod"), (torchrun, "ddp")):
        proc = launch([PROBE, engine, tmp_path], tmp_path / "home", timeout=180)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        horovod = json.loads((tmp_path / f"horovod-rank{rank}.json").read_text())
        ddp = json.loads((tmp_path / f"ddp-rank{rank}.json").read_text())
        assert horovod == ddp
    # And they are right, not merely equally wrong:
    assert horovod["reduce_sum"]["values"] == [4.0, -2.0, 0.5]
    assert horovod["reduce_mean"]["values"] == [2.0, -1.0, 0.25]
    assert horovod["gather_vector"] == {"values": [[0, 1], [1, 2]], "dtype": "torch.int64",
                                        "shape": [2, 2]}
    assert horovod["broadcast_from_1"] == "rank 1" and horovod["reduce_in_place"] is True
    assert (horovod["all_true"], horovod["any_true"]) == (False, True)
