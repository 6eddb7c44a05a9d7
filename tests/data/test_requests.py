"""A folder answers only the request it was prepared from, MAELSTROM included."""
import numpy as np
import pytest

from kosmoss.core.errors import DatasetError
from kosmoss.data.schema import ColumnSchema
from kosmoss.data.store import prepare

xr = pytest.importorskip("xarray")

from kosmoss.data.maelstrom import MaelstromSource, fake_plugin_dataset  # noqa: E402


def _patch(seed: int, schema=ColumnSchema(3), n: int = 16):
    rng = np.random.default_rng(seed)
    blocks = {name: rng.random((n,) + shape, dtype=np.float32)
              for name, shape in schema.block_shapes().items()}
    blocks["hl_inputs"][..., 1] = np.cumsum(blocks["hl_inputs"][..., 1] + 0.1, axis=1)
    return fake_plugin_dataset(blocks, schema)


def test_another_maelstrom_patch_is_not_answered_with_the_first(tmp_path):
    # Once: asking for patch 2 after patch 0 returned the patch-0 data.
    first = prepare(MaelstromSource(patch=[0], xarray_dataset=_patch(0)), tmp_path / "m", 8)
    with pytest.raises(DatasetError, match=r"m: holds another dataset: patch \[0\] \(asked \[2\]"):
        prepare(MaelstromSource(patch=[2], xarray_dataset=_patch(2)), tmp_path / "m", 8)
    with pytest.raises(DatasetError, match=r"date \"20200101\" \(asked \"20200102\"\)"):
        prepare(MaelstromSource(date="20200102", xarray_dataset=_patch(0)), tmp_path / "m", 8)
    again = prepare(MaelstromSource(patch=[0], xarray_dataset=_patch(0)), tmp_path / "m", 8)
    assert again.reused and again.shards == first.shards


def test_a_newer_plugin_release_does_not_make_another_request(tmp_path, monkeypatch):
    import kosmoss.data.maelstrom as maelstrom

    prepare(MaelstromSource(xarray_dataset=_patch(0)), tmp_path / "m", 8)
    monkeypatch.setattr(maelstrom, "plugin_version", lambda: "99.0")
    assert prepare(MaelstromSource(xarray_dataset=_patch(0)), tmp_path / "m", 8).reused
