"""Synthetic timing streams: a simulated clock and simulated work, to test timing and gates on a CPU.

``paired_timing(..., clock=sim)`` with variants ``sim.work(seconds)`` times simulated work that carries
realistic noise: lognormal jitter, rare slow outliers and a drift shared by every variant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


class SimulatedClock:
    """A clock that advances only when simulated work runs.

    Each call of a ``work(seconds)`` callable advances the clock by
    ``seconds * drift(now) * jitter * outlier``:

    * ``jitter = exp(N(0, jitter_sigma))``, per call;
    * ``outlier`` is 1, or with probability ``outlier_rate`` uniform in ``outlier_range`` (a call that
      was slowed, e.g. by a clock dip);
    * ``drift(now) = (1 + drift_per_s * now) * (1 + wobble * sin(2 pi now / wobble_period_s))``, a
      trend plus a slow oscillation shared by all variants.

    Parameters
    ----------
    seed : int
    jitter_sigma, outlier_rate, outlier_range, drift_per_s, wobble, wobble_period_s :
        As above; the defaults give 2% jitter, 1% outliers of +10% to +60%, +20% per simulated second
        and a 2% oscillation with a 50 ms period.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        jitter_sigma: float = 0.02,
        outlier_rate: float = 0.01,
        outlier_range: tuple[float, float] = (1.1, 1.6),
        drift_per_s: float = 0.2,
        wobble: float = 0.02,
        wobble_period_s: float = 0.05,
    ):
        self.rng = np.random.default_rng(seed)
        self.jitter_sigma = jitter_sigma
        self.outlier_rate = outlier_rate
        self.outlier_range = outlier_range
        self.drift_per_s = drift_per_s
        self.wobble = wobble
        self.wobble_period_s = wobble_period_s
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def drift(self) -> float:
        trend = 1.0 + self.drift_per_s * self.now
        return trend * (1.0 + self.wobble * math.sin(2 * math.pi * self.now / self.wobble_period_s))

    def work(self, seconds: float) -> Callable[[], None]:
        """A callable that advances the clock by one noisy call of nominal length ``seconds``."""

        def run() -> None:
            factor = math.exp(self.rng.normal(0.0, self.jitter_sigma))
            if self.rng.random() < self.outlier_rate:
                factor *= self.rng.uniform(*self.outlier_range)
            self.now += seconds * self.drift() * factor

        return run
