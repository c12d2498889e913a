"""Adaptive verify width: per round, the tree width (verify nodes per row) with the most tokens per
millisecond at the batch's bucket, from exact counterfactuals of the narrower widths.

Why. The shared node budget fixes a bucket's width (``round_kinds.width_for``: 8 nodes a row at 16 rows
under the batched suite's 128), and at 16 clients that width only tied stock's chain: 2.87 tokens a row
in a 9.7 ms round against the chain's 2.17 in 7.5 ms (H100, lifted 8B, d6fbe2c, batched_d6fbe2c_h100.json). Which
width pays depends on the text and the batch, so it is measured, not set.

Counterfactuals. A best-first tree lists its nodes by path score, parents first, so the tree of w nodes is
the first w nodes of a wider one over the same lattice (a narrower kind drafts the same depths, and w
nodes reach at most depth w), and the ranks rise along any root path. A round that accepted nodes ranked
r_1 < r_2 < ... < r_n would therefore have accepted, at width w, exactly those ranked below w: its count
at w is 1 (the bonus) plus that many. One round at width W measures every width up to W exactly; a width
wider than the one a row last ran keeps its older estimate until a probe (every ``probe_every`` rounds the
widest width runs) refreshes it.

Choice. Among the widths whose kinds are captured at the bucket, the one with the highest mean estimated
tokens over the step curve's milliseconds for that kind and bucket (the rows are the same whichever width
runs), over the rows that have estimates. A width with too few rows estimated (``estimates.KNOWN_SHARE``)
is not chosen; the widest (the shared budget's) then runs.
"""

from __future__ import annotations

from .estimates import RowEstimates, most_per_ms


def counterfactual(ranks: list[int], n: int, width: int) -> int:
    """Tokens a round whose ``n`` accepted nodes sat at verify-block indices ``ranks`` (rank + 1, rising;
    entries past n ignored) would have emitted at ``width`` nodes: the bonus plus the nodes inside it."""
    return 1 + sum(1 for r in ranks[:n] if r <= width)


class WidthEstimates(RowEstimates):
    """Per row and (depth, width), an EMA of tokens per round (``acceptance.ALPHA``), from rounds at that
    depth and at least that width."""

    def observe(self, row: int, depth: int, widths: list[int], ranks: list[int], tokens: int) -> None:
        """A round at depth ``depth`` and width ``widths[0]`` emitted ``tokens``; ``widths`` lists it and
        the narrower widths to update."""
        for w in widths:
            self.update(row, (depth, w), counterfactual(ranks, tokens - 1, w))

    def tau(self, rows: list[int], depth: int, width: int) -> float | None:
        """Mean estimate over the ``rows`` that have one (``estimates.known_mean``)."""
        return self.mean(rows, (depth, width))


best_width = most_per_ms  # the width of [(width, kind key)] with the most estimated tokens per ms
