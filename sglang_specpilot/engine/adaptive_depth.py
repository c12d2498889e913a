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

That rule is the fallback. Where the step curve has measured every candidate depth's round at the batch's
bucket, the batch runs the depth with the most estimated tokens per millisecond (``best_depth``), from
counterfactuals (``DepthEstimates``), as adaptive width does for widths. Why: on the H200 (lifted 8B, one
client, 2bcb6d1) the rule ran 149 of 385 rounds at depth 3 or 4, which saved 0.5 to 0.7 ms a round
(6.56 ms at depth 6, 6.08 at 4, 5.82 at 3), and the batch (automatic off's AR rounds included) emitted 2.79
tokens a round against plain depth 6's 3.24 and served 432 tok/s against 468. A row capped at the depth
it ran still lifts the batch to the next depth up, since its estimates above that depth are stale lower
bounds; and after ``probe_every`` rounds in a row below the main depth the main depth runs once, which
refreshes the estimates no shallower round can (``SpecPolicy._choose_depth``).
"""

from __future__ import annotations

from .acceptance import ALPHA
from .estimates import RowEstimates, most_per_ms

HEADROOM = 2.0


def wanted_depth(tokens: float | None, capped: bool, depths: tuple[int, ...], current: int | None) -> int:
    """``depths`` ascending; ``tokens`` the row's EMA of tokens per round (None: unknown -> deepest)."""
    if tokens is None:
        return depths[-1]
    need = next((d for d in depths if d >= tokens - 1.0 + HEADROOM), depths[-1])
    if capped and current is not None:
        need = max(need, next_depth(depths, current))
    return need


def batch_depth(rows: list[tuple[float | None, bool]], depths: tuple[int, ...], current: int | None) -> int:
    return max((wanted_depth(t, c, depths, current) for t, c in rows), default=depths[-1])


class DepthEstimates(RowEstimates):
    """Per row and depth d, an EMA (``acceptance.ALPHA``) of the tokens a round at depth d would have
    emitted, from every speculative round at depth >= d.

    A round at depth D whose row accepted ``a`` drafted tokens would have emitted ``min(a, d) + 1`` at any
    depth d <= D. For a chain that is exact (the drafter drafts the same first d tokens at any depth). For
    a best-first tree it is an estimate: the shallower tree of the same node budget spreads its nodes
    wider (``round_kinds.depth_shape``), so it may accept a sibling path the deeper tree did not verify."""

    def __init__(self, rows: int, depths: tuple[int, ...], alpha: float = ALPHA):
        super().__init__(rows, alpha)
        self.depths = depths

    def observe(self, row: int, tokens: int, depth: int) -> None:
        """A round at draft depth ``depth`` emitted ``tokens`` (accepted drafts + the bonus) for ``row``."""
        for d in self.depths:
            if d <= depth:
                self.update(row, d, min(tokens - 1, d) + 1)

    def tau(self, rows: list[int], depth: int) -> float | None:
        """Mean estimate at ``depth`` over the ``rows`` that have one (``estimates.known_mean``)."""
        return self.mean(rows, depth)


best_depth = most_per_ms  # the depth of [(depth, kind key)] with the most estimated tokens per ms, or None


def next_depth(depths: tuple[int, ...], current: int) -> int:
    """The depth above ``current`` (the deepest where none is)."""
    return next((d for d in depths if d > current), depths[-1])
