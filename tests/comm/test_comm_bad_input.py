"""`kosmoss comm` answers a bad value before importing torch (it took 2-8 s): counts, sizes,
compute time, the output folder, and sizes that the host's memory cannot hold (each rank
holds its payload twice and is a process with torch loaded; a 100G all-reduce failed
as an allocation traceback)."""
import os
import subprocess
import sys

import pytest
from helpers import REPO


@pytest.mark.parametrize("args, expected", [
    (["--ranks", "2", "--sizes", "100G"], "--sizes 100 GiB: 2 ranks need about 400 GiB"),
    (["--ranks", "64", "--sizes", "64G"], "give smaller sizes or --max-size"),
    # Each rank is a process with torch loaded: many small ones were the OOM killer's.
    (["--ranks", "100000", "--sizes", "4K"], "--ranks 100000: 100000 rank processes need "
                                             "about"),
    (["--ranks", "1"], "--ranks 1: an all-reduce needs at least 2 ranks"),
    (["--ranks", "3", "--nodes", "2"], "--nodes 2: must be >= 1 and divide --ranks 3"),
    (["--sizes", "lots"], "--sizes lots: not a size"),
    (["--compute-s", "-1"], "--compute-s -1: give 0"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--out", "/etc/hostname"], "--out /etc/hostname: is a file"),
])
def test_bad_comm_input_is_one_line_before_torch(args, expected, tmp_path):
    env = {**os.environ, "KOSMOSS_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "kosmoss", "comm", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")}
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and expected in errors[0], errors
    assert "torch" not in modules and not (tmp_path / "home").exists()
