"""--cuda-graphs around the graph itself, on CPU: kosmoss.run.graphs.EagerGraph stands in
for the CUDA graph (it runs at each replay what would have been captured), so everything a
replay must keep — weights, the logged rows, Lightning's step counters, the loader's place
in a checkpoint, the rate's warm-up — is checked here; tests/gpu captures for real."""
import time
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger

from kosmoss.core.errors import ConfigError
from kosmoss.run import graphs
from kosmoss.run.callbacks import ThroughputMeter
from kosmoss.run.chunks import StepsInChunks
from kosmoss.run.datamodule import RunDataModule
from kosmoss.run.lean import LeanLitMLP
from kosmoss.run.plan import _check_graphs
from kosmoss.run.train import _graph_figures

K, BATCH = 4, 64


class FailingGraph(graphs.EagerGraph):
    def capture(self, steps):
        raise RuntimeError("operation not permitted when stream is capturing")


def _fit(dataset, tmp_path, *, graph=None, steps=30, warmup=0, model_class=StepsInChunks,
         k=K, precision="32-true", ckpt=None, stop_at=None, bf16_store=True, extra=(),
         compile=False):
    pl.seed_everything(5, verbose=False)
    model = model_class(dataset.n_x, (16,), dataset.n_y, stats=dataset.statistics(),
                        warmup_steps=warmup, warmup_start_lr=1e-4)
    if compile:  # as kosmoss.run.train compiles it
        model.net.forward = torch.compile(model.net.forward)
    callbacks = [graphs.GraphsOnTheDevice(BATCH, k, graph, bf16_store)] if graph else []
    if stop_at:
        callbacks.append(StopAfter(stop_at, tmp_path / "stopped.ckpt"))
    callbacks.extend(extra)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, precision=precision,
                         logger=CSVLogger(tmp_path, name="csv", version=""),
                         log_every_n_steps=3, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         use_distributed_sampler=False, default_root_dir=tmp_path)
    module = RunDataModule(dataset, batch_size=BATCH, seed=1, mode="controlled",
                           steps_per_execution=k, chunked=issubclass(model_class, StepsInChunks))
    trainer.fit(model, datamodule=module, ckpt_path=ckpt)
    return trainer, model, (tmp_path / "csv" / "metrics.csv").read_text()


