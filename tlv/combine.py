"""The combined tree of the exact pass: the Q chain as a trunk, the drafter's tree from its end, and an
optional tree from the root.

Node order (topological, what ``tree_verify.ancestor_mask`` and acceptance need): trunk c_1 .. c_L at
0 .. L - 1 (parents -1, 0, .., L - 2); the hanging tree at L .. L + N_h - 1 (its root-children hang from
c_L, node L - 1); the root tree at L + N_h .. (its root-children stay -1). Greedy acceptance takes the
deepest node whose whole path matches, so when the root tree repeats c_1 both copies are walked and the
longer path wins. Under sampling a repeated token was zeroed out of
the residual when its first copy was rejected, so it is never accepted twice: the rule stays exact.
"""

from __future__ import annotations

import torch


def combine_tree(
    chain: torch.Tensor,
    hang_tokens: torch.Tensor,
    hang_parents: torch.Tensor,
    root_tokens: torch.Tensor | None = None,
    root_parents: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (tokens [B, N], parents [B, N]) with N = L + N_h (+ N_r); parents index nodes, -1 = root.

    chain : [B, L] the Q chain; hang_* : [B, N_h] a tree drafted from c_L (parents -1 = c_L);
    root_* : [B, N_r] a tree drafted from the root, or None.
    """
    B, L = chain.shape
    ar = torch.arange(L, device=chain.device)
    trunk = (ar - 1).expand(B, L)
    # The hanging tree's nodes shift by L; its root-children (-1 + L) land on c_L, node L - 1.
    parts_t, parts_p = [chain, hang_tokens], [trunk, hang_parents + L]
    if root_tokens is not None:
        off = L + hang_tokens.shape[1]
        parts_t.append(root_tokens)
        parts_p.append(torch.where(root_parents < 0, root_parents, root_parents + off))
    return torch.cat(parts_t, 1), torch.cat(parts_p, 1)


def combine_tree_reference(chain, hang_tokens, hang_parents, root_tokens=None, root_parents=None):
    """Plain loops over rows and nodes (for the tests)."""
    toks, pars = [], []
    for b in range(len(chain)):
        t, p = [], []
        for i, c in enumerate(chain[b].tolist()):
            t.append(c)
            p.append(i - 1)
        L = len(t)
        for c, q in zip(hang_tokens[b].tolist(), hang_parents[b].tolist(), strict=True):
            t.append(c)
            p.append(L - 1 if q < 0 else q + L)
        if root_tokens is not None:
            off = len(t)
            for c, q in zip(root_tokens[b].tolist(), root_parents[b].tolist(), strict=True):
                t.append(c)
                p.append(-1 if q < 0 else q + off)
        toks.append(t)
        pars.append(p)
    return torch.tensor(toks, dtype=torch.long), torch.tensor(pars, dtype=torch.long)
