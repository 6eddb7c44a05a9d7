"""The MAELSTROM plugin layout -> kosmoss blocks, without network or climetlab."""
import sys
import types

import numpy as np
import pytest

xr = pytest.importorskip("xarray")

from kosmoss.data.maelstrom import (  # noqa: E402
    MaelstromSource,
    blocks_from_xarray,
    fake_plugin_dataset,
)
from kosmoss.data.schema import HL_VARIABLES, ColumnSchema  # noqa: E402

P = HL_VARIABLES.index("pressure_hl")


def random_blocks(schema, n, seed=0):
    rng = np.random.default_rng(seed)
    shapes = schema.block_shapes()
    blocks = {name: rng.random((n,) + shape, dtype=np.float32) for name, shape in shapes.items()}
    # Pressure grows downwards so the plugin's heating rate is finite.
    blocks["hl_inputs"][..., P] = np.cumsum(blocks["hl_inputs"][..., P] + 0.1, axis=1)
    return blocks


def hand_built_dataset(blocks):
    """The plugin layout written out independently of fake_plugin_dataset, dims in other orders."""
    out = blocks["outputs"]
    n, half = out.shape[:2]
    return xr.Dataset(
        {
            "sca_inputs": (("sca_variable", "column"), blocks["sca_inputs"].T),
            "col_inputs": (("col_variable", "column", "level"), blocks["col_inputs"].transpose(2, 0, 1)),
            "hl_inputs": (("half_level", "hl_variable", "column"), blocks["hl_inputs"].transpose(1, 2, 0)),
            "pressure_hl": (("column", "half_level", "p_variable"), blocks["hl_inputs"][..., P:P + 1]),
            "inter_inputs": (
                ("level_interface", "column", "inter_variable"), blocks["inter_inputs"].transpose(1, 0, 2)
            ),
            "flux_dn_sw": (("half_level", "column"), out[..., 0].T),
            "flux_up_sw": (("column", "half_level"), out[..., 1]),
            "flux_dn_lw": (("half_level", "column"), out[..., 2].T),
            "flux_up_lw": (("column", "half_level"), out[..., 3]),
            "hr_sw": (("column", "level"), np.zeros((n, half - 1), np.float32)),
            "lat": ("column", np.zeros(n, np.float32)),
            "lon": ("column", np.zeros(n, np.float32)),
        }
    )


BUILDERS = {
    "fake": lambda blocks, schema: fake_plugin_dataset(blocks, schema),
    "hand": lambda blocks, schema: hand_built_dataset(blocks),
}


def assert_blocks_equal(got, want):
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_fake_dataset_has_the_plugin_layout():
    schema = ColumnSchema()
    ds = fake_plugin_dataset(random_blocks(schema, 3), schema)
    assert dict(ds.sizes) == {
        "column": 3, "sca_variable": 17, "level": 137, "col_variable": 27, "half_level": 138,
        "hl_variable": 2, "p_variable": 1, "level_interface": 136, "inter_variable": 1,
    }
    assert ds["col_inputs"].dims == ("column", "level", "col_variable")
    assert ds["pressure_hl"].dims == ("column", "half_level", "p_variable")
    assert ds["inter_inputs"].dims == ("column", "level_interface", "inter_variable")
    assert ds["flux_up_lw"].dims == ("column", "half_level")
    assert ds["hr_lw"].dims == ("column", "level")
    assert ds["lat"].dims == ds["lon"].dims == ("column",)
    assert all(ds[name].dtype == np.float32 for name in ds.variables)


def test_fake_heating_rate_follows_the_plugin_formula():
    schema = ColumnSchema(levels=10)
    blocks = random_blocks(schema, 4)
    ds = fake_plugin_dataset(blocks, schema)
    out, p = blocks["outputs"].astype(np.float64), blocks["hl_inputs"][..., P].astype(np.float64)
    for band, dn in (("sw", 0), ("lw", 2)):
        net = out[..., dn] - out[..., dn + 1]
        want = -9.80665 / 1004 * (net[:, 1:] - net[:, :-1]) / (p[:, 1:] - p[:, :-1])
        np.testing.assert_allclose(ds[f"hr_{band}"].values, want, rtol=1e-4, err_msg=band)


@pytest.mark.parametrize("levels", [137, 10])
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_round_trip_and_flatten(builder, levels):
    schema = ColumnSchema(levels=levels)
    blocks = random_blocks(schema, 5)
    ds = BUILDERS[builder](blocks, schema)
    got = blocks_from_xarray(ds)
    assert_blocks_equal(got, blocks)
    for mine, theirs in zip(schema.flatten(got), schema.flatten(blocks)):
        np.testing.assert_array_equal(mine, theirs)


def test_column_slice():
    schema = ColumnSchema(levels=10)
    blocks = random_blocks(schema, 9)
    got = blocks_from_xarray(hand_built_dataset(blocks), schema, start=2, stop=6)
    assert_blocks_equal(got, {name: block[2:6] for name, block in blocks.items()})


