"""The arithmetic of an all-reduce benchmark, on timings already taken: payload sizes,
algbw and busbw (nccl-tests' PERFORMANCE.md), and the latency-bandwidth (α–β) fit.

- algbw = bytes / time: what the caller sees;
- busbw = algbw × 2(n−1)/n: the bytes each link of a ring carries per second (an
  all-reduce sends 2(n−1)/n of the payload over every link), comparable across n and
  against the link's rated speed;
- t(bytes) = α + β·bytes, least squares over the sizes; for a ring of n ranks
  α = 2(n−1)·(latency of one hop) and β = 2(n−1)/n ÷ (link bandwidth), so the fit
  also gives the link's figures (:func:`link_from_fit`) that ``kosmoss project`` uses.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import UsageError

KIB, MIB, GIB = 2**10, 2**20, 2**30
UNITS = {"": 1, "B": 1, "K": KIB, "KB": KIB, "KIB": KIB, "M": MIB, "MB": MIB, "MIB": MIB,
         "G": GIB, "GB": GIB, "GIB": GIB}
DDP_BUCKET_BYTES = 25 * MIB  # torch DistributedDataParallel's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
FLOAT32_BYTES = 4


def parse_size(text: str, flag: str) -> int:
    """``4K``, ``1.5MiB``, ``25M``, ``4096`` → bytes (binary units), a multiple of 4 (float32)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in UNITS:
        raise UsageError(f"{flag} {text}: not a size; write e.g. 4K, 1.5M, 256M or 4096 (bytes)")
    size = int(float(match.group(1)) * UNITS[unit]) // FLOAT32_BYTES * FLOAT32_BYTES
    if size <= 0:
        raise UsageError(f"{flag} {text}: sizes must be positive (at least 4 bytes, one float32)")
    return size


def human_size(size: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{size:.0f} B"


def default_sizes(extra: Iterable[int] = (), max_size: Optional[int] = None) -> List[int]:
    """4 KiB to 256 MiB by factors of 4, plus ``extra`` (the model's gradient, DDP's
    bucket), each at most ``max_size``; sorted, no duplicates."""
    sizes = {4 * KIB * 4**k for k in range(9)} | {int(s) for s in extra}
    return sorted(s for s in sizes if max_size is None or s <= max_size)


MODEL_SHAPE = (4128, (100, 100, 100), 552)  # kosmoss's MLP on 137 levels: n_x, hidden, n_y


def model_gradient_bytes(n_x: int = MODEL_SHAPE[0], hidden: Sequence[int] = MODEL_SHAPE[1],
                         n_y: int = MODEL_SHAPE[2]) -> int:
    """Bytes of float32 gradients of kosmoss's MLP: what DDP all-reduces every step."""
    return FLOAT32_BYTES * sum(p.numel() for p in model_parameters(n_x, hidden, n_y))


def model_parameters(n_x: int, hidden: Sequence[int], n_y: int) -> list:
    from ..model import mlp

    return list(mlp(n_x, hidden, n_y).parameters())


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce factor: each link carries 2(n−1)/n of the payload."""
    return 2 * (ranks - 1) / ranks


def algbw(size: int, seconds: float) -> float:
    return size / seconds


def busbw(size: int, seconds: float, ranks: int) -> float:
    return algbw(size, seconds) * bus_factor(ranks)


@dataclass(frozen=True)
class Fit:
    """t(bytes) = alpha_s + beta_s_per_byte × bytes for an all-reduce over ``ranks``."""

    alpha_s: float
    beta_s_per_byte: float
    ranks: int

    def time(self, size: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * size

    def as_dict(self) -> dict:
        link = link_from_fit(self)
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte,
                "ranks": self.ranks, "asymptotic_algbw_Bps": _inverse(self.beta_s_per_byte),
                "link_latency_s": link["latency_s"], "link_bandwidth_Bps": link["bandwidth_Bps"]}


def _inverse(value: float) -> Optional[float]:
    return 1.0 / value if value > 0 else None


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float], ranks: int) -> Fit:
    """Least squares of t = α + β·bytes, each point weighted by 1/t: the sizes span five
    orders of magnitude, and unweighted the largest size's noise alone would set α."""
    if len(sizes) < 2 or len(set(sizes)) < 2:
        raise ValueError("an α–β fit needs at least two different sizes")
    size, time = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.stack([np.ones_like(size), size], axis=1) / time[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(time), rcond=None)
    return Fit(float(alpha), float(beta), ranks)


def link_from_fit(fit: Fit) -> Dict[str, Optional[float]]:
    """The hop latency and link bandwidth of the ring that explains the fit:
    α = 2(n−1)·latency, β = bus_factor(n) / bandwidth."""
    steps = 2 * (fit.ranks - 1)
    bandwidth = _inverse(fit.beta_s_per_byte)
    return {"latency_s": max(fit.alpha_s, 0.0) / steps,
            "bandwidth_Bps": None if bandwidth is None else bandwidth * bus_factor(fit.ranks)}


def size_row(size: int, times: Sequence[float], ranks: int,
             waits: Optional[Sequence[float]] = None,
             compute: Optional[Tuple[float, float]] = None) -> dict:
    """One size's figures from its repeats (each the slowest rank's time). After compute:
    ``waits``, how long the mean rank waited for the last to arrive; ``compute``, the mean
    compute step's seconds with every rank computing and with one alone."""
    median = statistics.median(times)
    row = {"bytes": size, "size": human_size(size), "repeats": len(times), "time_s": median,
           "min_time_s": min(times), "max_time_s": max(times),
           "mean_time_s": statistics.fmean(times),  # what a training step pays on average
           "algbw_Bps": algbw(size, median), "busbw_Bps": busbw(size, median, ranks)}
    if waits is not None:
        row["wait_s"] = statistics.fmean(waits)
    if compute is not None:
        row["compute_s"], row["compute_alone_s"] = compute
    return row


def fit_rows(rows: Sequence[dict], ranks: int, statistic: str = "time_s") -> Optional[Fit]:
    """The α–β fit of the rows' medians (``time_s``: what the link does), or of their
    means (``mean_time_s``: what a training step pays, slow repeats included)."""
    if len({row["bytes"] for row in rows}) < 2:
        return None
    return fit_alpha_beta([row["bytes"] for row in rows], [row[statistic] for row in rows],
                          ranks)
