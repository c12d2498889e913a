"""Final acceptance of a multi-part change: keep only parts that contribute measurable value.

A change made of parts (ranges of joint nodes, stacked patches) is pruned by leave-one-out. Part p's
own gain is ``time(S - {p}) / time(S) - 1`` for the current set S. Parts whose gain does not clear the
noise threshold are weak. The weak parts are all removed together, unless S is measurably faster than
S without them (their value lies in their interaction). After a removal the survivors are checked
again, since a part's gain can depend on which other parts are present.

"Clears the threshold" means the lower end of the paired 95% interval exceeds ``noise_threshold``, for
a single part and for the weak parts together alike: a retained part must contribute value that the
measurement can tell from noise, alone or jointly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .jsonable import JsonMixin
from .stats import RatioCI

TimePair = Callable[[frozenset[str], frozenset[str]], RatioCI]


@dataclass
class LeaveOneOutRound(JsonMixin):
    """One round of pruning: the set it started from and what it measured."""

    parts: list[str]
    part_gains: dict[str, dict[str, float]]
    weak: list[str]
    joint_gain: dict[str, float] | None
    removed: list[str]


@dataclass
class AcceptanceVerdict(JsonMixin):
    """Outcome of ``leave_one_out``: the parts kept, the parts dropped and every round's numbers."""

    kept: list[str]
    dropped: list[str]
    noise_threshold: float
    rounds: list[LeaveOneOutRound] = field(default_factory=list)


def _gain(ci: RatioCI) -> dict[str, float]:
    return {"gain": ci.gain, "gain_low": ci.gain_low, "gain_high": ci.gain_high}


def leave_one_out(parts: Sequence[str], time_pair: TimePair, *, noise_threshold: float) -> AcceptanceVerdict:
    """Prune the parts of a change whose contribution does not clear the noise threshold.

    Parameters
    ----------
    parts : sequence of str
        Names of the change's parts.
    time_pair : callable ``(reduced, full) -> RatioCI``
        Times the change restricted to the part sets ``reduced`` and ``full`` against each other in
        one paired, interleaved run and returns the ratio ``time(reduced) / time(full)`` (above 1 when
        ``full`` is faster), e.g. ``paired_timing({"reduced": .., "full": ..}).ratio("reduced", "full")``.
    noise_threshold : float
        Gain a part (or the weak parts together) must clear, e.g. ``0.01 + 2 * noise``.

    Returns
    -------
    AcceptanceVerdict
    """
    if len(set(parts)) != len(parts):
        raise ValueError(f"part names repeat: {list(parts)}")
    current = list(parts)
    verdict = AcceptanceVerdict(kept=[], dropped=[], noise_threshold=noise_threshold)
    while current:
        full = frozenset(current)
        cis = {p: time_pair(full - {p}, full) for p in current}
        weak = [p for p in current if cis[p].gain_low <= noise_threshold]
        joint = None
        removed: list[str] = []
        if len(weak) == 1:
            # Removing one weak part is exactly its leave-one-out comparison: nothing new to time.
            removed = weak
        elif weak:
            joint_ci = time_pair(full - set(weak), full)
            joint = _gain(joint_ci)
            if joint_ci.gain_low <= noise_threshold:
                removed = weak
        verdict.rounds.append(
            LeaveOneOutRound(
                parts=list(current),
                part_gains={p: _gain(ci) for p, ci in cis.items()},
                weak=weak,
                joint_gain=joint,
                removed=removed,
            )
        )
        if not removed:
            break
        current = [p for p in current if p not in removed]
        verdict.dropped.extend(removed)
    verdict.kept = current
    return verdict
