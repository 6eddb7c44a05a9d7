"""LaterRead on the CPU (kosmoss.run.host_reads; its GPU case: tests/gpu/test_cuda_runs.py):
the value at once, kept as it was when read (a CUDA-graph replay overwrites its outputs)."""
import torch

from kosmoss.run.host_reads import LaterRead


def test_a_cpu_value_is_on_the_host_at_once_and_kept_as_it_was():
    loss = torch.tensor(1.5, requires_grad=True) * 2
    read = LaterRead(loss)
    with torch.no_grad():
        loss.mul_(0).add_(4.0)
    assert read.on_host and read.ready()
    assert float(read.value()) == 3.0 and not read.value().requires_grad
