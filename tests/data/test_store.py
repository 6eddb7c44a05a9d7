import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import RandomSource
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kosmoss.core.errors import DatasetError, UsageError
from kosmoss.data import presets, store
from kosmoss.data.stats import Statistics
from kosmoss.data.store import METADATA_FILE, open_dataset, prepare


def _all_rows(dataset):
    x = np.concatenate([np.load(dataset.path / s.x_file) for s in dataset.shards])
    y = np.concatenate([np.load(dataset.path / s.y_file) for s in dataset.shards])
    return x, y


def test_prepared_dataset_matches_source_and_metadata(tmp_path):
    source = RandomSource(300, levels=4)
    dataset = prepare(source, tmp_path / "d", shard_size=128)
    assert [s.rows for s in dataset.shards] == [128, 128, 44]
    meta = json.loads((tmp_path / "d" / METADATA_FILE).read_text())
    assert meta["n_x"] == source.schema.n_x and meta["dtype"] == "float32"
    assert meta["source"]["name"] == "random" and meta["schema"]["levels"] == 4
    assert meta["shapes"] == {"x": [300, source.schema.n_x], "y": [300, source.schema.n_y]}
    x, y = _all_rows(dataset)
    expected = [source.schema.flatten(b) for b in source.iter_chunks(128)]
    np.testing.assert_array_equal(x, np.concatenate([e[0] for e in expected]))
    np.testing.assert_array_equal(y, np.concatenate([e[1] for e in expected]))


def test_statistics_equal_numpy_on_the_whole_data(random_dataset):
    x, y = _all_rows(random_dataset)
    stats = random_dataset.statistics()
    np.testing.assert_allclose(stats.x_mean, x.astype(np.float64).mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(stats.x_std, x.astype(np.float64).std(axis=0), atol=1e-9)
    np.testing.assert_allclose(stats.y_mean, y.astype(np.float64).mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(stats.y_std, y.astype(np.float64).std(axis=0), atol=1e-9)
    assert stats.x_std[0] == 0.0  # the constant feature


def test_interrupted_preparation_leaves_nothing_that_loads(tmp_path):
    class Failing(RandomSource):
        def iter_chunks(self, chunk_size):
            for i, blocks in enumerate(super().iter_chunks(chunk_size)):
                if i == 2:
                    raise KeyboardInterrupt
                yield blocks

    with pytest.raises(KeyboardInterrupt):
        prepare(Failing(500), tmp_path / "d", shard_size=100)
    assert not (tmp_path / "d").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".d.tmp")]


def test_same_request_is_reused_and_another_is_an_error_naming_the_difference(tmp_path):
    # Once: asking for seed 2 in a folder holding seed 1 returned the seed-1 data.
    first = prepare(RandomSource(200, seed=1), tmp_path / "d", shard_size=100)
    again = prepare(RandomSource(200, seed=1), tmp_path / "d", shard_size=100)
    assert again.reused and not first.reused and again.shards == first.shards
    with pytest.raises(DatasetError, match=r"d: holds another dataset: seed 1 \(asked 2\); "):
        prepare(RandomSource(200, seed=2), tmp_path / "d", shard_size=100)
    with pytest.raises(DatasetError, match=r"shard_size 100 \(asked 50\)"):
        prepare(RandomSource(200, seed=1), tmp_path / "d", shard_size=50)
    assert json.loads((tmp_path / "d" / METADATA_FILE).read_text())["seed"] == 1
    forced = prepare(RandomSource(200, seed=2), tmp_path / "d", shard_size=100, force=True)
    assert forced.shards[0].x_sha256 != first.shards[0].x_sha256
    assert forced.metadata["seed"] == 2 and not forced.reused


