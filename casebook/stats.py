"""Summary statistics of repeated timings, and the weighted geometric mean of speedups."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    cv: float
    repetitions: int
    min_us: float = 0.0

    @property
    def spread(self) -> float:
        """Relative p10-p90 width."""
        return (self.p90_us - self.p10_us) / self.median_us

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(times_us: list[float] | np.ndarray) -> Summary:
    t = np.asarray(times_us, dtype=np.float64)
    if t.size == 0:
        raise ValueError("no timings to summarize")
    mean = float(t.mean())
    return Summary(
        median_us=float(np.median(t)),
        p10_us=float(np.percentile(t, 10)),
        p90_us=float(np.percentile(t, 90)),
        mean_us=mean,
        cv=float(t.std(ddof=1) / mean) if t.size > 1 else 0.0,
        repetitions=int(t.size),
        min_us=float(t.min()),
    )


def median_stable(times_us: list[float], target: float) -> bool:
    """True when the median's relative standard error (1.2533 sigma / sqrt(n)) is under `target`."""
    n = len(times_us)
    if n < 5:
        return False
    t = np.asarray(times_us)
    return 1.2533 * t.std(ddof=1) / math.sqrt(n) / np.median(t) < target


def weighted_geomean(values: list[float], weights: list[float]) -> float:
    if not values or len(values) != len(weights):
        raise ValueError("need as many weights as values, at least one")
    if any(v <= 0 for v in values):
        raise ValueError("geometric mean of non-positive values")
    total = sum(weights)
    if any(w < 0 for w in weights) or not total > 0:
        raise ValueError("weights must be non-negative and not all zero")
    return math.exp(sum(w * math.log(v) for v, w in zip(values, weights)) / total)
