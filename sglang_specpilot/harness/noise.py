"""The noise floor: the stock system timed against itself."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .stats import RatioCI
from .timing import VariantFns, paired_timing


def noise_from_ratio(ci: RatioCI) -> float:
    """Relative spread of a stock-vs-stock paired ratio.

    Defined as ``max(high - 1, 1 - low)`` for the ratio's confidence interval ``[low, high]``: how far
    from 1 (no difference) a ratio of two identical systems can be measured. It includes both the
    random spread (the interval's half-width) and any systematic bias of the measurement, such as a
    slot in the block that is always slower, which a bare standard deviation would miss.
    """
    return max(ci.high - 1.0, 1.0 - ci.low)


def stock_vs_stock_noise(
    stock: VariantFns,
    *,
    stock_b: VariantFns | None = None,
    blocks: int = 30,
    warmup: int = 3,
    inner: int = 1,
    device: str | torch.device = "cpu",
    confidence: float = 0.95,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Time the stock system against itself in ABBA blocks and return the noise floor.

    Parameters
    ----------
    stock : callable or list of callables
        The stock system's step (one callable per weight copy to rotate through).
    stock_b : callable or list of callables, optional
        A second, separately built instance of stock (e.g. its own captured graph); it exposes
        placement and allocation effects the same callable timed twice cannot. Default ``stock``.
    blocks, warmup, inner, device, clock :
        As for ``paired_timing``; use the same values as the comparison the noise will judge.
    confidence : float
        Coverage of the stock/stock interval.

    Returns
    -------
    float
        ``noise_from_ratio`` of the stock/stock ratio, e.g. 0.004 for 0.4%.
    """
    times = paired_timing(
        {"stock_a": stock, "stock_b": stock if stock_b is None else stock_b},
        blocks=blocks,
        warmup=warmup,
        inner=inner,
        device=device,
        clock=clock,
    )
    return noise_from_ratio(times.ratio("stock_a", "stock_b", confidence=confidence))
