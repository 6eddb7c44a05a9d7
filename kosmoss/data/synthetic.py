"""Synthetic columns in the MAELSTROM ``3dcorrection`` schema: random inputs, physical fluxes.

Each column draws a few scalars (latitude, surface state, sun, humidity, clouds, ...) from
``np.random.default_rng(seed)``; the profiles follow from them through simple atmospheric
physics, and the four flux profiles are a smooth deterministic function of the inputs through
a grey two-stream-like radiative transfer, so a network can learn them. Float64 inside,
float32 out; levels are ordered top of atmosphere first, as in the schema.

Speed: about SPEED columns/s at 137 levels on one core, measured with
``taskset -c 0 .venv/bin/python -c "import time; from kosmoss.data.schema import ColumnSchema;
from kosmoss.data.synthetic import generate_columns as g; s = ColumnSchema(); g(s, 100, 0);
t = time.perf_counter(); g(s, 20000, 1); print(20000 / (time.perf_counter() - t))"``.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from kosmoss.data.schema import ColumnSchema

G = 9.80665  # m s-2
R_DRY = 287.04  # J kg-1 K-1
SIGMA = 5.670374419e-8  # Stefan-Boltzmann, W m-2 K-4
SOLAR_CONSTANT = 1361.0  # W m-2
P_REF = 101325.0  # Pa
P_TOP = 1.0  # Pa, top half level
P_STRATOPAUSE = 100.0  # Pa
DIFFUSIVITY = 1.66  # flux-weighted mean secant of diffuse radiation
RHO_WATER, RHO_ICE = 1000.0, 917.0  # kg m-3
Q_STRATOSPHERE = 2.5e-6  # kg kg-1, dry stratospheric water vapour
O3_TROPOSPHERE = 4e-8  # kg kg-1
WELL_MIXED_VMR = {
    "co2_vmr": 4.15e-4, "n2o_vmr": 3.3e-7, "ch4_vmr": 1.8e-6, "o2_vmr": 0.209,
    "cfc11_vmr": 2.3e-10, "cfc12_vmr": 5.0e-10, "hcfc22_vmr": 2.5e-10, "ccl4_vmr": 8.0e-11,
}
HALOCARBONS = ("cfc11_vmr", "cfc12_vmr", "hcfc22_vmr", "ccl4_vmr")
# Exponent of p/ps in each aerosol type's profile: 6 hugs the boundary layer (sea salt),
# 2 reaches the free troposphere (dust, sulphate).
AEROSOL_PRESSURE_EXPONENT = np.array([6.0, 6.0, 6.0, 2.0, 2.0, 2.0, 4.0, 4.0, 3.0, 3.0, 5.0, 5.0])
MAX_CLOUDS = 3
# Grey optics: mass extinction (m2 kg-1) or column optical depth at P_REF.
SW_RAYLEIGH_TAU, SW_K_H2O, SW_K_O3, SW_K_AEROSOL = 0.1, 0.005, 5.0, 300.0
LW_GREENHOUSE_TAU, LW_K_H2O, LW_K_O3 = 0.45, 0.1, 8.0
SSA_AEROSOL, SSA_CLOUD = 0.9, 0.995  # single-scattering albedos
BACK_RAYLEIGH, BACK_AEROSOL, BACK_CLOUD = 0.5, 0.2, 0.07  # fraction scattered backwards


def generate_columns(schema: ColumnSchema, n_columns: int, seed) -> Dict[str, np.ndarray]:
    """``n_columns`` synthetic columns as float32 blocks shaped like ``schema.block_shapes()``.

    ``seed`` is anything ``np.random.default_rng`` takes (an int, a ``SeedSequence``).
    """
    rng = np.random.default_rng(seed)
    fields = _surface(rng, n_columns)
    fields.update(_atmosphere(rng, schema.levels, fields))
    fields.update(_fluxes(fields))
    return _pack(schema, n_columns, fields)


# --- surface and sun --------------------------------------------------------------------


def _surface(rng, n: int) -> Dict[str, np.ndarray]:
    lat = _latitude(rng, n)
    skin = _skin_temperature(rng, lat)
    albedo, albedo_direct = _sw_albedo(rng, skin)
    return {
        "latitude": lat,
        "skin_temperature": skin,
        "surface_pressure": _surface_pressure(rng, n),
        "cos_solar_zenith_angle": _cos_solar_zenith(rng, n),
        "solar_irradiance": _solar_irradiance(rng, n),
        "sw_albedo": albedo,
        "sw_albedo_direct": albedo_direct,
        "lw_emissivity": _lw_emissivity(rng, n),
    }


def _latitude(rng, n: int) -> np.ndarray:
    # uniform in sin(latitude) samples the globe by area
    return np.arcsin(rng.uniform(-1.0, 1.0, n))


def _skin_temperature(rng, lat: np.ndarray) -> np.ndarray:
    # warm tropics, cold poles, plus weather
    t = 302.0 - 70.0 * np.sin(lat) ** 2 + rng.normal(0.0, 6.0, lat.shape)
    return np.clip(t, 220.0, 310.0)


def _surface_pressure(rng, n: int) -> np.ndarray:
    # synoptic highs and lows around mean sea-level pressure (no orography)
    return np.clip(rng.normal(101000.0, 1000.0, n), 98000.0, 103000.0)


def _cos_solar_zenith(rng, n: int) -> np.ndarray:
    # about 40% of the columns lie on the night side, where it is exactly 0
    return np.maximum(rng.uniform(-0.65, 1.0, n), 0.0)


def _solar_irradiance(rng, n: int) -> np.ndarray:
    # the Earth-Sun distance modulates insolation by +-3.4% over a year
    return SOLAR_CONSTANT * (1.0 + 0.034 * np.cos(rng.uniform(0.0, 2.0 * np.pi, n)))


def _sw_albedo(rng, skin: np.ndarray):
    n = len(skin)
    snow = 1.0 / (1.0 + np.exp((skin - 263.0) / 3.0))  # snow and sea ice cover cold surfaces
    ground = rng.uniform(0.06, 0.3, n)
    broadband = ground + snow * (rng.uniform(0.55, 0.75, n) - ground)
    # snow is brightest in the visible, vegetation in the near infrared
    tilt = (1.0 - snow) * rng.uniform(0.0, 0.5, n) - 0.4 * snow
    bands = broadband[:, None] * (1.0 + tilt[:, None] * np.linspace(-1.0, 1.0, 6))
    diffuse = np.clip(bands + rng.normal(0.0, 0.01, (n, 6)), 0.05, 0.8)
    direct = np.clip(diffuse + rng.normal(0.0, 0.02, (n, 6)), 0.05, 0.8)
    return diffuse, direct


def _lw_emissivity(rng, n: int) -> np.ndarray:
    # natural surfaces are nearly black in the thermal infrared
    return np.clip(rng.uniform(0.92, 1.0, (n, 1)) + rng.normal(0.0, 0.01, (n, 2)), 0.9, 1.0)


# --- atmosphere -------------------------------------------------------------------------


def _atmosphere(rng, levels: int, surface: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    ps = surface["surface_pressure"][:, None]
    p_hl = _half_level_pressure(levels, ps)
    t_hl = _temperature_hl(rng, p_hl, surface["skin_temperature"], surface["latitude"])
    p_full = 0.5 * (p_hl[:, 1:] + p_hl[:, :-1])
    t_full = 0.5 * (t_hl[:, 1:] + t_hl[:, :-1])
    log_sigma = np.log(p_full / ps)
    q = _specific_humidity(rng, p_full, t_full, log_sigma, t_hl[:, -1:], ps)
    cloud_fraction, condensate = _clouds(rng, p_full, q, ps)
    q_liquid, q_ice = _phase_split(condensate, t_full)
    fields = {
        "pressure_hl": p_hl,
        "temperature_hl": t_hl,
        "q": q,
        "o3_mmr": _ozone(rng, p_full),
        "aerosol_mmr": _aerosols(rng, log_sigma),
        "cloud_fraction": cloud_fraction,
        "q_liquid": q_liquid,
        "q_ice": q_ice,
        "re_liquid": _re_liquid(rng, len(ps)),
        "re_ice": _re_ice(t_full),
        "overlap_param": _overlap(rng, p_full, t_hl),
    }
    fields.update(_well_mixed_gases(rng, len(ps)))
    return fields


def _half_level_pressure(levels: int, ps: np.ndarray) -> np.ndarray:
    # hybrid levels: log-spaced pressure levels aloft blend into terrain-following ones below
    eta = np.linspace(0.0, 1.0, levels + 1)
    p_ref = (1.0 - eta**2) * P_TOP * (P_REF / P_TOP) ** eta + eta**3 * P_REF
    return p_ref + (p_ref / P_REF) ** 2 * (ps - P_REF)


def _temperature_hl(rng, p_hl, skin, lat) -> np.ndarray:
    n = len(p_hl)
    ps = p_hl[:, -1]
    t_air = skin + rng.normal(0.0, 1.5, n)  # near-surface air is a little off the skin
    kappa = R_DRY * rng.uniform(5.5e-3, 7.5e-3, n) / G  # T ~ p**(R lapse / g) for a constant lapse
    p_tropopause = np.clip(25000.0 - 5000.0 * np.cos(lat) ** 2 + rng.normal(0.0, 500.0, n),
                           20000.0, 25000.0)  # higher (lower pressure) tropopause in the tropics
    t_floor = rng.uniform(200.0, 220.0, n)
    t_tropopause = np.maximum(t_air * (p_tropopause / ps) ** kappa, t_floor)
    troposphere = np.maximum(
        t_air[:, None] * np.exp(kappa[:, None] * np.log(p_hl / ps[:, None])), t_floor[:, None])
    stratosphere = _middle_atmosphere(p_hl, p_tropopause, t_tropopause)
    return np.where(p_hl >= p_tropopause[:, None], troposphere, stratosphere)


def _middle_atmosphere(p_hl, p_tropopause, t_tropopause) -> np.ndarray:
    # ozone heating warms the stratosphere by ~2 K/km up to 1 hPa; the mesosphere cools above
    scale_height = R_DRY * t_tropopause / G
    height = scale_height[:, None] * np.log(p_tropopause[:, None] / p_hl)
    stratopause = (scale_height * np.log(p_tropopause / P_STRATOPAUSE))[:, None]
    warming = 2.0e-3 * np.minimum(height, stratopause)
    cooling = 2.5e-3 * np.maximum(height - stratopause, 0.0)
    return t_tropopause[:, None] + warming - cooling


def _saturation_q(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    # Tetens' fit of Clausius-Clapeyron over liquid water
    vapour_pressure = 611.2 * np.exp(17.67 * (t - 273.15) / (t - 29.65))
    return 0.622 * vapour_pressure / p


def _specific_humidity(rng, p_full, t_full, log_sigma, t_surface, ps) -> np.ndarray:
    n = len(p_full)
    rh = rng.uniform(0.4, 0.9, (n, 1))
    decay = rng.uniform(2.5, 3.5, (n, 1))
    # moisture evaporates at the surface and thins out aloft, never beyond saturation
    q = rh * _saturation_q(t_surface, ps) * np.exp(decay * log_sigma)
    return np.maximum(np.minimum(q, rh * _saturation_q(t_full, p_full)), Q_STRATOSPHERE)


def _ozone(rng, p_full) -> np.ndarray:
    n = len(p_full)
    peak = rng.uniform(6e-6, 1.2e-5, (n, 1))
    log_p_peak = rng.uniform(np.log(500.0), np.log(2000.0), (n, 1))
    # a Chapman layer: photochemical production peaks near 10 hPa
    return O3_TROPOSPHERE + peak * np.exp(-0.5 * ((np.log(p_full) - log_p_peak) / 0.9) ** 2)


def _well_mixed_gases(rng, n: int) -> Dict[str, np.ndarray]:
    # long-lived gases are uniform in the vertical, with a tiny column-to-column scatter
    factors = 1.0 + 0.005 * rng.standard_normal((n, len(WELL_MIXED_VMR)))
    return {name: value * factors[:, i:i + 1] for i, (name, value) in enumerate(WELL_MIXED_VMR.items())}


def _aerosols(rng, log_sigma) -> np.ndarray:
    n = len(log_sigma)
    surface = np.exp(rng.uniform(np.log(1e-9), np.log(1e-7), (n, 1, len(AEROSOL_PRESSURE_EXPONENT))))
    # emitted at the surface and mixed over a type-dependent scale height
    return surface * np.exp(log_sigma[:, :, None] * AEROSOL_PRESSURE_EXPONENT)


def _clouds(rng, p_full, q, ps):
    n = len(p_full)
    active = np.arange(MAX_CLOUDS) < rng.integers(0, MAX_CLOUDS + 1, (n, 1))
    centre = 15000.0 + rng.uniform(0.0, 1.0, (n, MAX_CLOUDS)) * (ps - 20000.0)
    half_depth = rng.uniform(2000.0, 15000.0, (n, MAX_CLOUDS))
    cover = 1.0 - rng.random((n, MAX_CLOUDS))  # in (0, 1]
    water_ratio = np.exp(rng.uniform(np.log(0.01), np.log(0.2), (n, MAX_CLOUDS)))
    # each cloud layer is a parabolic bump in pressure, exactly zero outside its depth
    bump = 1.0 - ((p_full[:, :, None] - centre[:, None, :]) / half_depth[:, None, :]) ** 2
    fraction = cover[:, None, :] * np.maximum(bump, 0.0) * active[:, None, :]
    cloud_fraction = 1.0 - np.prod(1.0 - fraction, axis=2)  # cloud layers overlap at random
    # moist air holds more condensate: grid-mean water is a fraction of the vapour
    condensate = q * np.einsum("nlc,nc->nl", fraction, water_ratio)
    return cloud_fraction, condensate


def _phase_split(condensate, t_full):
    # supercooled liquid survives down to about -20 C; colder clouds are ice
    liquid_share = np.clip((t_full - 253.15) / 20.0, 0.0, 1.0)
    return condensate * liquid_share, condensate * (1.0 - liquid_share)


def _re_liquid(rng, n: int) -> np.ndarray:
    # clean maritime air grows fewer, larger droplets than polluted continental air
    return rng.uniform(5e-6, 2e-5, (n, 1))


def _re_ice(t_full) -> np.ndarray:
    # ice crystals grow larger in warmer clouds
    return 2e-5 + 8e-5 * np.clip((t_full - 200.0) / 73.15, 0.0, 1.0)


def _overlap(rng, p_full, t_hl) -> np.ndarray:
    decorrelation = rng.uniform(1000.0, 3000.0, (len(p_full), 1))
    # exponential-random overlap decorrelates with the hypsometric distance between levels
    dz = R_DRY * t_hl[:, 1:-1] / G * np.log(p_full[:, 1:] / p_full[:, :-1])
    return np.exp(-dz / decorrelation)


# --- radiative transfer -----------------------------------------------------------------


def _fluxes(f: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    mass = np.diff(f["pressure_hl"], axis=1) / G  # kg m-2 of air in each layer
    liquid_path = mass * f["q_liquid"] / np.maximum(f["cloud_fraction"], 1e-12)
    ice_path = mass * f["q_ice"] / np.maximum(f["cloud_fraction"], 1e-12)
    droplets = liquid_path / (RHO_WATER * f["re_liquid"]) + ice_path / (RHO_ICE * f["re_ice"])
    sw_dn, sw_up = _shortwave(f, mass, _cloud_optical_depth(f["cloud_fraction"], 1.5 * droplets))
    lw_cloud = _cloud_optical_depth(f["cloud_fraction"], DIFFUSIVITY * droplets)
    lw_dn, lw_up = _longwave(f, mass, lw_cloud)
    return {"flux_dn_sw": sw_dn, "flux_up_sw": sw_up, "flux_dn_lw": lw_dn, "flux_up_lw": lw_up}


def _cloud_optical_depth(fraction, in_cloud_tau):
    # a partly cloudy layer averages clear and cloudy transmittances; beyond tau 30 it is opaque
    return -np.log1p(fraction * np.expm1(-np.minimum(in_cloud_tau, 30.0)))


def _shortwave(f, mass, cloud_tau):
    rayleigh = SW_RAYLEIGH_TAU * mass * G / P_REF
    aerosol = SW_K_AEROSOL * mass * f["aerosol_mmr"].sum(axis=2)
    gas = mass * (SW_K_H2O * f["q"] + SW_K_O3 * f["o3_mmr"])
    tau = rayleigh + aerosol + gas + cloud_tau
    scattering = rayleigh + SSA_AEROSOL * aerosol + SSA_CLOUD * cloud_tau
    backward = (BACK_RAYLEIGH * rayleigh + BACK_AEROSOL * SSA_AEROSOL * aerosol
                + BACK_CLOUD * SSA_CLOUD * cloud_tau) / scattering
    toa = f["solar_irradiance"] * f["cos_solar_zenith_angle"]
    return _two_stream_sw(tau, scattering / tau, backward, f["cos_solar_zenith_angle"], toa,
                          f["sw_albedo_direct"].mean(axis=1), f["sw_albedo"].mean(axis=1))


def _two_stream_sw(tau, ssa, backward, mu, toa, albedo_direct, albedo_diffuse):
    beam_transmittance = np.exp(-tau / np.maximum(mu, 1e-3)[:, None])
    direct = toa[:, None] * np.cumprod(np.pad(beam_transmittance, ((0, 0), (1, 0)), constant_values=1.0), axis=1)
    scattered = direct[:, :-1] * (1.0 - beam_transmittance) * ssa  # beam scattered in each layer
    # diffuse light lost in a layer is absorbed, or scattered backwards into the other stream
    extinct = -np.expm1(-DIFFUSIVITY * tau)
    transmittance = 1.0 - extinct * (1.0 - ssa * (1.0 - backward))
    reflectance = extinct * ssa * backward
    diffuse_dn = _sweep_down(transmittance, scattered * (1.0 - backward), np.zeros_like(toa))
    surface_up = albedo_direct * direct[:, -1] + albedo_diffuse * diffuse_dn[:, -1]
    up = _sweep_up(transmittance, scattered * backward + reflectance * diffuse_dn[:, :-1], surface_up)
    return direct + diffuse_dn, up


def _longwave(f, mass, cloud_tau):
    gases = sum(f[name] / WELL_MIXED_VMR[name] for name in HALOCARBONS) / len(HALOCARBONS)
    greenhouse = (0.8 * f["co2_vmr"] / WELL_MIXED_VMR["co2_vmr"] + 0.1 * f["ch4_vmr"] / WELL_MIXED_VMR["ch4_vmr"]
                  + 0.05 * f["n2o_vmr"] / WELL_MIXED_VMR["n2o_vmr"] + 0.05 * gases)
    clear = mass * (LW_GREENHOUSE_TAU * G / P_REF * greenhouse + LW_K_H2O * f["q"] + LW_K_O3 * f["o3_mmr"])
    layer_emissivity = -np.expm1(-(DIFFUSIVITY * clear + cloud_tau))
    t_layer = 0.5 * (f["temperature_hl"][:, 1:] + f["temperature_hl"][:, :-1])
    emission = layer_emissivity * SIGMA * t_layer**4
    dn = _sweep_down(1.0 - layer_emissivity, emission, np.zeros(len(mass)))
    # the surface emits as a grey body and reflects the rest of the downwelling flux
    surface_emissivity = f["lw_emissivity"].mean(axis=1)
    surface_up = (surface_emissivity * SIGMA * f["skin_temperature"] ** 4
                  + (1.0 - surface_emissivity) * dn[:, -1])
    return dn, _sweep_up(1.0 - layer_emissivity, emission, surface_up)


def _sweep_down(transmittance, source, top):
    """Half-level fluxes of ``f[k + 1] = transmittance[k] * f[k] + source[k]`` from ``f[0] = top``."""
    # a loop over levels stays exact where cumprod-based closed forms underflow in opaque layers
    a, b = np.ascontiguousarray(transmittance.T), np.ascontiguousarray(source.T)
    flux = np.empty((a.shape[0] + 1, a.shape[1]))
    flux[0] = top
    for k in range(a.shape[0]):
        np.multiply(a[k], flux[k], out=flux[k + 1])
        flux[k + 1] += b[k]
    return flux.T


def _sweep_up(transmittance, source, bottom):
    """The same recursion run from the surface ``f[L] = bottom`` up to the top of atmosphere."""
    return _sweep_down(transmittance[:, ::-1], source[:, ::-1], bottom)[:, ::-1]


# --- packing ----------------------------------------------------------------------------


def _pack(schema: ColumnSchema, n: int, fields: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    named = dict(fields)
    for name in ("sw_albedo", "sw_albedo_direct", "lw_emissivity", "aerosol_mmr"):
        named.update({f"{name}_{i}": fields[name][..., i] for i in range(fields[name].shape[-1])})
    blocks = {}
    for block, shape in schema.block_shapes().items():
        out = np.empty((n,) + shape, dtype=np.float32)
        for i, name in enumerate(schema.block_variables()[block]):
            out[..., i] = named[name]  # per-column constants are (n, 1) and broadcast over levels
        blocks[block] = out
    return blocks
