"""The MAELSTROM ``3dcorrection`` column schema and its flattening.

Names and block layout follow the ``climetlab-maelstrom-radiation`` plugin
(``radiation.py``, ``raw_inputs=False``): every source produces these blocks, and one
flattening step turns them into the ``x`` / ``y`` matrices the rest of kosmoss uses.
Levels are ordered top of atmosphere first, as in the IFS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

DEFAULT_LEVELS = 137

SCA_VARIABLES: List[str] = (
    ["skin_temperature", "cos_solar_zenith_angle"]
    + [f"sw_albedo_{i}" for i in range(6)]
    + [f"sw_albedo_direct_{i}" for i in range(6)]
    + [f"lw_emissivity_{i}" for i in range(2)]
    + ["solar_irradiance"]
)
COL_VARIABLES: List[str] = (
    ["q", "o3_mmr", "co2_vmr", "n2o_vmr", "ch4_vmr", "o2_vmr",
     "cfc11_vmr", "cfc12_vmr", "hcfc22_vmr", "ccl4_vmr", "cloud_fraction"]
    + [f"aerosol_mmr_{i}" for i in range(12)]
    + ["q_liquid", "q_ice", "re_liquid", "re_ice"]
)
HL_VARIABLES: List[str] = ["temperature_hl", "pressure_hl"]
INTER_VARIABLES: List[str] = ["overlap_param"]
OUTPUT_VARIABLES: List[str] = ["flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw"]

INPUT_BLOCKS: Tuple[str, ...] = ("sca_inputs", "col_inputs", "hl_inputs", "inter_inputs")
OUTPUT_BLOCK = "outputs"


@dataclass(frozen=True)
class ColumnSchema:
    """Shapes of one atmospheric column; ``levels`` is a parameter so tests can shrink it."""

    levels: int = DEFAULT_LEVELS

    def __post_init__(self) -> None:
        if self.levels < 2:
            raise ValueError(f"a column needs at least 2 levels, got {self.levels}")

    @property
    def half_levels(self) -> int:
        return self.levels + 1

    @property
    def interfaces(self) -> int:
        return self.levels - 1

    def block_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Per-column shape of every block, inputs first, in flattening order."""
        return {
            "sca_inputs": (len(SCA_VARIABLES),),
            "col_inputs": (self.levels, len(COL_VARIABLES)),
            "hl_inputs": (self.half_levels, len(HL_VARIABLES)),
            "inter_inputs": (self.interfaces, len(INTER_VARIABLES)),
            OUTPUT_BLOCK: (self.half_levels, len(OUTPUT_VARIABLES)),
        }

    def block_variables(self) -> Dict[str, List[str]]:
        return {
            "sca_inputs": SCA_VARIABLES,
            "col_inputs": COL_VARIABLES,
            "hl_inputs": HL_VARIABLES,
            "inter_inputs": INTER_VARIABLES,
            OUTPUT_BLOCK: OUTPUT_VARIABLES,
        }

    @property
    def n_x(self) -> int:
        shapes = self.block_shapes()
        return sum(int(np.prod(shapes[name])) for name in INPUT_BLOCKS)

    @property
    def n_y(self) -> int:
        return int(np.prod(self.block_shapes()[OUTPUT_BLOCK]))

    def x_slices(self) -> Dict[str, slice]:
        """Where each input block lives inside a flattened ``x`` row."""
        slices, start = {}, 0
        for name in INPUT_BLOCKS:
            size = int(np.prod(self.block_shapes()[name]))
            slices[name] = slice(start, start + size)
            start += size
        return slices

    def flatten(self, blocks: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """Blocks of ``n`` columns -> ``x`` (n, n_x) and ``y`` (n, n_y), float32."""
        self.check_blocks(blocks)
        n = len(blocks[OUTPUT_BLOCK])
        x = np.concatenate(
            [np.asarray(blocks[name], dtype=np.float32).reshape(n, -1) for name in INPUT_BLOCKS],
            axis=1,
        )
        y = np.asarray(blocks[OUTPUT_BLOCK], dtype=np.float32).reshape(n, -1)
        return x, y

    def unflatten(self, x: np.ndarray, y: np.ndarray | None = None) -> Dict[str, np.ndarray]:
        """Inverse of :meth:`flatten`; ``y`` is optional (predictions come without inputs)."""
        shapes = self.block_shapes()
        n = len(x)
        blocks = {name: x[:, sl].reshape((n,) + shapes[name]) for name, sl in self.x_slices().items()}
        if y is not None:
            blocks[OUTPUT_BLOCK] = y.reshape((len(y),) + shapes[OUTPUT_BLOCK])
        return blocks

    def check_blocks(self, blocks: Dict[str, np.ndarray]) -> None:
        """Raise ``ValueError`` naming the first block whose shape does not fit the schema."""
        shapes = self.block_shapes()
        missing = [name for name in shapes if name not in blocks]
        if missing:
            raise ValueError(f"missing blocks: {', '.join(missing)}")
        n = len(blocks[OUTPUT_BLOCK])
        for name, shape in shapes.items():
            got = tuple(np.shape(blocks[name]))
            if got != (n,) + shape:
                raise ValueError(f"block {name} has shape {got}, expected {(n,) + shape}")

    def to_dict(self) -> dict:
        return {
            "levels": self.levels,
            "blocks": {name: list(shape) for name, shape in self.block_shapes().items()},
            "variables": self.block_variables(),
            "n_x": self.n_x,
            "n_y": self.n_y,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ColumnSchema":
        return cls(levels=int(data["levels"]))
