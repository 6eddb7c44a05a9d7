"""trainup_gpu.py on a real CUDA GPU (the GPU machine; skipped elsewhere): one GPU, two
simulated nodes sharing it over gloo with half its memory each, NCCL, bf16."""
import json
import warnings

import pytest
import pytorch_lightning as pl
import torch
from helpers import run_script
from pytorch_lightning.strategies import DDPStrategy

from kosmoss.data.datamodule import FlattenedDataModule
from kosmoss.devices.policy import sharing
from kosmoss.model import LitMLP

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TINY = ["--dataset", "tiny", "--no-progress", "--max-epochs", "2"]


def _train(home, tmp_path, *args):
    out = tmp_path / "result.json"
    proc = run_script(["trainup_gpu.py", *TINY, *args, "--result-json", str(out)], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc


def test_one_gpu(shared_home, tmp_path):
    result, _ = _train(shared_home, tmp_path, "--require-gpu")
    assert (result["accelerator"], result["device"], result["world_size"]) == ("gpu", "cuda:0", 1)
    assert not any("CPU" in warning for warning in result["warnings"])
    assert result["val_loss"] < result["mean_baseline_loss"]


def test_two_simulated_nodes_share_one_gpu_over_gloo(shared_home, tmp_path):
    if torch.cuda.device_count() != 1:
        pytest.skip("the sharing case needs exactly one visible GPU (set CUDA_VISIBLE_DEVICES)")
    result, proc = _train(shared_home, tmp_path, "--strategy", "ddp", "--gpus", "1",
                          "--num-nodes", "2")
    assert (result["world_size"], result["accelerator"], result["backend"]) == (2, "gpu", "gloo")
    assert result["gpu_memory_fraction"] == 0.5
    assert result["data_mode"] == "device"  # --mode auto: the data fits half a rank's share
    assert "NCCL refuses duplicate GPUs" in proc.stdout
    assert result["replicas_identical"] and len(result["replica_checksums"]) == 2


def test_more_ranks_than_gpus_take_them_in_turn_over_gloo(shared_home, tmp_path):
    """`--gpus N+1` on N GPUs (lesson 5's `--gpus 2` on a one-GPU machine): Lightning alone
    refuses `devices=N+1`; the ranks share the GPUs instead."""
    ranks = torch.cuda.device_count() + 1
    result, proc = _train(shared_home, tmp_path, "--gpus", str(ranks))
    assert (result["world_size"], result["accelerator"], result["backend"]) == (ranks, "gpu", "gloo")
    assert result["gpu_memory_fraction"] == 0.5
    assert result["replicas_identical"] and len(result["replica_checksums"]) == ranks


def test_gpu_ids_pick_the_device(shared_home, tmp_path):
    last = torch.cuda.device_count() - 1
    result, _ = _train(shared_home, tmp_path, "--gpu-ids", str(last))
    assert result["accelerator"] == "gpu" and result["config"]["gpu_ids"] == [last]


def test_bf16_mixed_learns(shared_home, tmp_path):
    result, _ = _train(shared_home, tmp_path, "--precision", "bf16-mixed")
    assert result["precision"] == "bf16-mixed" and result["accelerator"] == "gpu"
    assert result["val_loss"] < result["mean_baseline_loss"]


class BackendProbe(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        self.backend = torch.distributed.get_backend()


def test_one_rank_per_gpu_runs_nccl(random_dataset):
    share = sharing(ranks_on_host=1, gpus_on_host=1)
    assert share.backend == "nccl"
    probe = BackendProbe()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=5, logger=False,
                         strategy=DDPStrategy(process_group_backend=share.backend),
                         enable_checkpointing=False, enable_progress_bar=False,
                         use_distributed_sampler=False, callbacks=[probe])
    model = LitMLP(random_dataset.n_x, (16,), random_dataset.n_y,
                   stats=random_dataset.statistics())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer.fit(model, datamodule=FlattenedDataModule(random_dataset, batch_size=64))
    assert probe.backend == "nccl" and trainer.global_step == 5
    torch.distributed.destroy_process_group()


def test_cuda_graphs_replay_the_eager_steps(shared_home, tmp_path):
    """--cuda-graphs against the same chunks run eagerly (fused Adam both, capturable in
    the graph): the same steps, the validation loss within float rounding; the steps after
    the warm-up chunk were replays, gathering from the inputs stored in bf16."""
    flags = ("--require-gpu", "--mode", "device", "--precision", "bf16-mixed",
             "--batch-size", "256", "--max-steps", "48", "--steps-per-execution", "8")
    (tmp_path / "eager").mkdir()
    (tmp_path / "graphed").mkdir()
    eager, _ = _train(shared_home, tmp_path / "eager", *flags)
    graphed, _ = _train(shared_home, tmp_path / "graphed", *flags, "--cuda-graphs")
    figures = graphed["cuda_graphs"]
    assert figures["capture_failed"] is None and figures["replays"] >= 3, figures
    assert figures["inputs"].startswith("bf16, normalised once"), figures  # the bf16 store
    assert graphed["global_step"] == eager["global_step"] == 48
    assert graphed["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-3)
    assert not any("--cuda-graphs" in warning for warning in graphed["warnings"])


def test_compile_with_graphs_learns(shared_home, tmp_path):
    result, _ = _train(shared_home, tmp_path, "--require-gpu", "--mode", "device",
                       "--precision", "bf16-mixed", "--compile", "--cuda-graphs",
                       "--batch-size", "256", "--max-steps", "40")
    assert result["compile"] and result["cuda_graphs"]["replays"] >= 1
    assert result["val_loss"] < result["mean_baseline_loss"]


def test_a_later_read_does_not_wait_for_the_gpu_and_reads_the_value_of_its_time():
    """LaterRead (kosmoss.run.host_reads) behind a kernel still running: made at once, not
    ready, then the value as it was when it was made, not as a later kernel left it."""
    from kosmoss.run.host_reads import LaterRead

    loss = torch.full((), 2.5, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued before the copy
    read = LaterRead(loss * 2)
    loss.fill_(7.0)  # queued after the copy: not what it reads
    assert not read.on_host and not read.ready()
    assert float(read.value()) == 5.0 and read.ready()