@pytest.mark.parametrize("chunk_size", [1, 4, 11, 50])
def test_iter_chunks_concatenate_to_the_whole(chunk_size):
    schema = ColumnSchema(levels=10)
    blocks = random_blocks(schema, 11)
    source = MaelstromSource(xarray_dataset=hand_built_dataset(blocks))
    assert source.schema == schema
    assert source.n_columns == 11
    chunks = list(source.iter_chunks(chunk_size))
    assert [len(c["outputs"]) for c in chunks[:-1]] == [chunk_size] * (len(chunks) - 1)
    assert 1 <= len(chunks[-1]["outputs"]) <= chunk_size
    whole = {name: np.concatenate([c[name] for c in chunks]) for name in blocks}
    assert_blocks_equal(whole, blocks)


def test_iter_chunks_rejects_a_non_positive_size():
    schema = ColumnSchema(levels=4)
    source = MaelstromSource(xarray_dataset=fake_plugin_dataset(random_blocks(schema, 2), schema))
    with pytest.raises(ValueError, match="chunk_size"):
        next(source.iter_chunks(0))


def test_dask_backed_dataset_streams_chunk_by_chunk():
    pytest.importorskip("dask")
    schema = ColumnSchema(levels=10)
    blocks = random_blocks(schema, 13)
    ds = hand_built_dataset(blocks).chunk({"column": 4})
    source = MaelstromSource(xarray_dataset=ds)
    chunks = list(source.iter_chunks(3))
    assert all(isinstance(c[name], np.ndarray) for c in chunks for name in c)
    whole = {name: np.concatenate([c[name] for c in chunks]) for name in blocks}
    assert_blocks_equal(whole, blocks)
    assert ds["col_inputs"].chunks is not None  # the source never loaded the dataset in place


def test_missing_variable_is_named():
    schema = ColumnSchema(levels=10)
    ds = fake_plugin_dataset(random_blocks(schema, 2), schema).drop_vars("flux_up_lw")
    with pytest.raises(ValueError, match="variable flux_up_lw missing"):
        blocks_from_xarray(ds)


def test_missing_level_dimension_is_named():
    schema = ColumnSchema(levels=10)
    ds = fake_plugin_dataset(random_blocks(schema, 2), schema).drop_vars(["col_inputs", "hr_sw", "hr_lw"])
    with pytest.raises(ValueError, match="dimension level missing"):
        blocks_from_xarray(ds)


def test_wrong_dimension_size_is_named():
    ds = fake_plugin_dataset(random_blocks(ColumnSchema(levels=60), 2), ColumnSchema(levels=60))
    with pytest.raises(ValueError, match="dimension level has 60, expected 137"):
        blocks_from_xarray(ds, ColumnSchema(levels=137))
    bad = ds.drop_vars(["inter_inputs", "level_interface"], errors="ignore")
    bad["inter_inputs"] = (("column", "level_interface", "inter_variable"), np.zeros((2, 5, 1), np.float32))
    with pytest.raises(ValueError, match="dimension level_interface has 5, expected 59"):
        blocks_from_xarray(bad)


def test_wrong_dimension_names_are_named():
    schema = ColumnSchema(levels=10)
    ds = fake_plugin_dataset(random_blocks(schema, 2), schema)
    ds["sca_inputs"] = ds["sca_inputs"].rename({"sca_variable": "variable"})
    with pytest.raises(ValueError, match="variable sca_inputs has dims"):
        blocks_from_xarray(ds)


def test_missing_climetlab_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "climetlab", None)  # makes `import climetlab` raise ImportError
    source = MaelstromSource()  # lazy: nothing is imported yet
    with pytest.raises(ImportError, match=r"pip install 'kosmoss\[maelstrom\]'"):
        source.n_columns


def test_climetlab_is_called_once_with_the_request(monkeypatch):
    schema = ColumnSchema(levels=10)
    ds = fake_plugin_dataset(random_blocks(schema, 3), schema)
    calls = []

    def load_dataset(name, **kwargs):
        calls.append((name, kwargs))
        return types.SimpleNamespace(to_xarray=lambda: ds)

    monkeypatch.setitem(sys.modules, "climetlab", types.SimpleNamespace(load_dataset=load_dataset))
    plugin = types.ModuleType("climetlab_maelstrom_radiation")
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)
    source = MaelstromSource(
        date="20200101", timestep=125, patch=(2, 4), dataset_kwargs={"hr_units": "K d-1"}
    )
    assert calls == []
    assert source.n_columns == 3 and source.schema == schema
    assert len(list(source.iter_chunks(2))) == 2
    assert calls == [(
        "maelstrom-radiation",
        dict(dataset="3dcorrection", raw_inputs=False, heating_rate=False,
             date="20200101", timestep=125, patch=[2, 4], hr_units="K d-1"),
    )]


def test_describe_does_not_load():
    source = MaelstromSource(date="20200101", timestep=0, patch=3)
    info = source.describe()
    assert info["name"] == "maelstrom" and info["origin"] == "climetlab"
    assert info["request"] == {"dataset": "3dcorrection", "date": "20200101", "timestep": 0, "patch": [3]}
    assert "plugin_version" in info
    assert source._dataset is None
    injected = MaelstromSource(xarray_dataset=xr.Dataset())
    assert injected.describe()["origin"] == "xarray_dataset"
