"""Layer 4, scaling: the arithmetic of data parallelism and its figures, in one place.

- :mod:`.arithmetic`: global batch -> per-device batch, the learning-rate rules, warm-up;
- :mod:`.allreduce`: an all-reduce's payloads, algbw/busbw and its alpha-beta fit;
- :mod:`.projection`: predicted DDP step time and samples/s for N devices x M nodes.
"""
from .arithmetic import LR_RULES, ScalingPlan, lr_factor, plan, warmup_factor

__all__ = ["LR_RULES", "ScalingPlan", "lr_factor", "plan", "warmup_factor"]