def test_foreign_folder_is_never_replaced(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not a kosmoss dataset") as refused:
        prepare(RandomSource(10), folder, 10)
    assert "--force" not in str(refused.value)  # it would not help: say nothing of it
    with pytest.raises(DatasetError, match="--force does not replace it; nothing deleted"):
        prepare(RandomSource(10), folder, 10, force=True)
    assert (folder / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no lock file beside it


def test_an_empty_folder_is_filled(tmp_path):
    (tmp_path / "empty").mkdir()
    assert prepare(RandomSource(10), tmp_path / "empty", 10).n_samples == 10


def test_folder_without_metadata_is_named(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(DatasetError, match=r"half: no metadata.json"):
        open_dataset(tmp_path / "half")


def test_a_file_or_a_fifo_given_as_a_dataset_is_not_a_folder_not_missing(tmp_path):
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    for named in (tmp_path / "file", tmp_path / "fifo", "/dev/null"):
        with pytest.raises(DatasetError, match=rf"^{named}: not a folder; give a dataset folder"):
            open_dataset(named)
    with pytest.raises(DatasetError, match="gone: no such dataset folder"):
        open_dataset(tmp_path / "gone")


def test_corrupted_shard_is_named(random_dataset):
    shard = random_dataset.path / random_dataset.shards[1].x_file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    open_dataset(random_dataset.path, verify=False)  # shapes still fine
    with pytest.raises(DatasetError, match=r"x_00001.npy: checksum does not match"):
        open_dataset(random_dataset.path)


def test_truncated_or_reshaped_shard_is_named(random_dataset):
    shard = random_dataset.path / random_dataset.shards[0].y_file
    np.save(shard, np.zeros((5, 3), np.float32))
    with pytest.raises(DatasetError, match=r"y_00000.npy: shape \(5, 3\)"):
        open_dataset(random_dataset.path, verify=False)
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"y_00000.npy: corrupted shard"):
        open_dataset(random_dataset.path, verify=False)


@pytest.mark.parametrize("make, why", [
    (lambda path: path.unlink(), "shard missing"),
    (lambda path: (path.unlink(), os.mkfifo(path)), "shard is a FIFO, not a regular file"),
    (lambda path: (path.unlink(), path.mkdir()), "shard is a folder, not a regular file"),
    (lambda path: (path.unlink(), path.symlink_to(path)),
     r"shard cannot be read \(Too many levels of symbolic links\)"),
    (lambda path: (path.unlink(), path.symlink_to(path.parent / "gone")),
     "shard is a broken symbolic link"),
])
def test_a_shard_that_is_no_file_says_what_it_is(random_dataset, make, why):
    """A FIFO or a link to nowhere was called missing: whoever looks finds a file there."""
    make(random_dataset.path / random_dataset.shards[0].x_file)
    with pytest.raises(DatasetError, match=rf"x_00000.npy: {why}.*; prepare it again"):
        open_dataset(random_dataset.path, verify=False)


def test_resolve_unknown_preset_names_flag(kosmoss_home):
    with pytest.raises(UsageError, match=r"^--dataset nope: unknown preset 'nope'"):
        presets.resolve("nope")
    assert not kosmoss_home.exists()


def test_resolve_prepares_a_missing_preset(kosmoss_home, monkeypatch):
    monkeypatch.setitem(presets.PRESETS, "tiny", presets.Preset("tiny", 64, 32, "test", levels=3))
    dataset = presets.resolve("tiny")
    assert dataset.path == kosmoss_home / "data" / "tiny" and dataset.n_samples == 64


def test_quick_verify_hashes_only_files_changed_since_they_matched(random_dataset, monkeypatch):
    hashed = []
    real_sha256_of = store.sha256_of
    monkeypatch.setattr(store, "sha256_of", lambda path: hashed.append(path.name) or
                        real_sha256_of(path))
    files = 2 * len(random_dataset.shards) + 1  # x and y shards, and the statistics
    open_dataset(random_dataset.path, trust_unchanged=True)
    assert len(hashed) == files  # nothing matched before: everything hashed once
    hashed.clear()
    open_dataset(random_dataset.path, trust_unchanged=True)
    assert hashed == []
    shard = random_dataset.path / random_dataset.shards[2].y_file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"y_00002.npy: checksum does not match"):
        open_dataset(random_dataset.path, trust_unchanged=True)
    assert hashed == [shard.name]
    hashed.clear()
    with pytest.raises(DatasetError):
        open_dataset(random_dataset.path)  # the full check hashes everything
    assert len(hashed) > 1


@pytest.mark.parametrize("damaged", ["[1, 2]", "null", "{broken", '{"x_00000.npy": 7}'])
def test_a_damaged_record_of_verified_files_means_hashing_them_again(random_dataset, damaged):
    open_dataset(random_dataset.path, trust_unchanged=True)
    (random_dataset.path / store.VERIFIED_FILE).write_text(damaged)
    open_dataset(random_dataset.path, trust_unchanged=True)  # no traceback: checked again
    shard = random_dataset.path / random_dataset.shards[0].x_file
    (random_dataset.path / store.VERIFIED_FILE).write_text(damaged)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"x_00000.npy: checksum does not match"):
        open_dataset(random_dataset.path, trust_unchanged=True)


