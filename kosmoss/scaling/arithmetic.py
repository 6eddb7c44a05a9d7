"""The scaling arithmetic, in one place: global batch -> per-device batch, and the
learning rate that goes with the effective batch.

``--lr`` is the rate tuned for ``base_batch_size`` (default: the per-device batch). With
``k = global batch / base batch``: ``linear`` multiplies it by k (Goyal et al. 2017),
``sqrt`` by sqrt(k) (argued by Hoffer et al. 2017; derived for Adam by Malladi et al.
2022), ``none`` keeps it. ``warmup_steps`` ramps the rate
linearly from the base rate to the scaled one (Goyal et al.'s gradual warm-up).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional

from ..core.errors import ConfigError

LR_RULES = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class ScalingPlan:
    world_size: int
    num_nodes: int
    devices_per_node: int
    global_batch_size: int
    per_device_batch_size: int
    base_batch_size: int
    base_lr: float
    lr: float
    lr_rule: str
    lr_factor: float
    warmup_steps: int = 0

    def lines(self) -> List[str]:
        """The arithmetic as a learner would write it down."""
        return [
            f"world size      = {self.num_nodes} node(s) x {self.devices_per_node} "
            f"process(es) = {self.world_size}",
            f"global batch    = {self.global_batch_size}",
            f"per-device batch = {self.global_batch_size} / {self.world_size} = "
            f"{self.per_device_batch_size}",
            f"learning rate   = {self.base_lr:g} (base, tuned for batch {self.base_batch_size})"
            f" x {self.lr_factor:.4g} ({self.lr_rule}) = {self.lr:.6g}",
        ] + ([f"warm-up         = linear from {self.base_lr:g} to {self.lr:.6g} over "
              f"{self.warmup_steps} steps"] if self.warmup_steps else [])

    def as_dict(self) -> dict:
        return asdict(self)


def lr_factor(rule: str, k: float) -> float:
    if rule not in LR_RULES:
        raise ConfigError("scale_lr", f"{{field}} {rule!r}: choose one of {', '.join(LR_RULES)}")
    return {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]


def plan(global_batch_size: int, base_lr: float, lr_rule: str = "none", *,
         num_nodes: int = 1, devices_per_node: int = 1,
         base_batch_size: Optional[int] = None, warmup_steps: int = 0) -> ScalingPlan:
    """Check the numbers and derive the rest; raises :class:`ConfigError` naming the field."""
    world = num_nodes * devices_per_node
    if global_batch_size < world:
        raise ConfigError("batch_size", f"{{field}} {global_batch_size} is smaller than the world size "
                         f"{world}: give at least one sample per process")
    if global_batch_size % world:
        low = global_batch_size // world * world
        raise ConfigError("batch_size", f"{{field}} {global_batch_size} is not divisible by the world size "
                         f"{world}: use a multiple of {world}, e.g. {low} or {low + world}")
    if not base_lr > 0 or not math.isfinite(base_lr):
        raise ConfigError("lr", f"{{field}} {base_lr}: the learning rate must be a number > 0")
    per_device = global_batch_size // world
    base = per_device if base_batch_size is None else base_batch_size
    if base < 1:
        raise ConfigError("base_batch_size", f"{{field}} {base}: must be >= 1")
    if warmup_steps < 0:
        raise ConfigError("warmup_steps", f"{{field}} {warmup_steps}: must be >= 0")
    factor = lr_factor(lr_rule, global_batch_size / base)
    return ScalingPlan(world, num_nodes, devices_per_node, global_batch_size, per_device,
                       base, base_lr, base_lr * factor, lr_rule, factor, warmup_steps)


def warmup_factor(step: int, warmup_steps: int, start_fraction: float) -> float:
    """Multiplier of the scaled rate at ``step``: ``start_fraction`` (base / scaled) at 0,
    rising linearly to 1 at ``warmup_steps``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return start_fraction + (1.0 - start_fraction) * step / warmup_steps
