"""casebook.stats: the summary of repeated timings, when a median is stable, the weighted geomean."""

from __future__ import annotations

import math

import numpy as np
import pytest

from casebook.stats import median_stable, summarize, weighted_geomean


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
    assert not median_stable(noisy[:10], 0.005)  # RSE of the median 1.2533 * 10% / sqrt(10) = 4%
    assert median_stable(noisy, 0.005)  # 1.2533 * 10% / sqrt(1000) = 0.4%
    assert not median_stable(noisy, 0.003)


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