class StopAfter(pl.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _same_weights(a, b):
    for name, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_replayed_chunks_train_and_log_as_the_eager_loop(random_dataset, tmp_path):
    """1000 rows, 800 to train: 12 full batches of 64 and one of 32 an epoch; 30 steps:
    chunks of 4 steps replayed, the epoch's partial last chunk and the last 2 steps eager."""
    _, eager, eager_rows = _fit(random_dataset, tmp_path / "eager")
    trainer, graphed, graphed_rows = _fit(random_dataset, tmp_path / "graphed",
                                          graph=graphs.EagerGraph)
    _same_weights(eager, graphed)
    assert graphed_rows == eager_rows and "train_loss" in graphed_rows
    assert trainer.global_step == 30
    figures = graphs.GraphsOnTheDevice.report(graphed)
    assert figures["replays"] >= 3 and figures["warm_up_chunks"] == graphs.WARMUP_CHUNKS
    assert figures["eager_chunks"] >= 2
    assert figures["capture_failed"] is None


def test_graphs_of_one_step_a_chunk(random_dataset, tmp_path):
    """The largest batches leave one full batch an epoch: K is 1, the loader still hands out
    chunks (the run path once handed the graphed model plain batches there)."""
    _, eager, eager_rows = _fit(random_dataset, tmp_path / "eager", k=1, steps=14,
                                model_class=LeanLitMLP)
    _, graphed, graphed_rows = _fit(random_dataset, tmp_path / "graphed", k=1, steps=14,
                                    graph=graphs.EagerGraph)
    _same_weights(eager, graphed)
    assert graphed_rows == eager_rows and graphed.graphs.replays >= 10


def test_no_replay_while_the_rate_warms_up(random_dataset, tmp_path):
    _, eager, eager_rows = _fit(random_dataset, tmp_path / "eager", warmup=10)
    _, graphed, graphed_rows = _fit(random_dataset, tmp_path / "graphed", warmup=10,
                                    graph=graphs.EagerGraph)
    _same_weights(eager, graphed)
    assert graphed_rows == eager_rows
    assert graphed.graphs.warm_chunks == graphs.WARMUP_CHUNKS  # began after step 10


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_run_stopped_between_replays_resumes_exactly(random_dataset, tmp_path, precision):
    """Stopped after the third chunk (step 12, mid-epoch): the resumed run's own graph is
    captured after its warm-up chunk (in bf16, from inputs it stores again), and it ends
    on the never-stopped run's weights."""
    _, straight, _ = _fit(random_dataset, tmp_path / "straight", graph=graphs.EagerGraph,
                          precision=precision)
    stopped_dir = tmp_path / "stopped"
    stopped, _, _ = _fit(random_dataset, stopped_dir, graph=graphs.EagerGraph, stop_at=9,
                         precision=precision)
    assert stopped.global_step == 12
    trainer, resumed, _ = _fit(random_dataset, tmp_path / "resumed", graph=graphs.EagerGraph,
                               ckpt=stopped_dir / "stopped.ckpt", precision=precision)
    _same_weights(straight, resumed)
    assert trainer.global_step == 30


def test_a_failed_capture_trains_on_eagerly_and_says_so(random_dataset, tmp_path):
    _, eager, eager_rows = _fit(random_dataset, tmp_path / "eager")
    _, graphed, rows = _fit(random_dataset, tmp_path / "graphed", graph=FailingGraph)
    _same_weights(eager, graphed)
    assert rows == eager_rows
    figures = _graph_figures(SimpleNamespace(cuda_graphs=True, compile=False), graphed)
    assert "operation not permitted" in figures["cuda_graphs"]["capture_failed"]
    assert len(figures["warnings"]) == 1 and "--cuda-graphs" in figures["warnings"][0]
    assert figures["cuda_graphs"]["replays"] == 0


class SlowCapture(graphs.EagerGraph):
    """A capture that takes CAPTURE_S, as a real one takes a second or two on a GPU."""

    def capture(self, steps):
        time.sleep(CAPTURE_S)
        super().capture(steps)


class SlowFirstStep(StepsInChunks):
    """The first training step takes CAPTURE_S more, as torch.compile's compilation makes
    the warm-up chunk's first step."""

    def _common_step(self, batch, stage):
        if stage == "train" and not getattr(self, "_compiled", False):
            self._compiled = True
            time.sleep(CAPTURE_S)
        return super()._common_step(batch, stage)


CAPTURE_S = 2.0  # 29 tiny steps take tens of ms here, 1.7 s once on a loaded machine


@pytest.mark.parametrize("slow", ["capture", "first step"])
def test_the_step_clock_leaves_out_the_capture_and_the_compilation(random_dataset, tmp_path,
                                                                   slow):
    """30 steps of a 16-wide network take a few ms each here: a 2 s capture (before the
    first replay) or a 2 s first step of the warm-up chunk (compilation) counted as
    training would more than double the clock's time (with 0.6 s, it did: 0.63 s and
    0.47 s; 29 steps once took 0.3 s on a loaded machine, hence 2 s). On the
    H200 (2026-11-27) the capture counted made kosmoss's replays read 2.3 M samples/s."""
    meter = ThroughputMeter()
    graph, model = (SlowCapture, StepsInChunks) if slow == "capture" else \
        (graphs.EagerGraph, SlowFirstStep)
    started = time.perf_counter()
    _, graphed, _ = _fit(random_dataset, tmp_path, graph=graph, model_class=model,
                         extra=[meter])
    fit_s = time.perf_counter() - started
    assert graphed.graphs.replays >= 3
    if slow == "capture":
        assert graphed.graphs.capture_s >= CAPTURE_S
        assert graphs.GraphsOnTheDevice.report(graphed)["capture_s"] >= CAPTURE_S
    assert meter.clock.steps == 30 - 1  # every step but the first
    # The slow 2 s lie outside the clock's time, however slow a loaded machine makes the
    # steps: counted, the clock would hold them and the steps, the fit them once more.
    assert 0 < meter.clock.elapsed <= fit_s - CAPTURE_S, (meter.clock.elapsed, fit_s)


class CountCompiled(pl.Callback):
    """The graphs torch.compile had made after each training step."""

    def __init__(self):
        self.after_step = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from kosmoss.run.lightning_private import compiled_graphs

        self.after_step.append((pl_module.eager_chunks, compiled_graphs()))


@pytest.mark.slow
def test_eager_chunks_of_a_compiled_bf16_run_compile_nothing_more(random_dataset, tmp_path):
    """The epoch's last chunk (shorter than K, a partial batch) runs eagerly. It once ran
    LitMLP's float32 step, and torch.compile compiled the network a second time for those
    inputs, inside the timed steps (3 s on the H200); it now runs the replays' step on
    their stored bf16 inputs, the same values, and the compiled network is reused."""
    torch._dynamo.reset()
    counts = CountCompiled()
    _, graphed, _ = _fit(random_dataset, tmp_path, graph=graphs.EagerGraph, compile=True,
                         precision="bf16-mixed", extra=[counts])
    assert graphed.eager_chunks >= 2 and graphed.graphs.replays >= 3
    before_eager = next(n for eager, n in counts.after_step if eager == 0)
    assert counts.after_step[-1][1] == before_eager, counts.after_step


def test_bf16_in_chunks_trains_as_lightnings_automatic_loop(random_dataset, tmp_path):
    """The backward passes run outside the step's autocast, as Lightning's automatic
    optimisation runs them: K = 8 is bit-identical to one step a batch in bf16-mixed too."""
    _, automatic, automatic_rows = _fit(random_dataset, tmp_path / "k1", k=1, steps=20,
                                        model_class=LeanLitMLP, precision="bf16-mixed")
    _, chunked, chunked_rows = _fit(random_dataset, tmp_path / "k8", k=8, steps=20,
                                    precision="bf16-mixed")
    _same_weights(automatic, chunked)
    assert chunked_rows == automatic_rows


def test_bf16_replays_from_stored_inputs_train_as_the_eager_loop(random_dataset, tmp_path):
    """In bf16-mixed a replay gathers from inputs normalised once and stored in bf16 (the
    ladder's bf16-store rung): the values autocast would cast, so the weights and logged
    rows are bit-identical to the eager loop's and to replays that normalise each batch."""
    _, eager, eager_rows = _fit(random_dataset, tmp_path / "eager", precision="bf16-mixed")
    _, casting, casting_rows = _fit(random_dataset, tmp_path / "casting", precision="bf16-mixed",
                                    graph=graphs.EagerGraph, bf16_store=False)
    _, stored, stored_rows = _fit(random_dataset, tmp_path / "stored", precision="bf16-mixed",
                                  graph=graphs.EagerGraph)
    assert stored.graphs.stored is not None and stored.graphs.stored.dtype == torch.bfloat16
    assert stored.graphs.replays >= 3
    _same_weights(eager, stored)
    _same_weights(casting, stored)
    assert stored_rows == eager_rows == casting_rows
    assert graphs.GraphsOnTheDevice.report(stored)["inputs"].startswith("bf16, normalised once")
    assert graphs.GraphsOnTheDevice.report(casting)["inputs"].startswith("float32")


def test_fp32_replays_normalise_every_batch(random_dataset, tmp_path):
    _, graphed, _ = _fit(random_dataset, tmp_path / "graphed", graph=graphs.EagerGraph)
    assert graphed.graphs.stored is None
    assert graphs.GraphsOnTheDevice.report(graphed)["inputs"] == "float32, normalised every step"


def _policy(gpu=True):
    return SimpleNamespace(gpu=gpu)


@pytest.mark.parametrize("change, said", [
    (dict(policy=_policy(gpu=False)), "it trains on CPU"),
    (dict(world=2), "it has 2 processes"),
    (dict(engine="horovod"), "it uses --strategy horovod"),
    (dict(data_mode="controlled"), "its data is not on the GPU (--mode controlled; give --mode "
                                   "device)"),
    (dict(workers=2), "it has 2 data workers"),
])
def test_graphs_where_they_cannot_work_are_refused_naming_why(change, said):
    args = dict(policy=_policy(), world=1, engine="ddp", data_mode="device", workers=0)
    args.update(change)
    engine = SimpleNamespace(name=args["engine"], steps_in_chunks=args["engine"] == "ddp")
    with pytest.raises(ConfigError) as refused:
        _check_graphs(args["policy"], SimpleNamespace(world_size=args["world"]), engine,
                      args["data_mode"], args["workers"])
    assert refused.value.field == "cuda_graphs"
    assert f"with its data on the GPU, and this run cannot: {said}" in str(refused.value)


def test_cuda_graphs_on_a_machine_without_a_gpu_is_one_line(shared_home, kosmoss_home):
    from helpers import run_script

    done = run_script(["trainup_gpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                       "--cuda-graphs", "--max-steps", "2"], kosmoss_home, timeout=120,
                      env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("trainup_gpu.py: error: --cuda-graphs:") and "CPU" in lines[-1]
    assert not [line for line in lines if line.startswith("Traceback")]


@pytest.mark.slow
def test_compile_trains_as_eager_on_cpu(shared_home, kosmoss_home, tmp_path):
    import json

    from helpers import run_script

    results = {}
    for name, flags in (("eager", []), ("compiled", ["--compile"])):
        out = tmp_path / f"{name}.json"
        done = run_script(["trainup_cpu.py", "--dataset", str(shared_home / "data" / "tiny"),
                           "--hidden", "16", "--max-steps", "12", "--no-progress",
                           "--result-json", str(out), *flags], kosmoss_home, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        results[name] = json.loads(out.read_text())
    assert results["compiled"]["compile"] is True and results["eager"]["compile"] is False
    assert results["compiled"]["compiled_graphs"] >= 1  # compiled, not silently eager
    assert results["compiled"]["val_loss"] == pytest.approx(results["eager"]["val_loss"],
                                                            rel=1e-4)


@pytest.mark.parametrize("batch, k", [(128, 8), (1024, 1)])
def test_the_run_path_wires_graphs_whatever_k_the_epoch_leaves(shared_home, monkeypatch,
                                                                 batch, k):
    """Through prepare and train, as trainup runs it (the CPU check of --cuda-graphs lifted:
    on CPU the graph is the stand-in): 1,638 training rows hold 12 full batches of 128 (K
    stays 8) or one of 1,024 (K becomes 1); chunks reach the model either way."""
    from kosmoss.run import plan as run_plan
    from kosmoss.run.config import RunConfig
    from kosmoss.run.train import train

    monkeypatch.setenv("KOSMOSS_HOME", str(shared_home))
    monkeypatch.setattr(run_plan, "_check_graphs", lambda *args: None)
    plan = run_plan.prepare(RunConfig(dataset="tiny", batch_size=batch, hidden=(8,),
                                      max_steps=30, max_epochs=1000, progress=False,
                                      mode="controlled",
                                      cuda_graphs=True))
    assert plan.steps_per_execution == k
    outcome = train(plan)
    figures = outcome.extra["cuda_graphs"]
    assert outcome.global_step == 30 and figures["replays"] >= 1, figures
    assert figures["capture_failed"] is None and outcome.extra["warnings"] == []


def test_a_resume_that_carries_cuda_graphs_onto_a_cpu_says_whose_they_are(shared_home, tmp_path):
    """A bare resume keeps --cuda-graphs: where they cannot run, the line says they are the
    resumed run's (not typed) and how to drop them."""
    import json

    from helpers import run_script

    home, tiny = tmp_path / "home", str(shared_home / "data" / "tiny")
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    done = run_script(["trainup_gpu.py", "--dataset", tiny, "--hidden", "16", "--max-steps", "2",
                       "--no-progress"], home, timeout=300, env_extra=cpu)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (home / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    record["config"]["cuda_graphs"] = True  # as a GPU run that replayed its steps records it
    (run_dir / "run.json").write_text(json.dumps(record))
    before = (run_dir / "run.json").read_bytes()
    resume = ["trainup_gpu.py", "--resume", run_dir.name, "--max-steps", "4"]
    refused = run_script(resume, home, timeout=300, env_extra=cpu)
    assert (run_dir / "run.json").read_bytes() == before  # the record kept as it was
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and last.startswith(
        "trainup_gpu.py: error: the resumed run's --cuda-graphs: a CUDA graph"), refused.stderr
    assert "it trains on CPU" in last and last.endswith("drop it with --no-cuda-graphs")
    dropped = run_script(resume + ["--no-cuda-graphs"], home, timeout=300, env_extra=cpu)
    assert dropped.returncode == 0, dropped.stderr[-2000:]
    assert "resume: --cuda-graphs False (the stopped run had True)" in dropped.stdout + \
        dropped.stderr
