"""The synthetic generator: schema shapes, determinism, physical sanity, learnability."""
import numpy as np
import pytest

from kosmoss.data.schema import ColumnSchema
from kosmoss.data.synthetic import SIGMA, SOLAR_CONSTANT, WELL_MIXED_VMR, generate_columns

N = 2000


def var(blocks, schema, block, name):
    """One variable of a block as float64, e.g. ``var(b, s, "col_inputs", "q")``."""
    index = schema.block_variables()[block].index(name)
    return blocks[block][..., index].astype(np.float64)


@pytest.fixture(scope="module")
def schema():
    return ColumnSchema()


@pytest.fixture(scope="module")
def blocks(schema):
    return generate_columns(schema, N, seed=1234)


def within(x, low, high):
    """``low <= x <= high`` up to float32 rounding."""
    return bool(((x >= low * (1 - 1e-6)) & (x <= high * (1 + 1e-6))).all())


def r_squared(features, target):
    design = np.column_stack([np.ones(len(target))] + list(features))
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    return 1.0 - np.var(target - design @ coef) / np.var(target)


# --- shapes and determinism -------------------------------------------------------------


@pytest.mark.parametrize("levels", [137, 10, 2])
@pytest.mark.parametrize("n_columns", [0, 1, 300])
def test_blocks_fit_the_schema(levels, n_columns):
    schema = ColumnSchema(levels=levels)
    out = generate_columns(schema, n_columns, seed=0)
    schema.check_blocks(out)
    assert set(out) == set(schema.block_shapes())
    for block in out.values():
        assert block.dtype == np.float32
        assert np.isfinite(block).all()


def test_same_seed_same_columns():
    schema = ColumnSchema(levels=10)
    first, second = generate_columns(schema, 600, 7), generate_columns(schema, 600, 7)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])


def test_different_seeds_differ():
    schema = ColumnSchema(levels=10)
    first, second = generate_columns(schema, 50, 7), generate_columns(schema, 50, 8)
    for name in first:
        assert not np.array_equal(first[name], second[name])


def test_seed_sequence_shards():
    schema = ColumnSchema(levels=10)
    shard = [generate_columns(schema, 50, np.random.SeedSequence([7, k])) for k in (0, 1, 0)]
    np.testing.assert_array_equal(shard[0]["outputs"], shard[2]["outputs"])
    assert not np.array_equal(shard[0]["outputs"], shard[1]["outputs"])


# --- physical sanity --------------------------------------------------------------------


def test_surface_and_sun(blocks, schema):
    mu = var(blocks, schema, "sca_inputs", "cos_solar_zenith_angle")
    assert within(mu, 0, 1)
    assert 0.3 < np.mean(mu == 0) < 0.5
    irradiance = var(blocks, schema, "sca_inputs", "solar_irradiance")
    np.testing.assert_allclose(irradiance, SOLAR_CONSTANT, rtol=0.035)
    skin = var(blocks, schema, "sca_inputs", "skin_temperature")
    assert within(skin, 220, 310)
    for i in range(6):
        albedo = var(blocks, schema, "sca_inputs", f"sw_albedo_{i}")
        direct = var(blocks, schema, "sca_inputs", f"sw_albedo_direct_{i}")
        assert within(albedo, 0.05, 0.8) and within(direct, 0.05, 0.8)
        assert np.corrcoef(albedo, direct)[0, 1] > 0.9
    snowy = var(blocks, schema, "sca_inputs", "sw_albedo_0")[skin < 250]
    assert snowy.mean() > 0.4  # cold surfaces are snow or ice
    for i in range(2):
        emissivity = var(blocks, schema, "sca_inputs", f"lw_emissivity_{i}")
        assert within(emissivity, 0.9, 1.0)


def test_pressure_and_temperature(blocks, schema):
    p = var(blocks, schema, "hl_inputs", "pressure_hl")
    assert (np.diff(p, axis=1) > 0).all()
    np.testing.assert_allclose(p[:, 0], 1.0, rtol=0.01)
    assert within(p[:, -1], 98000, 103000)
    t = var(blocks, schema, "hl_inputs", "temperature_hl")
    assert within(t, 150, 350)
    columns = np.arange(len(t))
    t_tropopause = t[columns, np.argmin(np.abs(p - 22000.0), axis=1)]
    t_stratopause = t[columns, np.argmin(np.abs(p - 100.0), axis=1)]
    assert (t[:, -1] > t_tropopause).all()  # the troposphere cools with height
    assert (t_stratopause > t_tropopause + 20).all()  # ozone heats the stratosphere


