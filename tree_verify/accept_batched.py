"""Batched lossless tree sampling for drafters that choose children deterministically (best-first trees).

The rule is ``accept_sampling(mode="deterministic")`` (see accept.py) run for B trees at once with tensor
ops: at the current node, try its children in index order; child x is accepted with probability p(x)
(the draft proposal is a point mass on x, so min(1, p / q) = p(x)); on rejection p <- norm(p with x
zeroed). When no child is accepted, the final token is drawn from the remaining p. Each accepted step
restarts from the target's distribution at the accepted node. The emitted tokens then follow the target
distribution exactly, whatever tokens the drafter chose.

Padding nodes (token < 0) are never accepted and leave p unchanged, so rows may carry trees with fewer
real nodes than the batch's budget.
"""

from __future__ import annotations

import torch

from tree_verify.accept import GreedyAccept


def children_table(parents: torch.Tensor, max_children: int | None = None) -> torch.Tensor:
    """Children of every block entry in node order: [B, N + 1, K] block indices, padded with -1.

    K is ``max_children`` when the caller knows a bound (a best-first tree of top-k expansions has at
    most top_k children per node), else the largest number of siblings in the batch (one host sync).
    """
    B, N = parents.shape
    dev = parents.device
    up = parents + 1  # block index of each node's parent
    earlier = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
    rank = ((up[:, :, None] == up[:, None, :]) & earlier).sum(-1)  # siblings before each node
    K = max_children if max_children is not None else (int(rank.max()) + 1 if N else 1)
    table = torch.full((B, (N + 1) * K), -1, dtype=torch.long, device=dev)
    node_block = torch.arange(1, N + 1, device=dev).expand(B, N)
    table.scatter_(1, up * K + rank, node_block)
    return table.view(B, N + 1, K)


def accept_sampling_batched(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    max_children: int | None = None,
    max_depth: int | None = None,
) -> GreedyAccept:
    """Recursive rejection sampling down B deterministic-draft trees.

    With ``max_children`` (a bound on any node's children) and ``max_depth`` (on any node's depth)
    given, the walk has a fixed number of steps and reads nothing back to the host (capturable).

    Parameters
    ----------
    parents : [B, N] int64, parent node index (-1 = root), topological
    tokens : [B, N] int64, node tokens; < 0 marks a padding node
    target_probs : [B, N + 1, V] float, the target's (filtered) next-token distribution after each block entry
    generator : for the uniforms and the final draw (on the probs' device)
    max_children, max_depth : static bounds of the tree (see above); None = find them (host syncs)

    Returns
    -------
    GreedyAccept; ``bonus`` is the final token drawn from the target (or its residual) at ``last``.
    """
    B, N = tokens.shape
    dev = tokens.device
    rows = torch.arange(B, device=dev)
    table = children_table(parents, max_children)
    K = table.shape[-1]
    # float64: each rejection subtracts and renormalizes; float32 drifts after many siblings.
    p = target_probs[:, 0].double()
    u = torch.zeros(B, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    path_mask = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)
    path_mask[:, 0] = True
    for _ in range(N if max_depth is None else min(N, max_depth)):
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        for r in range(K):
            c = table[rows, u, r]
            x = tokens.gather(1, (c - 1).clamp(min=0)[:, None])[:, 0]
            live = (c > 0) & (x >= 0) & ~done & ~moved
            xs = x.clamp(min=0)
            px = p.gather(1, xs[:, None])[:, 0]
            draw = torch.rand(B, generator=generator, device=dev, dtype=torch.float64)
            acc = live & (draw < px)
            rej = live & ~acc
            zeroed = p.scatter(1, xs[:, None], 0.0)
            mass = zeroed.sum(-1, keepdim=True)
            # mass == 0 means x held all of p, so rejecting it had probability 0; keep p finite anyway.
            zeroed = torch.where(mass > 0, zeroed / mass.clamp_min(1e-300), p)
            p = torch.where(rej[:, None], zeroed, p)
            u = torch.where(acc, c, u)
            moved |= acc
        p = torch.where(moved[:, None], target_probs[rows, u].double(), p)
        path_mask[rows, u] |= moved
        done |= ~moved
        if max_depth is None and bool(done.all()):
            break
    e = torch.empty_like(p).exponential_(1, generator=generator)
    bonus = (p / e).argmax(-1)
    idx = torch.arange(N + 1, device=dev)
    path = torch.sort(torch.where(path_mask, idx, N + 1), dim=-1).values
    path = torch.where(path > N, -1, path)
    return GreedyAccept(last=u, accept_length=path_mask.sum(-1) - 1, path_mask=path_mask, path=path, bonus=bonus)
