import numpy as np
import pytest

from kosmoss.data.schema import INPUT_BLOCKS, OUTPUT_BLOCK, ColumnSchema


def test_default_sizes_match_the_maelstrom_schema():
    schema = ColumnSchema()
    assert schema.n_x == 17 + 137 * 27 + 138 * 2 + 136 == 4128
    assert schema.n_y == 4 * 138 == 552
    shapes = schema.block_shapes()
    assert shapes["col_inputs"] == (137, 27) and shapes["inter_inputs"] == (136, 1)


@pytest.mark.parametrize("levels", [137, 10, 2])
def test_flatten_round_trip(levels):
    schema = ColumnSchema(levels)
    rng = np.random.default_rng(0)
    blocks = {name: rng.normal(size=(7,) + shape).astype(np.float32)
              for name, shape in schema.block_shapes().items()}
    x, y = schema.flatten(blocks)
    assert x.shape == (7, schema.n_x) and y.shape == (7, schema.n_y)
    back = schema.unflatten(x, y)
    for name in INPUT_BLOCKS + (OUTPUT_BLOCK,):
        np.testing.assert_array_equal(back[name], blocks[name])


def test_flatten_places_blocks_in_order():
    schema = ColumnSchema(3)
    blocks = {name: np.full((1,) + shape, i, np.float32)
              for i, (name, shape) in enumerate(schema.block_shapes().items())}
    x, _ = schema.flatten(blocks)
    for i, (name, where) in enumerate(schema.x_slices().items()):
        assert (x[0, where] == i).all(), name


def test_wrong_block_shape_is_named():
    schema = ColumnSchema(4)
    blocks = {name: np.zeros((2,) + shape) for name, shape in schema.block_shapes().items()}
    blocks["hl_inputs"] = np.zeros((2, 4, 2))
    with pytest.raises(ValueError, match="hl_inputs"):
        schema.flatten(blocks)


def test_schema_dict_round_trip():
    schema = ColumnSchema(12)
    assert ColumnSchema.from_dict(schema.to_dict()) == schema
