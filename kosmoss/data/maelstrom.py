"""Real columns from ECMWF's MAELSTROM radiation dataset (``3dcorrection``).

Real-data path: ``pip install 'kosmoss[maelstrom]'`` brings ``climetlab`` and the
``climetlab-maelstrom-radiation`` plugin. :class:`MaelstromSource` then calls
``cml.load_dataset("maelstrom-radiation", dataset="3dcorrection", raw_inputs=False,
heating_rate=False, date=..., timestep=..., patch=[...])`` on first access: climetlab
downloads one netCDF file of inputs and one of outputs per (date, timestep, patch) into
its cache (16960 columns per patch, 8 patches = 135680 columns for the tier-1 day), and
``to_xarray()`` opens them lazily with dask. :func:`blocks_from_xarray` materialises one
column slice at a time, so :meth:`MaelstromSource.iter_chunks` streams the data chunk by
chunk into kosmoss blocks (see :mod:`kosmoss.data.schema`).

With ``raw_inputs=False`` the plugin groups the raw variables into blocks in the same
order as the kosmoss schema; :func:`fake_plugin_dataset` writes that layout down in code
and lets tests and lessons run the same path without network or climetlab.
"""
from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from .schema import HL_VARIABLES, INPUT_BLOCKS, OUTPUT_BLOCK, OUTPUT_VARIABLES, ColumnSchema

PLUGIN = "climetlab-maelstrom-radiation"
DATASET = "3dcorrection"
INSTALL_HINT = "pip install 'kosmoss[maelstrom]'"

# The plugin's dimension names after ``column`` for each input block (raw_inputs=False).
INPUT_DIMS: Dict[str, Tuple[str, ...]] = {
    "sca_inputs": ("sca_variable",),
    "col_inputs": ("level", "col_variable"),
    "hl_inputs": ("half_level", "hl_variable"),
    "inter_inputs": ("level_interface", "inter_variable"),
}
FLUX_DIMS: Tuple[str, ...] = ("half_level",)

# Constants of the plugin's heating rate, in K s-1.
GRAVITY = 9.80665
CP_AIR = 1004.0


def plugin_dims(schema: ColumnSchema) -> Dict[str, Dict[str, int]]:
    """Each plugin variable kosmoss reads -> its dimensions after ``column`` and their sizes."""
    shapes = schema.block_shapes()
    dims = {name: dict(zip(INPUT_DIMS[name], shapes[name])) for name in INPUT_BLOCKS}
    dims.update({name: {FLUX_DIMS[0]: schema.half_levels} for name in OUTPUT_VARIABLES})
    return dims


def schema_from_xarray(ds) -> ColumnSchema:
    """The schema whose ``levels`` is the dataset's ``level`` dimension."""
    if "level" not in ds.sizes:
        raise ValueError("maelstrom data: dimension level missing")
    return ColumnSchema(levels=int(ds.sizes["level"]))


def check_xarray(ds, schema: ColumnSchema) -> None:
    """Raise ``ValueError`` naming the first variable or dimension that does not fit ``schema``."""
    for name, dims in plugin_dims(schema).items():
        if name not in ds.variables:
            raise ValueError(f"maelstrom data: variable {name} missing")
        expected = ("column",) + tuple(dims)
        if set(ds[name].dims) != set(expected):
            raise ValueError(f"maelstrom data: variable {name} has dims {ds[name].dims}, expected {expected}")
        for dim, size in dims.items():
            got = ds[name].sizes[dim]
            if got != size:
                raise ValueError(
                    f"maelstrom data: dimension {dim} has {got}, expected {size} (levels={schema.levels})"
                )


def blocks_from_xarray(
    ds, schema: Optional[ColumnSchema] = None, start: int = 0, stop: Optional[int] = None
) -> Dict[str, np.ndarray]:
    """Columns ``[start:stop)`` of a plugin-layout Dataset -> kosmoss blocks (float32 numpy)."""
    schema = schema_from_xarray(ds) if schema is None else schema
    check_xarray(ds, schema)
    dims = plugin_dims(schema)
    # One compute for the whole slice so dask reads each file chunk once, not once per variable.
    part = ds[list(dims)].isel(column=slice(start, stop)).compute()
    arrays = {
        name: np.asarray(part[name].transpose("column", *names).values, dtype=np.float32)
        for name, names in dims.items()
    }
    blocks = {name: arrays[name] for name in INPUT_BLOCKS}
    blocks[OUTPUT_BLOCK] = np.stack([arrays[name] for name in OUTPUT_VARIABLES], axis=-1)
    return blocks


