"""Per-row estimates of tokens per round by round shape, and the shape with the most tokens per millisecond:
what adaptive depth (``adaptive_depth.DepthEstimates``) and adaptive width (``adaptive_width.WidthEstimates``)
choose by. Each keeps, per row and shape, an EMA (``acceptance.ALPHA``) of what a round of that shape would
have emitted, known from the rounds that ran (their counterfactuals differ: see the two modules)."""

from __future__ import annotations

from .acceptance import ALPHA


class RowEstimates:
    """Per row, an EMA of tokens per round for each shape key."""

    def __init__(self, rows: int, alpha: float = ALPHA):
        self.alpha = alpha
        self.est: list[dict] = [{} for _ in range(rows)]

    def update(self, row: int, key, tokens: float) -> None:
        old = self.est[row].get(key)
        self.est[row][key] = float(tokens) if old is None else old + self.alpha * (tokens - old)

    def mean(self, rows: list[int], key) -> float | None:
        """Mean estimate of ``key`` over ``rows``; None where a row has none."""
        vals = [self.est[r].get(key) for r in rows]
        if not vals or any(v is None for v in vals):
            return None
        return sum(vals) / len(vals)

    def forget(self, row: int) -> None:
        self.est[row] = {}


def most_per_ms(candidates: list[tuple[int, object]], tau, ms) -> int | None:
    """The choice of ``candidates`` [(choice, kind key)] with the highest ``tau(choice) / ms(key)``; None when
    any candidate lacks either (the caller keeps its default)."""
    scored = []
    for c, key in candidates:
        t, m = tau(c), ms(key)
        if t is None or m is None or m <= 0:
            return None
        scored.append((t / m, c))
    return max(scored)[1] if scored else None
