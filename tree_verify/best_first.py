"""Best-first draft trees: the N candidates with the highest path score, and their masks and positions.

A path's score is the sum of the draft log-probs along it (the log of the product of edge probabilities),
each edge scored given its parent. Two builders:

- ``best_first(lattice, N)`` (EAGLE-2 style): the drafter's lattice is parent-aware, every candidate's score
  is known, and the tree is the top N of all candidates. Batched over requests, pure tensor ops.
- ``best_first_per_depth(tokens, logprobs, N)`` (DDTree style): the drafter gives top-k candidates per depth
  independently of the path (log q_d), so a node is a rank tuple (r_1, ..., r_d) with score
  ``sum_d log q_d[r_d]``. Best-first search with a heap: pop the best, push its next sibling
  (r_1, ..., r_d + 1) and its first child (r_1, ..., r_d, 0); both score no higher than the popped node,
  so nodes come out in score order and every parent comes out before its children. One request, host side.

The verify block is ``[root, node_0, ..., node_{N-1}]``: the root is the last committed token (depth 0,
block index 0), node i sits at block index i + 1. ``DraftTree.parents`` index nodes (-1 = root);
``DraftTree.depths`` are 1-based (the root's children have depth 1).

Ties: edges with probability 1 (log-prob 0) give a child the score of its parent. Both builders break ties
by (depth, candidate order), so a parent always precedes its children and the result is deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from tree_verify.lattice import Lattice


@dataclass
class DraftTree:
    """A prefix-closed, topologically ordered draft tree (nodes in non-increasing score order).

    Attributes
    ----------
    tokens : [N] or [B, N] int64, the node tokens
    parents : [N] or [B, N] int64, parent node index (< own index), -1 for children of the root
    depths : [N] or [B, N] int64, 1-based depth (root = 0, not stored)
    scores : [N] or [B, N] float, path score (sum of draft log-probs from the root)
    candidates : optional [N] or [B, N] int64, the lattice candidate id of each node (set by ``best_first``;
        a drafter uses it to find the draft KV it wrote for the accepted nodes)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    candidates: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[-1]

    def block_tokens(self, root_token: torch.Tensor | int) -> torch.Tensor:
        """Verify block tokens ``[root, nodes...]``: [N + 1] or [B, N + 1] int64; root_token is int or [B]."""
        root = torch.as_tensor(root_token, dtype=self.tokens.dtype, device=self.tokens.device)
        root = root.expand(self.tokens.shape[:-1])[..., None]
        return torch.cat([root, self.tokens], dim=-1)


