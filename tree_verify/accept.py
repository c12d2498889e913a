"""Acceptance: which path of the draft tree the target keeps, and the token it adds after it.

Block indexing as in ``best_first``: the verify block is ``[root, nodes...]``, root at index 0, node n at
n + 1; the target's outputs have one row per block entry (row u = the target's next-token prediction after
block entry u). Returned paths are block indices from the root, ``[0, ...]``.

Greedy (``accept_greedy``): a node is accepted when its token equals the target's argmax at its parent and
its parent is accepted; the deepest accepted node ends the path (lowest index among equally deep ones,
which only matters if siblings repeat a token), and the bonus token is the argmax there.

Sampling (``accept_sampling``): recursive rejection sampling over the children of the current node, in
their index order, which must be the order they were drawn in. Three drafting variants, each with the
residual update that keeps it lossless (the emitted tokens follow the target distribution exactly):

- ``"with_replacement"`` (SpecInfer): children drawn i.i.d. from q. Accept child x with probability
  min(1, p(x) / q(x)); on rejection p <- norm(max(p - q, 0)), q unchanged.
- ``"without_replacement"``: child i drawn from q with children 1..i-1 removed and renormalized. Same test
  and residual against that q; after each rejection the rejected token is removed from q and q is
  renormalized. (A rejected x has p(x) <= q(x), so the residual also has no mass on x.)
- ``"deterministic"``: children chosen by the drafter without sampling (top-k, best-first trees). Then q
  is a point mass on each child: accept x with probability p(x); on rejection p <- norm(p with x zeroed).
  This is the only variant that is lossless for ``best_first`` trees; using the draft's q ratio there
  would not be, because the children were not drawn from q.

If every child is rejected, the final token is drawn from the residual p; at a leaf, from the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from tree_verify.best_first import DraftTree, ancestor_mask

DraftMode = Literal["with_replacement", "without_replacement", "deterministic"]


@dataclass
class GreedyAccept:
    """Batched greedy acceptance.

    Attributes
    ----------
    last : [B] int64, block index of the last accepted entry (0 = only the root)
    accept_length : [B] int64, accepted draft nodes (the depth of ``last``)
    path_mask : [B, N + 1] bool, the accepted path's block entries (root included)
    path : [B, N + 1] int64, the path's block indices from the root, padded with -1
    bonus : [B] int64, the target's argmax at ``last``
    """

    last: torch.Tensor
    accept_length: torch.Tensor
    path_mask: torch.Tensor
    path: torch.Tensor
    bonus: torch.Tensor


def accept_greedy_batched(
    parents: torch.Tensor, tokens: torch.Tensor, target_argmax: torch.Tensor, anc: torch.Tensor | None = None
) -> GreedyAccept:
    """Greedy acceptance for B trees at once; tensor ops only, no host sync.

    Parameters
    ----------
    parents : [B, N] int64, parent node index (-1 = root), topological
    tokens : [B, N] int64, node tokens
    target_argmax : [B, N + 1] int64, the target's argmax after each block entry
    anc : optional [B, N + 1, N + 1], ``ancestor_mask(parents)`` when the caller already built it

    Returns
    -------
    GreedyAccept
    """
    B, N = tokens.shape
    dev = tokens.device
    if anc is None:
        anc = ancestor_mask(parents)  # [B, N + 1, N + 1]
    # The token a node would need: the target's argmax at its parent's block entry.
    wanted = target_argmax.gather(1, parents + 1)
    match = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), tokens == wanted], dim=1)
    ok = ~(anc & ~match[:, None, :]).any(-1)  # every ancestor-or-self matches
    depth = anc.sum(-1) - 1
    idx = torch.arange(N + 1, device=dev)
    key = torch.where(ok, depth * (N + 1) + (N - idx), -1)
    last = key.argmax(-1)
    path_mask = anc[torch.arange(B, device=dev), last]
    # Topological order puts ancestors at smaller indices, so sorted indices run root -> leaf.
    path = torch.sort(torch.where(path_mask, idx, N + 1), dim=-1).values
    path = torch.where(path > N, -1, path)
    return GreedyAccept(
        last=last,
        accept_length=depth.gather(1, last[:, None])[:, 0],
        path_mask=path_mask,
        path=path,
        bonus=target_argmax.gather(1, last[:, None])[:, 0],
    )


def accept_greedy(tree: DraftTree, target_argmax: torch.Tensor) -> tuple[list[int], int]:
    """Greedy acceptance for one tree.

    Parameters
    ----------
    tree : DraftTree with [N] fields
    target_argmax : [N + 1] int64, the target's argmax after each block entry

    Returns
    -------
    path : block indices of the accepted entries from the root, ``[0, ...]``
    bonus : the target's argmax at the path's last entry
    """
    res = accept_greedy_batched(tree.parents[None], tree.tokens[None], target_argmax[None])
    n = int(res.accept_length[0]) + 1
    return res.path[0, :n].tolist(), int(res.bonus[0])


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = (p - q).clamp(min=0)
    s = r.sum()
    # s is the rejection probability, so s == 0 means this rejection cannot happen; keep p to stay finite.
    return r / s if s > 0 else p


def accept_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    mode: DraftMode = "deterministic",
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """Lossless multi-candidate speculative sampling (recursive rejection) down one tree.

    Host-side reference: loops in Python over the visited nodes and their children.

    Parameters
    ----------
    tree : DraftTree with [N] fields; siblings in the order they were drafted
    target_probs : [N + 1, V] float, the target's next-token distribution after each block entry
    draft_probs : [N + 1, V] float, the draft distribution q each entry's children were drawn from;
        unused (may be None) for ``mode="deterministic"``
    mode : how the children were drafted; see the module docstring
    generator : torch.Generator for the uniforms and the final draw

    Returns
    -------
    path : block indices of the accepted entries from the root, ``[0, ...]``
    token : the final token, drawn from the target (or its residual) at the path's last entry
    """
    if mode not in ("with_replacement", "without_replacement", "deterministic"):
        raise ValueError(f"unknown mode {mode!r}")
    if mode != "deterministic" and draft_probs is None:
        raise ValueError(f"mode {mode!r} needs draft_probs")
    N = tree.num_nodes
    if target_probs.shape[0] != N + 1:
        raise ValueError(f"target_probs needs N + 1 = {N + 1} rows, got {target_probs.shape[0]}")
    children: list[list[int]] = [[] for _ in range(N + 1)]
    for n, par in enumerate(tree.parents.tolist()):
        children[par + 1].append(n + 1)
    tokens = tree.tokens.tolist()
    V = target_probs.shape[-1]

    u, path = 0, [0]
    while True:
        # float64: the residuals subtract and renormalize repeatedly.
        p = target_probs[u].double()
        q = draft_probs[u].double() / draft_probs[u].double().sum() if mode != "deterministic" else None
        nxt = None
        kids = children[u]
        for i, c in enumerate(kids):
            x = tokens[c - 1]
            qc = torch.nn.functional.one_hot(torch.tensor(x), V).double() if q is None else q
            if qc[x] <= 0:
                raise ValueError(f"child token {x} at block entry {c} has zero draft probability")
            # Accept with probability min(1, p(x) / q(x)): u * q(x) < p(x) with u ~ U[0, 1).
            if torch.rand((), generator=generator, dtype=torch.float64) * qc[x] < p[x]:
                nxt = c
                break
            p = _residual(p, qc)
            if mode == "without_replacement" and i + 1 < len(kids):
                q = q.clone()
                q[x] = 0
                if q.sum() <= 0:
                    raise ValueError(f"draft support exhausted after block entry {c}: no sibling can follow")
                q = q / q.sum()
        if nxt is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(nxt)
        u = nxt