def test_statistics_of_another_feature_count_are_named(random_dataset):
    # Once: such a stats.npz passed `data info --verify`, then crashed training.
    file = random_dataset.path / store.STATS_FILE
    stats = random_dataset.statistics()
    Statistics(stats.x_mean[:-1], stats.x_std[:-1], stats.y_mean, stats.y_std).save(file)
    metadata = json.loads((random_dataset.path / METADATA_FILE).read_text())
    metadata["stats"]["sha256"] = store.sha256_of(file)  # swapped together with its checksum
    (random_dataset.path / METADATA_FILE).write_text(json.dumps(metadata))
    n_x = random_dataset.n_x
    expected = rf"stats.npz: x_mean has shape \({n_x - 1},\), the data has {n_x} features"
    with pytest.raises(DatasetError, match=expected):
        open_dataset(random_dataset.path, verify=False)
    with pytest.raises(DatasetError, match=expected):
        open_dataset(random_dataset.path)
    file.write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match=r"stats.npz: unreadable"):
        open_dataset(random_dataset.path, verify=False)


def test_racing_preparations_of_one_name_write_it_once(tmp_path):
    # Ranks started together (torchrun, srun) may all prepare the same preset.
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: prepare(RandomSource(300), tmp_path / "d", 50), range(3)))
    assert sorted(r.reused for r in results) == [False, True, True]
    assert all(r.shards == results[0].shards for r in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


HOSTILE_VALUES = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True),
                           st.integers(min_value=-10**30, max_value=10**30), st.text(max_size=8),
                           st.lists(st.integers(), max_size=2),
                           st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(where="dtype", value="\n")  # numpy reads it as uint64: the error held the newline
@example(where="shards.0.x_file", value="\n")  # a file name printed into the error
@example(where="shards.0.x_file", value="../x_00000.npy")  # outside the dataset's folder
@given(where=st.sampled_from(["n_samples", "n_x", "n_y", "dtype", "shards", "shards.0",
                              "shards.0.rows", "shards.0.x_file", "shards.1.x_sha256"]),
       value=HOSTILE_VALUES | st.just("__missing__"))
def test_an_edited_metadata_field_is_named_never_a_traceback(random_dataset, where, value):
    """A hand-edited or damaged metadata.json: a DatasetError naming the file (one line from
    every command), or the dataset as it was when the value happens to be the right one."""
    file = random_dataset.path / METADATA_FILE
    original = file.read_text()
    metadata = json.loads(original)
    *parents, key = [int(part) if part.isdigit() else part for part in where.split(".")]
    holder = metadata
    for part in parents:
        holder = holder[part]
    if value == "__missing__":
        del holder[key]
    else:
        holder[key] = value
    file.write_text(json.dumps(metadata))
    try:
        opened = open_dataset(random_dataset.path, verify=False)
    except DatasetError as err:  # metadata.json, or the shard or stats file it misdescribes
        assert str(err).startswith(str(random_dataset.path)) and "\n" not in str(err)
    else:  # a value that reads the same ("<f4" for float32), or a checksum (verify=False)
        assert opened.metadata == json.loads(original) or where in ("dtype", "shards.1.x_sha256")
    finally:
        file.write_text(original)