def load_plugin_dataset(date, timestep, patch, dataset_kwargs: Optional[dict] = None):
    """Download (or reuse climetlab's cache) and open the 3dcorrection data as a lazy Dataset."""
    try:
        import climetlab as cml
        import climetlab_maelstrom_radiation  # noqa: F401  (load_dataset below needs the plugin)
    except ImportError as err:
        raise ImportError(f"maelstrom data needs climetlab and {PLUGIN}: {INSTALL_HINT}") from err
    loaded = cml.load_dataset(
        "maelstrom-radiation",
        dataset=DATASET,
        raw_inputs=False,
        heating_rate=False,
        date=date,
        timestep=timestep,
        patch=list(patch),
        **(dataset_kwargs or {}),
    )
    return loaded.to_xarray()


def plugin_version() -> Optional[str]:
    """The installed plugin's version, or ``None``; read from metadata so climetlab is not imported."""
    from importlib import metadata

    try:
        return metadata.version(PLUGIN)
    except metadata.PackageNotFoundError:
        return None


class MaelstromSource:
    """Streams MAELSTROM columns as kosmoss blocks; ``xarray_dataset`` bypasses climetlab (tests)."""

    name = "maelstrom"

    def __init__(
        self,
        date="20200101",
        timestep=0,
        patch=(0,),
        dataset_kwargs: Optional[dict] = None,
        xarray_dataset=None,
    ) -> None:
        self.date = date
        self.timestep = timestep
        self.patch = tuple(np.atleast_1d(patch).tolist())
        self.dataset_kwargs = dict(dataset_kwargs or {})
        self._injected = xarray_dataset is not None
        self._dataset = xarray_dataset
        self._schema: Optional[ColumnSchema] = None

    @property
    def dataset(self):
        """The plugin-layout Dataset, loaded through climetlab on first access."""
        if self._dataset is None:
            self._dataset = load_plugin_dataset(self.date, self.timestep, self.patch, self.dataset_kwargs)
        return self._dataset

    @property
    def schema(self) -> ColumnSchema:
        if self._schema is None:
            schema = schema_from_xarray(self.dataset)
            check_xarray(self.dataset, schema)
            self._schema = schema
        return self._schema

    @property
    def n_columns(self) -> int:
        return int(self.dataset.sizes["column"])

    def iter_chunks(self, chunk_size: int) -> Iterator[Dict[str, np.ndarray]]:
        """Blocks of at most ``chunk_size`` columns, in column order."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        schema, n = self.schema, self.n_columns
        for start in range(0, n, chunk_size):
            yield blocks_from_xarray(self.dataset, schema, start, min(start + chunk_size, n))

    def describe(self) -> dict:
        """Provenance of the data; does not load it."""
        return {
            "name": self.name,
            "origin": "xarray_dataset" if self._injected else "climetlab",
            "request": {
                "dataset": DATASET,
                "date": self.date,
                "timestep": self.timestep,
                "patch": list(self.patch),
                **self.dataset_kwargs,
            },
            "plugin_version": plugin_version(),
        }


def heating_rate(flux_dn: np.ndarray, flux_up: np.ndarray, pressure_hl: np.ndarray) -> np.ndarray:
    """Heating rate on levels (K s-1) from half-level fluxes, as the plugin's ``get_heating_rate``."""
    net = flux_dn - flux_up
    return (-GRAVITY / CP_AIR * np.diff(net, axis=-1) / np.diff(pressure_hl, axis=-1)).astype(np.float32)


def fake_plugin_dataset(blocks: Dict[str, np.ndarray], schema: ColumnSchema):
    """kosmoss blocks -> a Dataset in the plugin's ``to_xarray()`` layout (``raw_inputs=False``)."""
    import xarray as xr

    schema.check_blocks(blocks)
    data = {name: np.asarray(blocks[name], dtype=np.float32) for name in schema.block_shapes()}
    n = len(data[OUTPUT_BLOCK])
    fluxes = {name: data[OUTPUT_BLOCK][..., i] for i, name in enumerate(OUTPUT_VARIABLES)}
    pressure = data["hl_inputs"][..., HL_VARIABLES.index("pressure_hl")]
    variables = {name: (("column",) + INPUT_DIMS[name], data[name]) for name in INPUT_BLOCKS}
    variables["pressure_hl"] = (("column", "half_level", "p_variable"), pressure[..., None])
    variables.update({name: (("column",) + FLUX_DIMS, flux) for name, flux in fluxes.items()})
    for band in ("sw", "lw"):
        hr = heating_rate(fluxes[f"flux_dn_{band}"], fluxes[f"flux_up_{band}"], pressure)
        variables[f"hr_{band}"] = (("column", "level"), hr)
    # Placeholder positions: blocks carry no geography.
    variables["lat"] = ("column", np.linspace(90, -90, n, dtype=np.float32))
    variables["lon"] = ("column", np.linspace(0, 360, n, endpoint=False, dtype=np.float32))
    return xr.Dataset(variables)
