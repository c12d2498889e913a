"""One verify-node budget shared by every row of a round (issue 18).

Each row's best-first tree (``tree_verify.best_first``) lists its nodes in descending path score, parents
first, so any prefix of that list is a valid (prefix-closed) tree. The shared budget takes the ``total``
best nodes over all rows' lists at once: sorted by score, ties to the earlier position in its row (then
the lower row), so a node is taken only after every node before it in its row, and each row's share is
a prefix: a tree. Nodes that are not taken stay in the verify block as padding (accept token -1: never
accepted), which keeps the block's static width ``tree_budget`` (one captured graph per bucket); rows not
in use take no nodes. A row's share is at most ``tree_budget`` (its list's length).

The verify cost does not fall with the padding inside one block; what the selection buys is the
ordering: where a batch's total is tight, the nodes most likely to be accepted are verified first, and
the acceptance of the others is given up knowingly. What turns the budget into time is the block's width:
at a batch bucket whose rows would exceed the budget, the engine runs a narrower round kind (N / 2, N / 4,
... nodes per row; ``round_kinds.width_for``), inside which this selection still applies.
"""

from __future__ import annotations

import torch


def shared_keep(scores: torch.Tensor, in_use: torch.Tensor, total: int) -> torch.Tensor:
    """scores [B, N] (each row non-increasing: best-first order), in_use [B] -> keep [B, N] bool with
    at most ``total`` True, each row's True a prefix. Tensor ops, no host sync."""
    B, N = scores.shape
    s = torch.where(in_use[:, None], scores, torch.full_like(scores, float("-inf"))).flatten()
    pos = torch.arange(N, device=scores.device).repeat(B)
    # Stable sorts: by position in the row first, then by score descending, so equal scores keep the
    # earlier position (a parent tied with its child is taken first).
    order = torch.sort(pos, stable=True).indices
    by_score = torch.sort(s[order], descending=True, stable=True).indices
    taken = order[by_score[: min(total, B * N)]]
    # index_fill_, not ``keep[taken] = True``: advanced-index assignment of a Python scalar builds the
    # value on the host and copies it over, which CUDA graph capture refuses (seen on the H200).
    keep = torch.zeros(B * N, dtype=torch.bool, device=scores.device).index_fill_(0, taken, True)
    return (keep & torch.isfinite(s)).view(B, N)