def test_gases_and_aerosols(blocks, schema):
    q = var(blocks, schema, "col_inputs", "q")
    assert (q >= 0).all() and (q[:, -1] <= 0.025).all()
    assert (q[:, -1] > q[:, 80]).all()  # moisture decreases with height
    o3 = var(blocks, schema, "col_inputs", "o3_mmr")
    p_full = var(blocks, schema, "hl_inputs", "pressure_hl")[:, 1:]
    peak = p_full[np.arange(len(o3)), np.argmax(o3, axis=1)]
    assert (peak < 10000).all() and 5e-6 < o3.max() < 2e-5
    for name, value in WELL_MIXED_VMR.items():
        np.testing.assert_allclose(var(blocks, schema, "col_inputs", name), value, rtol=0.05)
    for i in range(12):
        aerosol = var(blocks, schema, "col_inputs", f"aerosol_mmr_{i}")
        assert (aerosol >= 0).all() and (aerosol[:, -1] > aerosol[:, 60]).all()
        assert 1e-9 <= np.median(aerosol[:, -1]) <= 1e-7


def test_clouds(blocks, schema):
    fraction = var(blocks, schema, "col_inputs", "cloud_fraction")
    liquid = var(blocks, schema, "col_inputs", "q_liquid")
    ice = var(blocks, schema, "col_inputs", "q_ice")
    assert within(fraction, 0, 1)
    assert (liquid >= 0).all() and (ice >= 0).all()
    assert (liquid[fraction == 0] == 0).all() and (ice[fraction == 0] == 0).all()
    cloudy_columns = (fraction > 0).any(axis=1)
    assert 0.6 < cloudy_columns.mean() < 0.95  # 0-3 cloud layers per column
    t_hl = var(blocks, schema, "hl_inputs", "temperature_hl")
    t_full = 0.5 * (t_hl[:, 1:] + t_hl[:, :-1])
    assert (liquid[t_full < 253] == 0).all() and (ice[t_full > 274] == 0).all()
    re_liquid = var(blocks, schema, "col_inputs", "re_liquid")
    re_ice = var(blocks, schema, "col_inputs", "re_ice")
    assert within(re_liquid, 5e-6, 2e-5) and within(re_ice, 2e-5, 1e-4)
    assert within(blocks["inter_inputs"], 0, 1)


def test_shortwave(blocks, schema):
    dn = var(blocks, schema, "outputs", "flux_dn_sw")
    up = var(blocks, schema, "outputs", "flux_up_sw")
    assert (dn >= 0).all() and (up >= 0).all()
    assert (dn <= 1.5 * SOLAR_CONSTANT).all() and (up <= 1.5 * SOLAR_CONSTANT).all()
    mu = var(blocks, schema, "sca_inputs", "cos_solar_zenith_angle")
    irradiance = var(blocks, schema, "sca_inputs", "solar_irradiance")
    np.testing.assert_allclose(dn[:, 0], irradiance * mu, rtol=1e-6)
    night = mu == 0
    assert (dn[night] == 0).all() and (up[night] == 0).all()
    assert (up[:, -1] <= dn[:, -1]).all()
    absorbed = (dn - up)[:, :-1] - (dn - up)[:, 1:]
    assert (absorbed > -1e-3).all()  # no layer creates energy
    day = ~night
    assert 0.1 < np.mean(up[day, 0] / dn[day, 0]) < 0.5  # an Earth-like planetary albedo


def test_longwave(blocks, schema):
    dn = var(blocks, schema, "outputs", "flux_dn_lw")
    up = var(blocks, schema, "outputs", "flux_up_lw")
    assert (dn >= 0).all() and (up >= 0).all()
    assert (dn[:, 0] == 0).all()
    assert ((up[:, 0] > 50) & (up[:, 0] < 700)).all()
    assert ((up[:, -1] > 50) & (up[:, -1] < 700)).all()
    assert ((dn[:, -1] > 20) & (dn[:, -1] < 700)).all()
    assert (up[:, 0] < up[:, -1]).mean() > 0.9  # a greenhouse effect


# --- learnability -----------------------------------------------------------------------


def test_fluxes_follow_their_drivers(blocks, schema):
    mu = var(blocks, schema, "sca_inputs", "cos_solar_zenith_angle")
    insolation = mu * var(blocks, schema, "sca_inputs", "solar_irradiance")
    outputs = blocks["outputs"].astype(np.float64)
    assert r_squared([insolation], outputs[:, 0, 0]) > 0.99
    assert r_squared([insolation], outputs[:, -1, 0]) > 0.8
    skin = var(blocks, schema, "sca_inputs", "skin_temperature")
    assert r_squared([SIGMA * skin**4], outputs[:, -1, 3]) > 0.95
    t_air = var(blocks, schema, "hl_inputs", "temperature_hl")[:, -1]
    assert r_squared([SIGMA * t_air**4], outputs[:, -1, 2]) > 0.8
