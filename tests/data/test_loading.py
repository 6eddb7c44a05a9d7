import os
import threading
import time

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.data.datamodule import BatchLoader, FlattenedDataModule
from kosmoss.data import loading
from kosmoss.data.loading import (FlattenedDataset, RankBatchSampler, chosen_mode,
                                  dataset_bytes, split_indices)


def test_batched_read_matches_per_sample_read(random_dataset):
    data = FlattenedDataset(random_dataset)
    indices = np.array([999, 3, 500, 128, 127, 3])
    x, y = data[indices]
    for row, i in enumerate(indices):
        xi, yi = data[int(i)]
        torch.testing.assert_close(x[row], xi)
        torch.testing.assert_close(y[row], yi)
    assert x.dtype == torch.float32 and x.shape == (6, random_dataset.n_x)


def test_modes_read_the_same(random_dataset):
    idx = np.array([999, 3, 500, 128, 127, 3, 640])  # unsorted, repeated, across shards
    a = FlattenedDataset(random_dataset, mode="efficient")[idx]
    for mode in ("controlled", "device"):
        torch.testing.assert_close(FlattenedDataset(random_dataset, mode=mode)[idx], a)


def test_ram_modes_hold_one_tensor_each_and_gather_once(random_dataset, monkeypatch):
    assert len(random_dataset.shards) > 1
    data = FlattenedDataset(random_dataset, mode="controlled")
    assert [t.shape[0] for t in data._x] == [len(data)]  # shards concatenated in order
    calls = []
    real = torch.index_select
    monkeypatch.setattr(torch, "index_select", lambda *a, **k: calls.append(1) or real(*a, **k))
    data[np.array([999, 3, 500, 128, 127, 3, 640])]
    assert len(calls) == 2  # x and y, whatever the shards the rows come from


def test_auto_holds_one_tensor_when_every_copy_fits_and_maps_otherwise(random_dataset,
                                                                      monkeypatch):
    nbytes = dataset_bytes(random_dataset)
    free = 10 * nbytes  # half of it (PREFAULT_RAM_SHARE) holds 4 copies, not 5
    monkeypatch.setattr(loading.psutil, "virtual_memory", lambda: type("M", (), {"available": free}))
    assert [chosen_mode("auto", random_dataset, copies) for copies in (1, 4, 5, 8)] == \
        ["controlled", "controlled", "efficient", "efficient"]
    assert chosen_mode("efficient", random_dataset, copies=1) == "efficient"  # as asked
    # Training on a GPU: the data goes there when it takes under half of a rank's share.
    assert chosen_mode("auto", random_dataset, 8, gpu_bytes=2 * nbytes + 1) == "device"
    assert chosen_mode("auto", random_dataset, 1, gpu_bytes=2 * nbytes) == "controlled"
    assert chosen_mode("controlled", random_dataset, 1, gpu_bytes=100 * nbytes) == "controlled"
    assert FlattenedDataset(random_dataset).mode == "controlled"
    free = nbytes  # (read when called) one copy would take all of it
    data = FlattenedDataset(random_dataset, mode="auto")
    assert data.mode == "efficient" and len(data._x) == len(random_dataset.shards)
    idx = np.array([999, 3, 500, 128, 127, 3, 640])
    torch.testing.assert_close(data[idx], FlattenedDataset(random_dataset, mode="controlled")[idx])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_mode_gathers_on_the_gpu(random_dataset):
    idx = np.array([999, 3, 500, 128, 127, 3, 640])
    x, y = FlattenedDataset(random_dataset, mode="device", device="cuda")[idx]
    assert x.is_cuda and y.is_cuda
    torch.testing.assert_close(x.cpu(), FlattenedDataset(random_dataset)[idx][0])


def test_out_of_range_is_an_index_error(random_dataset):
    with pytest.raises(IndexError):
        FlattenedDataset(random_dataset)[np.array([1000])]


@pytest.mark.parametrize("n", [10, 11, 997, 1000])
def test_split_sizes_add_up_and_are_disjoint(n):
    parts = split_indices(n, (0.8, 0.1, 0.1), seed=3)
    assert sum(len(p) for p in parts) == n
    assert len(np.unique(np.concatenate(parts))) == n
    again = split_indices(n, (0.8, 0.1, 0.1), seed=3)
    assert all((a == b).all() for a, b in zip(parts, again))


