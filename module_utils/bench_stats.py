"""Robust statistics for decode benchmarks (standard library only; runs on hosts and the controller).

Quantiles use linear interpolation between order statistics (numpy's default, "type 7"), so the figures
match what an operator gets from ``numpy.percentile``. The coefficient of variation uses the sample
standard deviation (n - 1). ``bootstrap_ratio_ci`` is the keep rule's test: a percentile bootstrap of
median(candidate) / median(incumbent), deterministic for a seed.
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Sequence


def _clean(values: Sequence[float]) -> list[float]:
    data = [float(v) for v in values if v is not None]
    if any(math.isnan(v) for v in data):
        raise ValueError("values contain NaN")
    return data


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) with linear interpolation; ValueError on an empty sample."""
    data = sorted(_clean(values))
    if not data:
        raise ValueError("quantile of an empty sample")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], not {q}")
    pos = (len(data) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    """Interquartile range Q3 - Q1."""
    return quantile(values, 0.75) - quantile(values, 0.25)


def minmax(values: Sequence[float]) -> tuple[float, float]:
    data = _clean(values)
    if not data:
        raise ValueError("minmax of an empty sample")
    return min(data), max(data)


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation (sample stdev / mean); None for fewer than two values or a zero mean."""
    data = _clean(values)
    if len(data) < 2:
        return None
    mean = statistics.fmean(data)
    if mean == 0:
        return None
    return statistics.stdev(data) / abs(mean)


def summarize(values: Sequence[float]) -> dict | None:
    """n, median, min, max, IQR, CV and mean of a sample; None for an empty one."""
    data = _clean(values)
    if not data:
        return None
    lo, hi = minmax(data)
    return {"n": len(data), "median": median(data), "min": lo, "max": hi, "iqr": iqr(data), "cv": cv(data),
            "mean": statistics.fmean(data)}


def bootstrap_ratio_ci(candidate: Sequence[float], incumbent: Sequence[float], n: int = 2000, seed: int = 0,
                       alpha: float = 0.05) -> tuple[float, float, float]:
    """(lo, hi, ratio): ratio = median(candidate) / median(incumbent) and its (1 - alpha) percentile
    bootstrap interval, resampling both samples independently ``n`` times with ``random.Random(seed)``."""
    cand, inc = _clean(candidate), _clean(incumbent)
    if not cand or not inc:
        raise ValueError("bootstrap_ratio_ci needs two non-empty samples")
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    base = median(inc)
    if base == 0:
        raise ValueError("the incumbent's median is zero: no ratio")
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        inc_median = median(rng.choices(inc, k=len(inc)))
        cand_median = median(rng.choices(cand, k=len(cand)))
        ratios.append(cand_median / inc_median if inc_median else math.inf)
    return quantile(ratios, alpha / 2), quantile(ratios, 1 - alpha / 2), median(cand) / base
