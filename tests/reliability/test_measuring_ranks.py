"""A measurement's ranks (kosmoss comm, ddp_anatomy): a rank that dies tearing down, after
rank 0 wrote the figures, costs nothing; one that dies before fails the measurement."""
from __future__ import annotations

import pytest
import torch.multiprocessing as mp
from fault_helpers import measuring_rank

from kosmoss.launch.spawn import spawn_for_result, write_result


def test_a_rank_aborting_after_the_figures_exist_keeps_them(tmp_path, capfd):
    result = str(tmp_path / "rank0.json")
    assert spawn_for_result(measuring_rank, (result, True), 2, result) == {"samples_per_s": 123.0}
    assert "rank 1 ended with SIGABRT after its collectives had completed" in capfd.readouterr().err


def test_a_rank_aborting_before_fails_the_measurement(tmp_path):
    result = str(tmp_path / "never.json")  # rank 0 writes another file: none at this path
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawn_for_result(measuring_rank, (str(tmp_path / "other.json"), False), 2, result)


def test_figures_are_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "figures.json"
    write_result(str(path), {"a": 1})
    assert path.read_text() == '{"a": 1}' and not (tmp_path / "figures.json.partial").exists()