@pytest.mark.parametrize("n, batch, world", [
    (1000, 32, 1), (1000, 32, 2), (1001, 32, 2), (1000, 7, 3), (97, 16, 4),
    (65, 16, 2), (66, 16, 4), (5, 16, 4), (4, 1, 4), (129, 64, 2),
])
def test_every_sample_once_per_epoch_across_ranks(n, batch, world):
    indices = np.arange(100, 100 + n)
    samplers = [RankBatchSampler(indices, batch, rank=r, world_size=world, seed=5)
                for r in range(world)]
    for epoch in range(2):
        seen = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(batches) == len(sampler)
            assert all(0 < len(b) <= batch + 1 for b in batches)
            seen.extend(np.concatenate(batches).tolist())
        assert sorted(seen) == indices.tolist()
        assert len({len(s) for s in samplers}) == 1  # same number of steps on every rank


def test_shuffle_spans_the_whole_dataset_and_changes_each_epoch():
    sampler = RankBatchSampler(np.arange(10_000), 100, seed=0)
    first = np.concatenate(list(sampler))
    sampler.set_epoch(1)
    second = np.concatenate(list(sampler))
    assert not (first == second).all()
    assert first[:100].max() - first[:100].min() > 5_000  # one batch draws from everywhere
    unshuffled = RankBatchSampler(np.arange(50), 10, shuffle=False)
    assert np.concatenate(list(unshuffled)).tolist() == list(range(50))


def test_datamodule_loaders_give_whole_batches(random_dataset):
    dm = FlattenedDataModule(random_dataset, batch_size=64, seed=1)
    dm.setup("fit")
    assert {k: len(v) for k, v in dm.indices.items()} == {"train": 800, "val": 100, "test": 100}
    batches = list(dm.train_dataloader())
    assert [len(x) for x, _ in batches[:-1]] == [64] * 12
    assert sum(len(x) for x, _ in batches) == 800


@pytest.mark.parametrize("draw_ahead", [False, True])
def test_datamodule_with_workers_reads_the_same(random_dataset, draw_ahead, monkeypatch):
    """Without workers a BatchLoader reads in place; with them, torch's DataLoader: the same
    batches in the same order, epoch after epoch; with the next epoch's order drawn in a
    thread too (the workers fork while it runs)."""
    monkeypatch.setattr(loading, "DRAW_AHEAD_FROM", 1 if draw_ahead else 10**9)
    plain = FlattenedDataModule(random_dataset, batch_size=50, seed=1)
    workers = FlattenedDataModule(random_dataset, batch_size=50, seed=1, num_workers=2)
    for dm in (plain, workers):
        dm.setup("fit")
    assert isinstance(plain.train_dataloader(), BatchLoader)
    assert isinstance(plain.val_dataloader(), BatchLoader)
    assert isinstance(workers.train_dataloader(), DataLoader)
    pairs = [(plain.val_dataloader(), workers.val_dataloader())]
    lean, torch_loader = plain.train_dataloader(), workers.train_dataloader()
    assert len(lean) == len(torch_loader) == 16
    for epoch in (0, 1, 2):  # what Lightning does at each epoch's start
        lean.sampler.set_epoch(epoch)
        torch_loader.sampler.set_epoch(epoch)
        pairs.append((list(lean), list(torch_loader)))
    assert not torch.equal(pairs[1][0][0][0], pairs[2][0][0][0])  # epochs differ
    for a, b in pairs:
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            torch.testing.assert_close(xa, xb)
            torch.testing.assert_close(ya, yb)


