"""module_utils/bench_stats: quantiles as numpy computes them, CV, summaries, the bootstrap ratio interval."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ansible.module_utils import bench_stats as bs

SAMPLES = [
    [5.0],
    [3.0, 1.0],
    [1.0, 2.0, 3.0, 4.0],
    [26.1, 25.9, 26.5, 26.2, 26.3],
    [random.Random(7).uniform(10, 40) for _ in range(37)],
]


@pytest.mark.parametrize("values", SAMPLES)
def test_quantiles_match_numpy(values):
    assert bs.median(values) == pytest.approx(np.percentile(values, 50))
    assert bs.iqr(values) == pytest.approx(np.percentile(values, 75) - np.percentile(values, 25))
    assert bs.minmax(values) == (min(values), max(values))


@pytest.mark.parametrize("values", SAMPLES[1:])
def test_cv_is_sample_stdev_over_mean(values):
    assert bs.cv(values) == pytest.approx(np.std(values, ddof=1) / np.mean(values))


def test_cv_undefined_cases():
    assert bs.cv([3.0]) is None
    assert bs.cv([1.0, -1.0]) is None


def test_summarize():
    summary = bs.summarize([4.0, 1.0, 3.0, 2.0])
    assert summary == {"n": 4, "median": 2.5, "min": 1.0, "max": 4.0, "iqr": 1.5,
                       "cv": pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2.5), "mean": 2.5}
    assert bs.summarize([]) is None
    assert bs.summarize([None, 2.0])["n"] == 1


def test_bad_samples():
    with pytest.raises(ValueError):
        bs.median([])
    with pytest.raises(ValueError):
        bs.median([1.0, math.nan])
    with pytest.raises(ValueError):
        bs.quantile([1.0], 1.5)


def test_bootstrap_is_deterministic_and_brackets_the_ratio():
    rng = random.Random(1)
    cand = [rng.gauss(110, 3) for _ in range(25)]
    inc = [rng.gauss(100, 3) for _ in range(25)]
    first = bs.bootstrap_ratio_ci(cand, inc, n=500, seed=3)
    assert first == bs.bootstrap_ratio_ci(cand, inc, n=500, seed=3)
    lo, hi, ratio = first
    assert ratio == pytest.approx(bs.median(cand) / bs.median(inc))
    assert lo <= ratio <= hi
    assert lo > 1.0  # a 10 % gain over 3 % noise is resolved
    assert bs.bootstrap_ratio_ci(cand, inc, n=500, seed=4) != first


def test_bootstrap_same_distribution_includes_one():
    rng = random.Random(2)
    cand = [rng.gauss(100, 3) for _ in range(25)]
    inc = [rng.gauss(100, 3) for _ in range(25)]
    lo, hi, _ = bs.bootstrap_ratio_ci(cand, inc)
    assert lo < 1.0 < hi


def test_bootstrap_bad_input():
    with pytest.raises(ValueError):
        bs.bootstrap_ratio_ci([], [1.0])
    with pytest.raises(ValueError):
        bs.bootstrap_ratio_ci([1.0], [0.0, 0.0])
    with pytest.raises(ValueError):
        bs.bootstrap_ratio_ci([1.0], [1.0], alpha=0)
