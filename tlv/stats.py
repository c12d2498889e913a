"""Per-round statistics of a TLV round: how much of the Q chain the exact pass accepted.

``tlv_q_chain_agreement`` (issue 16) is the fraction of Q-chain tokens the exact pass accepts: a path
that starts down the trunk accepts its leading nodes 1 .. j (block indices 1 .. L); one that leaves
through the root tree accepts none of them.
"""

from __future__ import annotations

import torch


def trunk_accepted(path: torch.Tensor, chain_len: int) -> torch.Tensor:
    """-> [B] trunk nodes on the accepted path. path : [B, A] block indices from the root (0), padded
    with -1 or by repeating the last one (repeats are counted once)."""
    first = torch.ones_like(path[:, :1], dtype=torch.bool)
    fresh = torch.cat([first, path[:, 1:] != path[:, :-1]], 1)
    on_trunk = (path >= 1) & (path <= chain_len) & fresh
    return on_trunk.sum(-1)


def trunk_accepted_reference(path, chain_len):
    out = []
    for row in path.tolist():
        seen, k = set(), 0
        for p in row:
            if 1 <= p <= chain_len and p not in seen:
                k += 1
            seen.add(p)
        out.append(k)
    return torch.tensor(out)