@pytest.mark.parametrize("run_path", [False, True])
def test_a_lightning_fit_reads_through_the_batch_loader(random_dataset, run_path):
    """Sanity check, training and validation; the run path's loader (RunDataModule) puts
    its position in the checkpoint, the lesson's plain one has none to put."""
    from kosmoss.model import LitMLP
    from kosmoss.run.datamodule import RunDataModule

    dm = (RunDataModule if run_path else FlattenedDataModule)(random_dataset, batch_size=64,
                                                              seed=1)
    model = LitMLP(random_dataset.n_x, (8,), random_dataset.n_y, stats=random_dataset.statistics())
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=5, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         val_check_interval=5)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 5 and "val_loss" in trainer.callback_metrics
    states = trainer.fit_loop.state_dict()["state_dict"].get("combined_loader")
    assert states == ([{"epoch": 0, "batches_done": 5}] if run_path else None)


def test_sampler_resume_skips_only_the_epoch_it_names():
    sampler = RankBatchSampler(np.arange(100), 10, seed=3)
    sampler.set_epoch(2)
    whole = [b.tolist() for b in sampler]
    sampler.resume(2, 4)
    assert [b.tolist() for b in sampler] == whole[4:]
    assert [b.tolist() for b in sampler] == whole  # one-shot: the next pass is whole
    sampler.resume(1, 4)
    sampler.set_epoch(2)
    assert [b.tolist() for b in sampler] == whole  # another epoch: nothing skipped
    fresh = RankBatchSampler(np.arange(100), 10, seed=3)
    fresh.resume(2, 4)  # before any set_epoch, as in a resumed Lightning run
    assert [b.tolist() for b in fresh] == whole[4:]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_resumed_sampler_skips_its_batches_under_torchs_dataloader(random_dataset, workers):
    """torch's worker iterator calls iter() on the sampler twice and reads the second: a
    skip taken by the first call was lost, and a run resumed with --num-workers started its
    epoch over. The next epoch is whole, the workers persisting."""
    sampler = RankBatchSampler(np.arange(800), 50, seed=3)
    sampler.set_epoch(2)
    whole = [b.tolist() for b in sampler]
    sampler.resume(2, 5)
    data = FlattenedDataset(random_dataset)
    loader = DataLoader(data, sampler=sampler, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    first = [x for x, _ in loader]
    assert len(first) == len(whole) - 5
    for x, rows in zip(first, whole[5:], strict=True):
        torch.testing.assert_close(x, data[np.asarray(rows)][0])
    sampler.set_epoch(3)
    assert len(list(loader)) == len(whole)


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_a_position_at_the_epochs_end_resumes_the_next_epoch_whole(world_size):
    """Every batch of epoch 2 done (a checkpoint on its last batch): the next pass is epoch
    3's, whole, before Lightning sets the epoch — not an empty remainder of epoch 2."""
    ranks = [RankBatchSampler(np.arange(103), 10, rank=r, world_size=world_size, seed=3)
             for r in range(world_size)]
    for sampler in ranks:
        sampler.set_epoch(3)
    epoch3 = [[b.tolist() for b in sampler] for sampler in ranks]
    for sampler, whole in zip(ranks, epoch3):
        fresh = RankBatchSampler(np.arange(103), 10, rank=sampler.rank, world_size=world_size,
                                 seed=3)
        fresh.resume(2, len(sampler))
        assert fresh.epoch == 3 and [b.tolist() for b in fresh] == whole
        fresh.resume(2, len(sampler) - 1)  # one batch left: that batch, of epoch 2
        assert fresh.epoch == 2 and len(list(fresh)) == 1


def _faults_reading_every_row(data: FlattenedDataset) -> int:
    """Minor page faults while every row of every shard is gathered into warm buffers."""
    import resource

    buffers = [torch.empty_like(shard).fill_(0) for shard in data._x]  # touched: no faults
    rows = [torch.arange(len(shard)) for shard in data._x]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for shard, out, index in zip(data._x, buffers, rows):
        torch.index_select(shard, 0, index, out=out)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_dataset_that_fits_in_ram_is_mapped_at_open(random_dataset, monkeypatch):
    """The first epoch does not fault the shards' pages in as it reads: they
    are mapped when the dataset opens, where a run's start-up already waits."""
    import kosmoss.data.loading as loading

    # The same reads from RAM first: threads and buffers this process starts once are not
    # counted against either case (getrusage counts the whole process).
    _faults_reading_every_row(FlattenedDataset(random_dataset, mode="controlled"))
    mapped = min(_faults_reading_every_row(FlattenedDataset(random_dataset, mode="efficient"))
                 for _ in range(2))
    monkeypatch.setattr(loading, "map_pages_now", lambda array: None)
    unmapped = FlattenedDataset(random_dataset, mode="efficient")
    pages = sum(shard.numel() * 4 for shard in unmapped._x) // 4096
    unmapped = _faults_reading_every_row(unmapped)
    assert unmapped > pages // 64  # the kernel maps up to 16 pages per fault
    assert mapped < unmapped // 4, (mapped, unmapped, pages)


def test_a_dataset_too_large_for_ram_is_read_as_it_goes(random_dataset, monkeypatch):
    import kosmoss.data.loading as loading

    calls = []
    monkeypatch.setattr(loading, "map_pages_now", calls.append)
    monkeypatch.setattr(loading, "PREFAULT_RAM_SHARE", 1e-12)
    FlattenedDataset(random_dataset, mode="efficient")
    assert calls == []
    monkeypatch.setattr(loading, "PREFAULT_RAM_SHARE", 0.5)
    FlattenedDataset(random_dataset, mode="efficient")
    assert len(calls) == 2 * len(random_dataset.shards)  # x and y of every shard


@pytest.mark.parametrize("rows,batch_size,world_size", [
    (131, 131, 1),   # one batch an epoch: the whole split, no permutation drawn
    (131, 200, 1),   # a batch larger than the split
    (131, 20, 1),    # large batches: rows marked, not sorted
    (131, 20, 3),    # large batches on 3 ranks, the last one partial
    (1000, 16, 4),   # small batches: sorted
])
def test_every_batch_comes_in_ascending_order_as_np_sort_gives_it(rows, batch_size, world_size):
    """The fast ways to order a batch give exactly np.sort of the permuted batch, on split
    indices with gaps (a split is a subset) and with an index given twice."""
    rng = np.random.default_rng(0)
    for indices in (np.sort(rng.choice(3 * rows, rows, replace=False)),
                    np.concatenate([np.arange(rows - 1), [5]])):
        for rank in range(world_size):
            sampler = RankBatchSampler(indices, batch_size, rank=rank, world_size=world_size,
                                       seed=7)
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                expected = [np.sort(b).tolist() for b in sampler.batches()]
                assert [b.tolist() for b in sampler] == expected


@settings(max_examples=200, deadline=None)
@given(indices=st.lists(st.integers(0, 10**6), min_size=2, max_size=300),
       seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 10**4))
