"""casebook.stats: the summary of repeated timings, when a median is stable, the weighted geomean."""

from __future__ import annotations

import math

import numpy as np
import pytest

from casebook.stats import median_ci, median_stable, summarize, weighted_geomean


def test_summary_of_known_times():
    s = summarize([float(t) for t in range(1, 11)])  # 1..10 us
    assert s.median_us == pytest.approx(5.5)
    assert s.p10_us == pytest.approx(1.9)  # linear interpolation, as numpy.percentile
    assert s.p90_us == pytest.approx(9.1)
    assert s.mean_us == pytest.approx(5.5)
    assert s.cv == pytest.approx(np.std(range(1, 11), ddof=1) / 5.5)
    assert s.repetitions == 10
    assert s.spread == pytest.approx((9.1 - 1.9) / 5.5)
    assert s.as_dict()["median_us"] == pytest.approx(5.5)


def test_median_ignores_outliers():
    s = summarize([10.0] * 9 + [1e6])
    assert s.median_us == 10.0 and s.p10_us == 10.0
    assert s.cv > 1


def test_one_time():
    s = summarize(np.array([3.0]))
    assert (s.median_us, s.p10_us, s.p90_us, s.cv, s.repetitions) == (3.0, 3.0, 3.0, 0.0, 1)


def test_no_times():
    with pytest.raises(ValueError, match="no timings"):
        summarize([])


def test_median_stable():
    rng = np.random.default_rng(0)
    noisy = list(100 + 10 * rng.standard_normal(1000))  # cv 10%
    assert not median_stable([100.0] * 4, 0.01), "fewer than 5 repetitions are never stable"
    assert median_stable([100.0] * 5, 0.01)
    assert not median_stable(noisy[:10], 0.005)
    # 95% half-width ~ 1.96 * 1.2533 * 10% / sqrt(1000) = 0.78%
    assert median_stable(noisy, 0.01)
    assert not median_stable(noisy, 0.005)


def test_median_stable_ignores_the_size_of_outliers():
    rng = np.random.default_rng(1)
    times = list(100 + 0.1 * rng.standard_normal(200)) + [10_000.0] * 10  # 5% of calls hit a hiccup
    assert np.std(times) / np.median(times) > 1, "a normal-theory rule would call this unstable"
    assert median_stable(times, 0.005)


def test_median_ci_covers_the_true_median():
    # Skewed (exponential) samples, whose true median is ln 2: the interval holds it ~95% of the time
    # (more at small n, where whole ranks make it conservative), and is not needlessly wide.
    rng = np.random.default_rng(2)
    for n, least, most in ((10, 0.95, 1.0), (50, 0.93, 0.975), (200, 0.93, 0.975)):
        hits = sum(lo <= np.log(2) <= hi for lo, hi in (median_ci(rng.exponential(size=n)) for _ in range(2000)))
        assert least <= hits / 2000 <= most, (n, hits)


def test_median_ci_of_sorted_ranks():
    lo, hi = median_ci(list(range(1, 101)))  # ranks 100/2 -+ 1.96 * 10 / 2: 40 and 61
    assert (lo, hi) == (40.0, 61.0)
    assert summarize(list(range(1, 101))).ci_lo_us == 40.0


def test_weighted_geomean():
    assert weighted_geomean([2.0, 8.0], [1.0, 1.0]) == pytest.approx(4.0)
    assert weighted_geomean([2.0, 8.0], [3.0, 1.0]) == pytest.approx(2**1.5)
    assert weighted_geomean([2.0, 8.0], [0.3, 0.1]) == pytest.approx(2**1.5), "weights are normalised"
    assert weighted_geomean([1.7], [0.2]) == pytest.approx(1.7)
    # A geomean of speedups is symmetric: a 2x gain and a 2x loss cancel.
    assert weighted_geomean([2.0, 0.5], [1.0, 1.0]) == pytest.approx(1.0)


@pytest.mark.parametrize("values, weights, words", [
    ([], [], "at least one"),
    ([1.0, 2.0], [1.0], "as many weights"),
    ([1.0, 0.0], [1.0, 1.0], "non-positive"),
    ([1.0, -2.0], [1.0, 1.0], "non-positive"),
    ([1.0, 2.0], [0.0, 0.0], "weights"),
    ([1.0, 2.0], [1.0, -1.0], "weights"),
])
def test_weighted_geomean_refuses(values, weights, words):
    with pytest.raises(ValueError, match=words):
        weighted_geomean(values, weights)


def test_weighted_geomean_matches_log_mean():
    rng = np.random.default_rng(1)
    v, w = rng.uniform(0.5, 3, 50), rng.uniform(0.01, 1, 50)
    assert weighted_geomean(list(v), list(w)) == pytest.approx(math.exp(np.average(np.log(v), weights=w)))
