"""Adaptive draft length: each row's wanted depth from its recent acceptance; the batch runs the deepest
any row wants.

Rounds are captured CUDA graphs of static shape, so a depth is a round kind (one captured graph per
depth and bucket), not a per-row mask: masking rows' tails would keep the deepest shape's draft steps
and verify block, and with them its cost, for every row. A few depths (the seed's 16, 12, 8) keep the
number of graphs small. The batch takes the maximum over its rows, so no row is cut below what it
accepts; a batch of easy and hard rows then runs deep, which is what the shared node budget corrects
inside the verify pass.

A row wants the smallest depth that leaves ``HEADROOM`` tokens above its mean accepted length (the
EMA of tokens per round, minus the bonus); a row whose last round accepted every drafted token wants
the next depth up even so, since a capped round cannot show how much more it would have accepted.
"""

from __future__ import annotations

HEADROOM = 2.0


def wanted_depth(tokens: float | None, capped: bool, depths: tuple[int, ...], current: int | None) -> int:
    """``depths`` ascending; ``tokens`` the row's EMA of tokens per round (None: unknown -> deepest)."""
    if tokens is None:
        return depths[-1]
    need = next((d for d in depths if d >= tokens - 1.0 + HEADROOM), depths[-1])
    if capped and current is not None:
        need = max(need, next((d for d in depths if d > current), depths[-1]))
    return need


def batch_depth(rows: list[tuple[float | None, bool]], depths: tuple[int, ...], current: int | None) -> int:
    return max((wanted_depth(t, c, depths, current) for t, c in rows), default=depths[-1])