def test_the_epochs_order_is_the_seeded_permutation_of_the_indices(indices, seed, epoch):
    """The order every run depends on: ``indices[rng.permutation(n)]`` with the generator of
    (seed, epoch), element for element, for indices unsorted, with gaps or given twice;
    whatever way the sampler draws it, an earlier run's batches come again."""
    indices = np.asarray(indices)
    sampler = RankBatchSampler(indices, batch_size=1, seed=seed)
    sampler.set_epoch(epoch)
    expected = indices[np.random.default_rng([seed, epoch]).permutation(len(indices))]
    assert np.concatenate(sampler.batches()).tolist() == expected.tolist()


def _expected_batches(indices, batch_size, rank, world_size, epoch, skip=0):
    """A sampler's batches for ``epoch`` drawn from scratch, in ascending order."""
    fresh = RankBatchSampler(indices, batch_size, rank=rank, world_size=world_size, seed=9)
    fresh.set_epoch(epoch)
    return [np.sort(b).tolist() for b in fresh.batches()[skip:]]


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_an_order_drawn_ahead_is_the_order_drawn_when_asked(world_size, monkeypatch):
    """The next epoch's order drawn in a thread gives every rank the batches it would have
    drawn itself: epochs in turn, an epoch taken twice, a jump (a resume elsewhere), a
    resume inside an epoch, an epoch left after its first batch."""
    monkeypatch.setattr(loading, "DRAW_AHEAD_FROM", 1)
    indices = np.sort(np.random.default_rng(1).choice(5000, 1000, replace=False))
    for rank in range(world_size):
        sampler = RankBatchSampler(indices, 30, rank=rank, world_size=world_size, seed=9)
        for epoch in (0, 1, 2, 2, 7, 8, 3):
            sampler.set_epoch(epoch)
            assert [b.tolist() for b in sampler] == _expected_batches(
                indices, 30, rank, world_size, epoch)
            assert sampler._ahead is not None and sampler._ahead.epoch == epoch + 1
        sampler.resume(4, 5)
        assert [b.tolist() for b in sampler] == _expected_batches(
            indices, 30, rank, world_size, 4, skip=5)
        sampler.set_epoch(5)
        next(iter(sampler))  # one batch, then the epoch is left: the next still comes whole
        sampler.set_epoch(6)
        assert [b.tolist() for b in sampler] == _expected_batches(indices, 30, rank,
                                                                 world_size, 6)


