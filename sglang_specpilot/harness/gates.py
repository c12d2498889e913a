"""Decisions from paired timings: the promotion gate and the kernel-gain gate.

Both return a JSON-serializable verdict that carries every number behind the decision, so a rejected
candidate can be explained and the verdict stored as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .jsonable import JsonMixin
from .stats import RatioCI, log_ratio_ci
from .timing import PairedTimes

DEFAULT_MIN_GAIN = 0.01  # SpecPilot: the 95% lower bound must clear 1% plus twice the noise
DEFAULT_KERNEL_DELTA = 0.01
DEFAULT_KERNEL_Z = 1.96  # two-sided 95% normal quantile


@dataclass
class PromotionVerdict(JsonMixin):
    """Outcome of ``promotion_gate``; gains are ``time(baseline) / time(candidate) - 1``."""

    promoted: bool
    gain: float
    gain_low: float
    gain_high: float
    threshold: float
    min_gain: float
    noise: float
    confidence: float
    blocks: int
    reason: str


def promotion_gate(ratio: RatioCI, noise: float, *, min_gain: float = DEFAULT_MIN_GAIN) -> PromotionVerdict:
    """Promote a candidate only if the lower bound of its gain exceeds ``min_gain + 2 * noise``.

    Parameters
    ----------
    ratio : RatioCI
        Paired ratio ``time(baseline) / time(candidate)``, e.g. ``times.ratio("stock", "cand")``.
        Its lower bound is the lower end of the two-sided interval at ``ratio.confidence`` (95%), which
        is a one-sided 97.5% bound: slightly stricter than a one-sided 95% bound.
    noise : float
        The stock-vs-stock noise floor (``stock_vs_stock_noise``), measured with the same settings.
    min_gain : float
        The gain required above the noise; 1% as in SpecPilot.

    Returns
    -------
    PromotionVerdict
    """
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    threshold = min_gain + 2.0 * noise
    promoted = ratio.gain_low > threshold
    relation = ">" if promoted else "<="
    reason = (
        f"gain lower bound {ratio.gain_low:+.4f} {relation} threshold {threshold:.4f} "
        f"(= {min_gain:.4f} + 2 x noise {noise:.4f})"
    )
    return PromotionVerdict(
        promoted=bool(promoted),
        gain=ratio.gain,
        gain_low=ratio.gain_low,
        gain_high=ratio.gain_high,
        threshold=threshold,
        min_gain=min_gain,
        noise=noise,
        confidence=ratio.confidence,
        blocks=ratio.blocks,
        reason=reason,
    )


@dataclass
class KernelGainVerdict(JsonMixin):
    """Outcome of ``kernel_gain_gate``; ``v`` is v(g), the members' summed time over the group's."""

    admitted: bool
    group: str
    members: list[str]
    v: float
    v_low: float
    v_high: float
    threshold: float
    delta: float
    z: float
    s: float
    blocks: int
    group_median_s: float
    member_median_s: dict[str, float]
    reason: str


def kernel_gain_gate(
    times: PairedTimes,
    members: Sequence[str],
    group: str,
    *,
    delta: float = DEFAULT_KERNEL_DELTA,
    z: float = DEFAULT_KERNEL_Z,
    confidence: float = 0.95,
) -> KernelGainVerdict:
    """Admit a fused group g only if ``v(g) > 1 + max(delta, z * s)``.

    ``v(g) = sum_k time(member_k) / time(g)``, estimated from the per-block ratios of one interleaved
    run in which the members were timed separately and the group as one variant (include in ``g``'s
    callable all the work the group launches). ``s`` is the standard error of the paired timing
    relative to the group's time: the bootstrap standard error of ``log v``, which to first order is
    the standard error of ``sum_k time(member_k) - time(g)`` divided by ``time(g)``.

    Parameters
    ----------
    times : PairedTimes
        A run holding every member and the group, e.g. ``paired_timing({"m0": .., "m1": .., "g": ..})``
        with weight copies rotated.
    members : sequence of str
        The members' variant names (one name is fine if it runs all members back to back).
    group : str
        The group's variant name.
    delta : float
        Minimum gain margin.
    z : float
        How many standard errors the gain must clear.
    confidence : float
        Coverage of the reported interval of v(g) (the decision uses ``z`` and ``s``).

    Returns
    -------
    KernelGainVerdict
    """
    if not members:
        raise ValueError("a group needs at least one member")
    separate = np.sum([times.block_times(m) for m in members], axis=0)
    ci = log_ratio_ci(separate, times.block_times(group), confidence=confidence)
    s = ci.log_se
    threshold = 1.0 + max(delta, z * s)
    admitted = ci.ratio > threshold
    relation = ">" if admitted else "<="
    reason = f"v(g) {ci.ratio:.4f} {relation} 1 + max(delta {delta:.4f}, z {z:.2f} x s {s:.4f}) = {threshold:.4f}"
    return KernelGainVerdict(
        admitted=bool(admitted),
        group=group,
        members=list(members),
        v=ci.ratio,
        v_low=ci.low,
        v_high=ci.high,
        threshold=threshold,
        delta=delta,
        z=z,
        s=s,
        blocks=ci.blocks,
        group_median_s=times.median(group),
        member_median_s={m: times.median(m) for m in members},
        reason=reason,
    )
