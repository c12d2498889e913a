"""Per-row estimates of tokens per round by round shape, and the shape with the most tokens per millisecond:
what adaptive depth (``adaptive_depth.DepthEstimates``) and adaptive width (``adaptive_width.WidthEstimates``)
choose by. Each keeps, per row and shape, an EMA (``acceptance.ALPHA``) of what a round of that shape would
have emitted, known from the rounds that ran (their counterfactuals differ: see the two modules)."""

from __future__ import annotations

from .acceptance import ALPHA

# The share of a batch's rows that must have an estimate for the batch to decide by them. Requiring every
# row (as before) let one row admitted a round ago block every choice: on the H100 (lifted 8B, 64 clients x
# 4 requests, 4910b6f, batched_4910b6f_h100.json) a new row came every ~2 rounds, adaptive depth fell back to its rule
# in 304 of 304 rounds, the chain-or-tree choice was unmeasured in 284 of 304, and the batch ran its narrowed
# tree (12.5 ms at warm-up, 14.3 ms in the run) where stock's 10.7 ms chain served 1.16x its tokens per
# second. Half: a batch of mostly new rows (a lone new row, say) still speculates, which measures them; in a
# batch of two, the measured row decides.
KNOWN_SHARE = 0.5


def known_mean(vals: list) -> float | None:
    """The mean of ``vals``' known entries (not None) where at least ``KNOWN_SHARE`` of them are known."""
    known = [v for v in vals if v is not None]
    if not known or len(known) < KNOWN_SHARE * len(vals):
        return None
    return sum(known) / len(known)


class RowEstimates:
    """Per row, an EMA of tokens per round for each shape key."""

    def __init__(self, rows: int, alpha: float = ALPHA):
        self.alpha = alpha
        self.est: list[dict] = [{} for _ in range(rows)]

    def update(self, row: int, key, tokens: float) -> None:
        old = self.est[row].get(key)
        self.est[row][key] = float(tokens) if old is None else old + self.alpha * (tokens - old)

    def mean(self, rows: list[int], key) -> float | None:
        """Mean estimate of ``key`` over the ``rows`` that have one (``known_mean``)."""
        return known_mean([self.est[r].get(key) for r in rows])

    def forget(self, row: int) -> None:
        self.est[row] = {}


# How much more estimated tokens per ms a choice must promise than the default (the configured tree: full depth,
# full width, no chain) to replace it, at one row; over n rows, this over sqrt(n). Why: each estimate is a
# per-row EMA at ``ALPHA`` 0.3, whose spread is sqrt(0.3 / 1.7) = 0.42 of one round's, and a round's tokens
# spread by about half their mean, so one row's estimates differ by ~20% on noise alone; the argmax of noisy
# near-ties then leaves the default on noise. On the H200 (lifted 8B, one client, 1ed178a, batched_n1_1ed178a_h200.json)
# the batch ran a chain of 3 in 89 of 376 rounds (5.6 ms; stock's chain of 3 emitted 2.10 tokens a round in
# the same run) where its tree rounds emitted about 3.1 (from the run's totals) in 6.65 ms, and the mechanisms
# served 1.86x AR where plain trees had served 2.01x (2bcb6d1). Not tuned: it follows from ALPHA and that
# spread. With it, one client on the H100 (2ab09a6, batched_742b745_h100.json's before_margin_n1) ran depth 6 in all
# 378 chosen rounds and the chain in 5; automatic off (which takes it too since b6b2e54) then served 2.04x AR.
SWITCH_MARGIN = 0.15


def switch_margin(rows: int) -> float:
    """The margin a non-default choice must clear over ``rows`` rows (``SWITCH_MARGIN`` / sqrt(rows))."""
    return SWITCH_MARGIN / max(rows, 1) ** 0.5


def most_per_ms(candidates: list[tuple[int, object]], tau, ms, margin: float = 0.0) -> int | None:
    """The choice of ``candidates`` [(choice, kind key)] with the highest ``tau(choice) / ms(key)``; None when
    any candidate lacks either (the caller keeps its default). ``candidates[0]`` is the default: another
    replaces it only where its tokens per ms exceed the default's by more than ``margin`` (a fraction)."""
    scored = []
    for c, key in candidates:
        t, m = tau(c), ms(key)
        if t is None or m is None or m <= 0:
            return None
        scored.append((t / m, c))
    if not scored:
        return None
    best = max(scored)
    return best[1] if best[0] > scored[0][0] * (1 + margin) else scored[0][1]
