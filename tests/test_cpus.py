import pytest

from kosmoss.devices import cpus


@pytest.mark.parametrize("cores, processes, workers", [
    (2, 1, 0), (2, 2, 0), (8, 1, 4), (8, 2, 2), (16, 4, 2), (64, 8, 4), (4, 8, 0),
])
def test_workers_are_sized_per_process(monkeypatch, cores, processes, workers):
    monkeypatch.setattr(cpus, "available_cores", lambda: cores)
    assert cpus.default_num_workers(processes) == workers
    assert cpus.cores_per_process(processes) * min(processes, cores) <= cores
