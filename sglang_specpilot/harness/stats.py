"""Confidence intervals for paired timing ratios and for mismatch rates.

Timing ratios use a percentile bootstrap of the median of per-block log-ratios:

* per-block ratios of an ABBA (palindromic) block cancel linear drift, so blocks are the paired unit;
* the median, not the mean, because GPU timings carry rare large outliers (a clock dip, a neighbour's
  kernel): one outlier block moves a mean of 30 log-ratios by a noticeable fraction of a percent, but
  does not move the median; it is also the statistic the papers report ("median of paired ratios");
* a bootstrap, because the median has no simple standard error formula; a fixed seed keeps the interval
  deterministic for the same data.

The bootstrap interval needs about 20 or more blocks to reach its nominal coverage; the simulated
coverage is checked in ``tests/test_harness_stats.py``.

Mismatch rates use Wilson score intervals, and a difference of two rates Newcombe's hybrid score
interval built from the two Wilson intervals; both behave at rates near 0, where a normal interval does
not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from .jsonable import JsonMixin

DEFAULT_RESAMPLES = 4000


def normal_quantile(p: float) -> float:
    """Quantile of the standard normal distribution, e.g. ``normal_quantile(0.975) = 1.95996``."""
    return NormalDist().inv_cdf(p)


@dataclass
class RatioCI(JsonMixin):
    """A paired ratio ``numerator / denominator`` with its confidence interval.

    For timings, ``numerator`` is the baseline's time and ``denominator`` the candidate's, so
    ``ratio > 1`` means the candidate is faster and ``ratio - 1`` is its gain.

    Attributes
    ----------
    ratio : float
        ``exp(median(log r_b))`` over the per-block ratios ``r_b``.
    low, high : float
        Bootstrap percentile interval of that median at ``confidence``.
    log_se : float
        Bootstrap standard error of the median log-ratio; to first order the relative standard error
        of the ratio.
    blocks : int
        Number of paired blocks.
    confidence : float
    """

    ratio: float
    low: float
    high: float
    log_se: float
    blocks: int
    confidence: float

    @property
    def gain(self) -> float:
        return self.ratio - 1.0

    @property
    def gain_low(self) -> float:
        return self.low - 1.0

    @property
    def gain_high(self) -> float:
        return self.high - 1.0


def log_ratio_ci(
    numerator: np.ndarray,
    denominator: np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> RatioCI:
    """Median paired ratio and its bootstrap confidence interval.

    Parameters
    ----------
    numerator, denominator : array of float, shape [blocks]
        Paired positive measurements; block ``b`` of one pairs with block ``b`` of the other.
    confidence : float
        Two-sided coverage of the interval.
    resamples : int
        Bootstrap resamples; 4000 puts the Monte Carlo error of a 2.5% quantile well below the
        interval's own width.
    seed : int
        Seed of the resampling, fixed so that the same data give the same interval.

    Returns
    -------
    RatioCI
    """
    num = np.asarray(numerator, dtype=np.float64).reshape(-1)
    den = np.asarray(denominator, dtype=np.float64).reshape(-1)
    if num.shape != den.shape:
        raise ValueError(f"paired arrays differ in length: {num.shape[0]} vs {den.shape[0]}")
    if num.size < 2:
        raise ValueError("a paired ratio needs at least 2 blocks")
    if not (np.all(num > 0) and np.all(den > 0)):
        raise ValueError("timings must be positive")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    log_r = np.log(num) - np.log(den)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, log_r.size, size=(resamples, log_r.size))
    medians = np.median(log_r[idx], axis=1)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(medians, [alpha / 2, 1 - alpha / 2])
    return RatioCI(
        ratio=float(np.exp(np.median(log_r))),
        low=float(np.exp(lo)),
        high=float(np.exp(hi)),
        log_se=float(medians.std(ddof=1)),
        blocks=int(log_r.size),
        confidence=confidence,
    )


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` of a binomial proportion ``successes / trials``."""
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"successes {successes} outside [0, {trials}]")
    z = normal_quantile(0.5 + confidence / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_difference_interval(
    k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Newcombe's hybrid score interval for the difference of two proportions ``k1/n1 - k2/n2``.

    Returns
    -------
    (difference, low, high) : tuple of float
    """
    p1 = k1 / n1 if n1 else 0.0
    p2 = k2 / n2 if n2 else 0.0
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return d, low, high