def chain(tokens: torch.Tensor, logprobs: torch.Tensor | None = None) -> DraftTree:
    """A chain (one child per node) as a DraftTree: stock speculative decoding.

    Parameters
    ----------
    tokens : [N] or [B, N] int64, the drafted tokens in order
    logprobs : optional, same shape, the draft log-prob of each token; scores are their running sums
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    N = tokens.shape[-1]
    ar = torch.arange(N, device=tokens.device)
    parents = (ar - 1).expand(tokens.shape).clone()
    depths = (ar + 1).expand(tokens.shape).clone()
    lp = torch.zeros(tokens.shape) if logprobs is None else torch.as_tensor(logprobs)
    return DraftTree(tokens, parents, depths, lp.cumsum(-1))


def best_first(lattice: Lattice, num_nodes: int) -> DraftTree:
    """The ``num_nodes`` lattice candidates with the highest path score, as a DraftTree.

    Nodes come out in descending score, ties broken by smaller depth, then smaller candidate id; since a
    child's score never exceeds its parent's (log-probs <= 0), every parent precedes its children, the
    tree is prefix-closed, and its first n nodes are the best n-node tree. No host sync.

    Parameters
    ----------
    lattice : Lattice with E expansions of k children ([E, k] or batched [B, E, k])
    num_nodes : N, the tree budget; at most E * k (every candidate)

    Returns
    -------
    DraftTree with [N] or [B, N] fields; parents index the tree's own nodes (-1 = root).
    """
    C = lattice.num_expansions * lattice.topk
    if not 1 <= num_nodes <= C:
        raise ValueError(f"num_nodes must be in 1..{C} (the lattice's candidates), got {num_nodes}")
    scores, depths = lattice.candidate_scores()
    cand_parent = lattice.candidate_parents()
    tokens = lattice.tokens.flatten(-2)
    if not lattice.batched:
        scores, depths, cand_parent, tokens = scores[None], depths[None], cand_parent[None], tokens[None]
    B = scores.shape[0]
    dev = scores.device
    ids = torch.arange(C, device=dev)
    # Two stable sorts make a lexicographic key: first by (depth, id), then by score descending; equal
    # scores keep the (depth, id) order, so a parent tied with its child still comes first.
    order = torch.sort(depths * C + ids, dim=-1, stable=True).indices
    by_score = torch.sort(scores.gather(1, order), dim=-1, descending=True, stable=True).indices
    sel = order.gather(1, by_score)[:, :num_nodes]  # [B, N] candidate ids, topological

    # Candidate id -> tree node index; slot C stands for the root (-1).
    node_of = torch.full((B, C + 1), -1, dtype=torch.long, device=dev)
    node_of.scatter_(1, sel, torch.arange(num_nodes, device=dev).expand(B, num_nodes))
    par_cand = cand_parent.gather(1, sel)
    par_cand = torch.where(par_cand < 0, C, par_cand)
    tree = DraftTree(
        tokens=tokens.gather(1, sel),
        parents=node_of.gather(1, par_cand),
        depths=depths.gather(1, sel),
        scores=scores.gather(1, sel),
        candidates=sel,
    )
    if not lattice.batched:
        tree = DraftTree(tree.tokens[0], tree.parents[0], tree.depths[0], tree.scores[0], sel[0])
    return tree


def best_first_per_depth(tokens: torch.Tensor, logprobs: torch.Tensor, num_nodes: int) -> DraftTree:
    """DDTree-style best-first tree from per-depth candidates that do not depend on the path.

    The node with ranks (r_1, ..., r_d) has token ``tokens[d-1, r_d]`` and score
    ``sum_i logprobs[i-1, r_i]``. Runs on the host (a heap of at most 2N entries).

    Parameters
    ----------
    tokens : [D, k] int64, candidate tokens per depth (distinct within a depth)
    logprobs : [D, k] float <= 0, their draft log-probs log q_d; need not be sorted
    num_nodes : N, the tree budget; at most sum_{d=1..D} k^d

    Returns
    -------
    DraftTree with [N] fields, nodes in non-increasing score order (parents first).
    """
    D, k = tokens.shape
    if logprobs.shape != tokens.shape:
        raise ValueError(f"tokens {tuple(tokens.shape)} and logprobs {tuple(logprobs.shape)} differ")
    if bool((torch.isnan(logprobs) | (logprobs > 0)).any()):
        raise ValueError("logprobs must be <= 0 and not NaN")
    total = sum(k**d for d in range(1, D + 1))
    if not 1 <= num_nodes <= total:
        raise ValueError(f"num_nodes must be in 1..{total}, got {num_nodes}")
    # Sorting each depth descending (stable, so ties keep the given order) is what makes "next sibling"
    # and "first child" the only successors that can be next best.
    lp_sorted, rank_order = torch.sort(logprobs.double(), dim=-1, descending=True, stable=True)
    tok_sorted = tokens.gather(1, rank_order)
    lp = lp_sorted.tolist()

    # Heap entries: (-score, depth, ranks, parent node index); ranks break ties deterministically.
    heap = [(-lp[0][0], 1, (0,), -1)]
    out_ranks, out_parents, out_scores = [], [], []
    while len(out_ranks) < num_nodes:
        neg, depth, ranks, parent = heapq.heappop(heap)
        me = len(out_ranks)
        out_ranks.append(ranks)
        out_parents.append(parent)
        out_scores.append(-neg)
        # Scores are parent score + edge, never a difference, so equal paths get bit-equal scores.
        if ranks[-1] + 1 < k:
            r = ranks[-1] + 1
            base = out_scores[parent] if parent >= 0 else 0.0
            heapq.heappush(heap, (-(base + lp[depth - 1][r]), depth, ranks[:-1] + (r,), parent))
        if depth < D:
            heapq.heappush(heap, (-(-neg + lp[depth][0]), depth + 1, ranks + (0,), me))
    depths = torch.tensor([len(r) for r in out_ranks], dtype=torch.long)
    toks = torch.stack([tok_sorted[len(r) - 1, r[-1]] for r in out_ranks])
    return DraftTree(
        tokens=toks.to(torch.long),
        parents=torch.tensor(out_parents, dtype=torch.long),
        depths=depths,
        scores=torch.tensor(out_scores, dtype=logprobs.dtype),
    )


def ancestor_mask(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """Ancestor-or-self mask of the verify block ``[root, nodes...]``, root at index 0.

    ``anc[i, j]`` is True when block entry j is block entry i or one of its ancestors; node n is block
    entry n + 1. Pointer chasing over N steps of tensor ops: no host sync, works batched.

    Parameters
    ----------
    parents : [N] or [B, N] int64, parent node index, -1 for the root's children
    max_depth : optional bound on any node's depth (a tree of depth D needs D + 1 steps, not N + 1)

    Returns
    -------
    anc : [N + 1, N + 1] or [B, N + 1, N + 1] bool
    """
    N = parents.shape[-1]
    root = torch.zeros(parents.shape[:-1] + (1,), dtype=torch.long, device=parents.device)
    up = torch.cat([root, parents + 1], dim=-1)  # block index of each entry's parent; the root maps to itself
    ptr = torch.arange(N + 1, device=parents.device).expand(up.shape).clone()
    anc = torch.zeros(up.shape + (N + 1,), dtype=torch.bool, device=parents.device)
    # A path has at most N edges (at most max_depth), so N + 1 marks (self, parent, ..., root) cover
    # every ancestor.
    for _ in range(N + 1 if max_depth is None else min(N, max_depth) + 1):
        anc.scatter_(-1, ptr[..., None], True)
        ptr = up.gather(-1, ptr)
    return anc


def positions(tree: DraftTree, prefix_len: torch.Tensor | int) -> torch.Tensor:
    """Rope positions of the verify block ``[root, nodes...]``: ``prefix_len + depth``.

    Parameters
    ----------
    tree : DraftTree with [N] or [B, N] fields
    prefix_len : int or [B] int64, tokens already in the KV cache (the root is not; it goes at prefix_len)

    Returns
    -------
    [N + 1] or [B, N + 1] int64
    """
    zero = torch.zeros(tree.depths.shape[:-1] + (1,), dtype=torch.long, device=tree.depths.device)
    depth = torch.cat([zero, tree.depths], dim=-1)
    pre = torch.as_tensor(prefix_len, dtype=torch.long, device=depth.device)
    return depth + (pre[..., None] if pre.dim() > 0 else pre)