def test_only_a_long_training_split_is_drawn_ahead_and_no_thread_outlives_its_draw(
        monkeypatch):
    short = RankBatchSampler(np.arange(loading.DRAW_AHEAD_FROM - 1), 4096, seed=1)
    long = RankBatchSampler(np.arange(loading.DRAW_AHEAD_FROM), 4096, seed=1)
    validation = RankBatchSampler(np.arange(loading.DRAW_AHEAD_FROM), 4096, shuffle=False)
    for sampler in (short, long, validation):
        list(sampler)
    assert short._ahead is None and validation._ahead is None
    assert long._ahead.take(1).tolist() == loading.draw_order(long.indices, 1, 1).tolist()
    assert not [t for t in threading.enumerate() if t.name.startswith("kosmoss-order")]


def _slow_in_a_thread(monkeypatch, seconds=1.0):
    """draw_order that takes ``seconds`` more when a thread (the draw ahead) calls it."""
    real = loading.draw_order

    def slow(*args):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(seconds)
        return real(*args)

    monkeypatch.setattr(loading, "draw_order", slow)


def test_a_fork_while_the_next_order_is_drawn_leaves_the_child_drawing_it_itself(
        monkeypatch):
    """A process forked mid-draw has no drawing thread: its sampler draws the order."""
    monkeypatch.setattr(loading, "DRAW_AHEAD_FROM", 1)
    _slow_in_a_thread(monkeypatch)
    indices = np.arange(500)
    sampler = RankBatchSampler(indices, 50, seed=9)
    expected = _expected_batches(indices, 50, 0, 1, 1)
    list(sampler)  # epoch 0; epoch 1's order is being drawn, for a second
    child = os.fork()
    if child == 0:  # the child: right batches, and no waiting for a thread it lacks
        started = time.perf_counter()
        sampler.set_epoch(1)
        right = [b.tolist() for b in sampler] == expected
        os._exit(0 if right and time.perf_counter() - started < 0.5 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_copy_of_a_sampler_drawing_ahead_and_a_failed_draw_give_the_same_batches(
        monkeypatch):
    import copy
    import pickle

    monkeypatch.setattr(loading, "DRAW_AHEAD_FROM", 1)
    _slow_in_a_thread(monkeypatch, 0.3)
    indices = np.arange(400)
    expected = _expected_batches(indices, 40, 1, 2, 1)
    sampler = RankBatchSampler(indices, 40, rank=1, world_size=2, seed=9)
    list(sampler)
    for twin in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler)), sampler):
        twin.set_epoch(1)
        assert [b.tolist() for b in twin] == expected

    def failing(*args):  # the draw ahead fails (say, out of memory): the sampler draws
        if threading.current_thread() is not threading.main_thread():
            raise MemoryError("drawing ahead")
        return real(*args)

    sampler._ahead.take(2)  # epoch 2's draw, started above, ends before the draws fail
    real, told = loading.draw_order, []
    monkeypatch.setattr(loading, "draw_order", failing)
    monkeypatch.setattr(threading, "excepthook", told.append)
    sampler.set_epoch(4)
    list(sampler)
    sampler.set_epoch(5)
    assert [b.tolist() for b in sampler] == _expected_batches(indices, 40, 1, 2, 5)
    assert sampler._ahead.take(6) is None  # epoch 6's draw failed too, once it ended
    assert [type(t.exc_value) for t in told] == [MemoryError, MemoryError]
