"""Every row of the device decision table (docs/devices.md), GPU presence simulated."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.core.errors import UsageError
from kosmoss.devices import policy as devices
from kosmoss.devices.policy import (DevicePolicy, MachineGpu, decide, gpu_for_local_rank, sharing,
                                    to_numpy)

# machine setting, machine index, run asks, GPUs visible -> gpu?, index, warnings
TABLE = [
    ("none", None, False, 0, False, None, 0),
    ("none", None, False, 2, False, None, 0),
    ("none", None, True, 2, False, None, 1),   # the machine's setting wins
    ("offer", None, False, 2, False, None, 0),
    ("offer", None, True, 2, True, 0, 0),
    ("offer", None, True, 0, False, None, 1),   # asked, none there: CPU with a warning
    ("force", None, False, 2, True, 0, 0),     # forced even though the run did not ask
    ("force", None, True, 0, False, None, 1),
    ("offer", 1, True, 2, True, 1, 0),          # picks GPU 1
    ("offer", 5, True, 2, True, 0, 1),          # GPU 5 missing: default GPU, warning
    ("force", 3, False, 4, True, 3, 0),
]


@pytest.mark.parametrize("setting, index, asks, count, gpu, chosen, n_warnings", TABLE)
def test_decision_table(setting, index, asks, count, gpu, chosen, n_warnings):
    policy = decide(MachineGpu(setting, index), asks, gpu_count=count)
    assert (policy.gpu, policy.index, len(policy.warnings)) == (gpu, chosen, n_warnings)
    assert policy.accelerator == ("gpu" if gpu else "cpu")


@pytest.mark.parametrize("setting, asks, count", [
    ("offer", True, 0), ("none", True, 2), ("offer", False, 2), ("force", True, 0),
])
def test_require_gpu_refuses_to_fall_back(setting, asks, count):
    with pytest.raises(UsageError, match=r"^require_gpu: .*run without require_gpu"):
        decide(MachineGpu(setting), asks, require=True, gpu_count=count)


def test_require_gpu_passes_when_a_gpu_is_chosen():
    assert decide(MachineGpu("offer"), True, require=True, gpu_count=1).gpu


def test_unknown_machine_setting():
    with pytest.raises(ValueError, match="setting"):
        MachineGpu("always")


def test_gpu_ids_per_local_rank():
    assert [gpu_for_local_rank(r, [3, 1]) for r in (0, 1)] == [3, 1]
    with pytest.raises(UsageError, match="gpu_ids 3,1: no id for local rank 2"):
        gpu_for_local_rank(2, [3, 1])


@pytest.mark.parametrize("ranks, gpus, backend, fraction", [
    (2, 0, "gloo", 1.0), (1, 1, "nccl", 1.0), (2, 2, "nccl", 1.0),
    (2, 1, "gloo", 0.5), (3, 1, "gloo", 1 / 3), (4, 2, "gloo", 0.5), (3, 2, "gloo", 0.5),
])
def test_sharing_rule(ranks, gpus, backend, fraction):
    share = sharing(ranks, gpus)
    assert share.backend == backend and share.memory_fraction == pytest.approx(fraction)
    if ranks > gpus > 0:
        assert "NCCL refuses duplicate GPUs" in share.reason


def test_memory_fraction_is_applied_only_to_shared_gpus(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device: calls.append((fraction, str(device))))
    devices.apply_sharing(sharing(2, 1), DevicePolicy(True, 0).device)
    devices.apply_sharing(sharing(1, 1), DevicePolicy(True, 0).device)
    devices.apply_sharing(sharing(2, 1), DevicePolicy(False).device)
    assert calls == [(0.5, "cuda:0")]


def test_cpu_policy_moves_tensors_and_loads_checkpoints(tmp_path):
    policy = decide(MachineGpu("none"), False, gpu_count=0)
    assert policy.device == torch.device("cpu")
    module = policy.to(torch.nn.Linear(2, 2))
    assert next(module.parameters()).device.type == "cpu" and policy.to("text") == "text"
    torch.save({"w": torch.ones(2)}, tmp_path / "c.pt")
    assert policy.load(tmp_path / "c.pt")["w"].device.type == "cpu"


def test_to_numpy_whatever_the_tensor():
    bf16 = torch.tensor([1.5, 2.0], dtype=torch.bfloat16, requires_grad=True)
    np.testing.assert_array_equal(to_numpy(bf16), np.array([1.5, 2.0], dtype=np.float32))
    np.testing.assert_array_equal(to_numpy([1, 2]), np.array([1, 2]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_is_chosen_and_followed():
    policy = decide(MachineGpu("offer"), True)
    assert policy.gpu and policy.to(torch.ones(1)).device.type == "cuda"
    assert to_numpy(policy.to(torch.ones(2, dtype=torch.bfloat16))).tolist() == [1.0, 1.0]


def test_the_machine_says_its_part_through_the_environment(monkeypatch):
    monkeypatch.delenv(devices.MACHINE_ENV, raising=False)
    monkeypatch.delenv(devices.INDEX_ENV, raising=False)
    assert MachineGpu.from_environment("offer") == MachineGpu("offer", None)
    monkeypatch.setenv(devices.MACHINE_ENV, "force")
    monkeypatch.setenv(devices.INDEX_ENV, "1")
    machine = MachineGpu.from_environment("none")
    assert machine == MachineGpu("force", 1)
    # trainup_cpu.py's run asks for no GPU, but a machine that forces one gets it, GPU 1.
    assert decide(machine, use_gpu=False, gpu_count=2).device == devices.torch.device("cuda", 1)
    monkeypatch.setenv(devices.MACHINE_ENV, "always")
    with pytest.raises(UsageError, match="^KOSMOSS_MACHINE_GPU=always: choose one of"):
        MachineGpu.from_environment("none")


def test_the_trainer_devices_come_from_the_policy():
    on_cpu = decide(MachineGpu("none"), use_gpu=True, gpu_count=4)
    assert (on_cpu.trainer_devices(3), on_cpu.gpus_on_host) == (3, 0)
    ids = decide(MachineGpu("offer"), use_gpu=True, gpu_count=4, gpu_ids=(3, 1))
    assert (ids.trainer_devices(2), ids.gpus_on_host, ids.index) == ([3, 1], 2, 3)
    picked = decide(MachineGpu("offer", 2), use_gpu=True, gpu_count=4)
    assert (picked.trainer_devices(1), picked.gpus_on_host) == ([2], 4)
    with pytest.raises(UsageError, match="^gpu_ids 0,5: CUDA id 5 does not exist"):
        decide(MachineGpu("offer"), use_gpu=True, gpu_count=2, gpu_ids=(0, 5))


def test_ranks_outnumbering_the_gpus_take_them_in_turn():
    one = decide(MachineGpu("offer"), use_gpu=True, gpu_count=1)
    cuda = [torch.device("cuda", i) for i in range(3)]
    assert (one.rank_devices(2), one.trainer_devices(2)) == ([cuda[0]] * 2, [0])
    two = decide(MachineGpu("offer"), use_gpu=True, gpu_count=2)
    assert (two.rank_devices(3), two.trainer_devices(3)) == ([cuda[0], cuda[1], cuda[0]], [0, 1])
    # Lightning's own mapping where it holds: one rank a GPU, the host's first ranks.
    assert (two.rank_devices(2), two.trainer_devices(2)) == (None, 2)
    # A second simulated node of `--gpus 1 --num-nodes 2`: its local rank 0 is the host's
    # rank 1, on GPU 1 where there are two (Lightning alone put both nodes on GPU 0, and NCCL
    # refuses a duplicate GPU), on GPU 0 where there is one.
    assert (two.rank_devices(1, 1), two.trainer_devices(1, 1)) == ([cuda[1]], [1])
    assert one.rank_devices(1, 1) == [cuda[0]]
    # A GPU the machine picked keeps the simulated node's one process, as before.
    picked = decide(MachineGpu("offer", 1), use_gpu=True, gpu_count=2)
    assert (picked.rank_devices(1, 1), picked.trainer_devices(1, 1)) == (None, [1])
    # --gpu-ids and CPU runs keep their own mapping.
    assert decide(MachineGpu("offer"), use_gpu=True, gpu_count=1, gpu_ids=(0,)).rank_devices(1, 1) is None
    assert decide(MachineGpu("none"), use_gpu=True, gpu_count=1).rank_devices(4) is None


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(1, 8), per_node=st.integers(1, 8), nodes=st.integers(1, 4))
def test_no_gpu_holds_more_ranks_than_its_memory_share_allows(gpus, per_node, nodes):
    """Over every node of the host, each GPU holds at most 1 / memory_fraction ranks, and
    one rank a GPU wherever the ranks are no more than the GPUs (NCCL's condition)."""
    policy = decide(MachineGpu("offer"), use_gpu=True, gpu_count=gpus)
    placed = []
    for node in range(nodes):
        mine = policy.rank_devices(per_node, node * per_node)
        placed += [d.index for d in mine] if mine else list(range(per_node))
    share = sharing(per_node * nodes, policy.gpus_on_host)
    most = max(placed.count(gpu) for gpu in set(placed))
    assert most <= round(1 / share.memory_fraction)
    assert (most == 1) == (share.backend == "nccl")
    assert all(0 <= gpu < gpus for gpu in placed)


def test_lightning_takes_two_ranks_on_one_gpu(monkeypatch):
    """The Trainer that build_trainer makes for `--gpus 2` on one GPU (CUDA's count
    mocked, as Lightning's own tests do): devices=2 alone is refused."""
    import lightning_fabric.accelerators.cuda as fabric_cuda
    import pytorch_lightning as pl
    import pytorch_lightning.accelerators.cuda as pl_cuda
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    from kosmoss.engines.ddp import DDPEngine

    for module in (fabric_cuda, pl_cuda):
        monkeypatch.setattr(module, "num_cuda_devices", lambda: 1)
    policy = decide(MachineGpu("offer"), use_gpu=True, gpu_count=1)
    share = sharing(2, policy.gpus_on_host)
    with pytest.raises(MisconfigurationException, match="You requested gpu: \\[0, 1\\]"):
        pl.Trainer(accelerator="gpu", devices=2, strategy=DDPEngine().strategy(share, 2, None),
                   logger=False)
    for local_rank in ("0", "1"):
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        trainer = pl.Trainer(accelerator="gpu", devices=policy.trainer_devices(2),
                             strategy=DDPEngine().strategy(share, 2, None, policy.rank_devices(2)),
                             logger=False, enable_progress_bar=False)
        assert (trainer.world_size, trainer.strategy.root_device) == (2, torch.device("cuda", 0))
        assert trainer.strategy.process_group_backend == "gloo"
