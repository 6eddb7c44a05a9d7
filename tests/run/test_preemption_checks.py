"""How often StopOnSignal's ranks agree on the stop flag: about once a second, never every
step, and always at the same step on every rank (else the collective would hang).

Two ranks are two threads whose ``strategy.reduce`` is a real max all-reduce through a
barrier: a rank that called it at another step than its peer would time out here."""
import signal
import threading
from types import SimpleNamespace

import torch

from kosmoss.run import preemption
from kosmoss.run.preemption import StopOnSignal


def endless_epoch() -> SimpleNamespace:
    """What StopOnSignal reads and writes of Lightning's loop: no step is an epoch's last;
    a stop sets the loop's max_steps to the step made (kosmoss.run.lightning_private)."""
    return SimpleNamespace(epoch_loop=SimpleNamespace(
        batch_progress=SimpleNamespace(is_last_batch=False), max_steps=-1))


def stopped(trainer) -> bool:
    return trainer.fit_loop.epoch_loop.max_steps == trainer.global_step


class World:
    """A max all-reduce between ``size`` threads, and each thread's own clock."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots = [None] * size
        self.clock = threading.local()

    def reduce(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        reduced = torch.stack(self.slots).max(dim=0).values
        self.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return reduced

    def perf_counter(self) -> float:
        return self.clock.now


def fake_trainer(world: World, rank: int, size: int) -> SimpleNamespace:
    trainer = SimpleNamespace(world_size=size, global_step=0, saved=[],
                              fit_loop=endless_epoch())
    trainer.strategy = SimpleNamespace(
        reduce=lambda tensor, reduce_op: world.reduce(rank, tensor))
    trainer.save_checkpoint = lambda path, weights_only: trainer.saved.append(
        (path, trainer.global_step))
    return trainer


def run_rank(world, rank, size, callback, step_s, steps, signal_at=None):
    trainer, module = fake_trainer(world, rank, size), SimpleNamespace(device=torch.device("cpu"))
    world.clock.now = 0.0
    for step in range(1, steps + 1):
        world.clock.now += step_s
        trainer.global_step = step
        if step == signal_at:
            callback._note(signal.SIGTERM, None)
        callback.on_train_batch_end(trainer, module, None, None, step - 1)
        if stopped(trainer):
            break
    return trainer


def run_world(monkeypatch, step_times, steps, signal_at=None):
    world = World(len(step_times))
    monkeypatch.setattr(preemption, "time", world)
    callbacks = [StopOnSignal(f"/ckpt/{rank}") for rank in range(len(step_times))]
    trainers = [None] * len(step_times)

    def rank_main(rank):
        trainers[rank] = run_rank(world, rank, len(step_times), callbacks[rank],
                                  step_times[rank], steps, signal_at if rank == 0 else None)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(step_times))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(t is not None for t in trainers), "a rank hung in the all-reduce"
    return callbacks, trainers


def test_ranks_agree_about_once_a_second_not_every_step(monkeypatch):
    # 3,000 steps of 5 ms and 20 ms: 60 s on the slower rank, so about 60 checks, not 3,000.
    callbacks, trainers = run_world(monkeypatch, [0.005, 0.020], steps=3000)
    assert callbacks[0].checks == callbacks[1].checks
    assert 55 <= callbacks[0].checks <= 80
    assert not any(stopped(t) for t in trainers)


def test_a_signal_on_one_rank_stops_both_at_the_same_step_within_a_second(monkeypatch):
    callbacks, trainers = run_world(monkeypatch, [0.010, 0.010], steps=3000, signal_at=1234)
    saved_at = [t.saved[0][1] for t in trainers]
    assert saved_at[0] == saved_at[1] and 1234 <= saved_at[0] <= 1234 + 100  # 100 steps = 1 s
    assert all(stopped(t) for t in trainers)
    assert [c.stopped_by for c in callbacks] == ["SIGTERM", "SIGTERM"]


def test_one_process_checks_its_own_flag_every_step_without_a_collective(monkeypatch):
    def no_collective(tensor, reduce_op):
        raise AssertionError("a single process needs no all-reduce")

    callback = StopOnSignal("/ckpt")
    trainer = SimpleNamespace(world_size=1, global_step=7,
                              strategy=SimpleNamespace(reduce=no_collective), saved=[],
                              fit_loop=endless_epoch())
    trainer.save_checkpoint = lambda path, weights_only: trainer.saved.append(path)
    module = SimpleNamespace(device=torch.device("cpu"))
    callback.on_train_batch_end(trainer, module, None, None, 6)
    assert not stopped(trainer)
    callback._note(signal.SIGUSR1, None)
    callback.on_train_batch_end(trainer, module, None, None, 7)
    assert stopped(trainer) and callback.stopped_at_step == 7 and trainer.saved
    assert callback.stopped_by == "SIGUSR1" and callback.checks == 0


def test_lightnings_per_step_sigterm_broadcast_is_off_in_kosmoss_runs(tmp_path, monkeypatch):
    """Lightning broadcasts its SIGTERM flag before every step of a multi-rank run; kosmoss
    replaces the handler that sets it, so the collective would only cost a step's time."""
    import pytorch_lightning as pl
    import torch.distributed as dist

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, default_root_dir=tmp_path)
    loop = trainer.fit_loop.epoch_loop
    assert hasattr(type(loop), "_broadcast_sigterm_tensor")  # the Lightning this targets
    broadcasts = []
    monkeypatch.setattr(dist, "broadcast", lambda *args, **kwargs: broadcasts.append(args))
    previous = {sig: signal.getsignal(sig) for sig in preemption.STOP_SIGNALS}
    try:
        StopOnSignal(tmp_path).on_train_start(trainer, None)
        loop._broadcast_sigterm_tensor()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert broadcasts == []
