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
    ci_lo_us: float = 0.0
    ci_hi_us: float = 0.0
    """The median's 95% confidence interval (`median_ci`)."""

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
    lo, hi = median_ci(t)
    return Summary(
        median_us=float(np.median(t)),
        p10_us=float(np.percentile(t, 10)),
        p90_us=float(np.percentile(t, 90)),
        mean_us=mean,
        cv=float(t.std(ddof=1) / mean) if t.size > 1 else 0.0,
        repetitions=int(t.size),
        min_us=float(t.min()),
        ci_lo_us=lo,
        ci_hi_us=hi,
    )


Z95 = 1.959964


def median_ci(times_us: list[float] | np.ndarray, z: float = Z95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median (95% by default): the order statistics of ranks
    n/2 -+ z sqrt(n)/2, from the binomial count of samples below the true median. It assumes nothing about
    the distribution's shape: a few outliers widen it by their number, not their size, and a bimodal or
    skewed distribution gets an honest width (a normal-theory error of the median does neither)."""
    t = np.sort(np.asarray(times_us, dtype=np.float64))
    n = t.size
    half = z * math.sqrt(n) / 2
    lo = max(math.floor(n / 2 - half), 1)
    hi = min(math.ceil(n / 2 + 1 + half), n)
    return float(t[lo - 1]), float(t[hi - 1])


def median_stable(times_us: list[float], target: float) -> bool:
    """True when the median's 95% confidence interval (`median_ci`) is narrower than `target` of the
    median on either side."""
    if len(times_us) < 5:
        return False
    lo, hi = median_ci(times_us)
    return (hi - lo) / 2 < target * float(np.median(times_us))


def weighted_geomean(values: list[float], weights: list[float]) -> float:
    if not values or len(values) != len(weights):
        raise ValueError("need as many weights as values, at least one")
    if any(v <= 0 for v in values):
        raise ValueError("geometric mean of non-positive values")
    total = sum(weights)
    if any(w < 0 for w in weights) or not total > 0:
        raise ValueError("weights must be non-negative and not all zero")
    return math.exp(sum(w * math.log(v) for v, w in zip(values, weights)) / total)
