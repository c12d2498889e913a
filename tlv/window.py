"""The target features an EAGLE-3 drafter reads when it drafts again from the end of the Q chain.

An EAGLE-3 drafter re-runs a window of tokens with the target's features one position earlier
(``engine.draft_tree._eagle_root``): the last round's accepted a_1 .. a_n and the root, whose features
the last exact pass computed (``feats[:, 0 .. n]``). Drafting from the chain's end extends the window by
c_1 .. c_L, whose features come from the Q pass (step i fed the token before c_{i+1}): approximate
features, which can only change what is drafted, never what is accepted. The window stays a fixed
D + 1 + L wide; entries past n + L are padding.
"""

from __future__ import annotations

import torch


def chain_window(feats: torch.Tensor, q_feats: torch.Tensor, n_prev: torch.Tensor) -> torch.Tensor:
    """-> [B, W + L, F]: entry t is feats[:, t] for t <= n_prev, else q_feats[:, t - n_prev - 1].

    feats : [B, W, F] exact features of the last round (W = D + 1); q_feats : [B, L, F] the Q pass's
    features, step i's at i; n_prev : [B] tokens the last round accepted (<= W - 1).
    """
    B, W, F = feats.shape
    L = q_feats.shape[1]
    t = torch.arange(W + L, device=feats.device)
    from_q = t[None] > n_prev[:, None]
    # Index into cat([feats, q_feats]): exact entries keep t, chain entries point past the W exact ones.
    idx = torch.where(from_q, W + (t[None] - n_prev[:, None] - 1).clamp(0, L - 1), t[None].clamp(max=W - 1))
    both = torch.cat([feats, q_feats.to(feats.dtype)], 1)
    return both.gather(1, idx[:, :, None].expand(B, W + L, F))


def chain_window_reference(feats, q_feats, n_prev):
    B, W, F = feats.shape
    L = q_feats.shape[1]
    out = torch.empty(B, W + L, F, dtype=feats.dtype)
    for b in range(B):
        n = int(n_prev[b])
        for t in range(W + L):
            out[b, t] = feats[b, min(t, W - 1)] if t <= n else q_feats[b, min(t - n - 1, L - 1)]
    return out
