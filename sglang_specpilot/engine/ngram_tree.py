"""Prompt-lookup draft trees: several continuations of the sequence's tail, merged into one trie.

The chain drafter (ngram.py) keeps only the latest match of the longest n-gram. A tree can hold more:
for n from ``n_max`` down to 1, every earlier occurrence of the last n tokens (latest first) proposes the
``depth`` tokens that followed it; the first ``top_k`` distinct continuations are merged into a trie, in
that priority order (longer n-gram first, then more recent), and the first ``budget`` trie nodes in
insertion order form the tree. Insertion order puts a parent before its children, so truncating keeps the
tree prefix-closed.

Host-side Python per row (one device -> host copy of the rows): prompt lookup has no model to wait for,
and a trie is awkward as tensor ops. Rows with fewer nodes than ``budget`` pad with nodes marked invalid,
which acceptance never takes.
"""

from __future__ import annotations

import torch

from tree_verify import DraftTree


def _continuations(seq: list[int], n_max: int, depth: int, top_k: int) -> list[list[int]]:
    L = len(seq)
    found: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(n_max, L - 1), 0, -1):
        tail = seq[L - n :]
        for p in range(L - n - 1, -1, -1):
            if seq[p : p + n] == tail:
                cont = seq[p + n : p + n + depth]
                if tuple(cont) not in seen:
                    seen.add(tuple(cont))
                    found.append(cont)
                    if len(found) == top_k:
                        return found
    return found


def _trie(conts: list[list[int]], budget: int) -> tuple[list[int], list[int], list[int]]:
    tokens, parents, depths = [], [], []
    child: dict[tuple[int, int], int] = {}
    for cont in conts:
        node = -1
        for d, t in enumerate(cont):
            key = (node, t)
            if key not in child:
                if len(tokens) == budget:
                    return tokens, parents, depths
                child[key] = len(tokens)
                tokens.append(t)
                parents.append(node)
                depths.append(d + 1)
            node = child[key]
    return tokens, parents, depths


def ngram_tree(
    history: torch.Tensor,
    seq_len: torch.Tensor,
    next_tok: torch.Tensor,
    n_max: int,
    depth: int,
    top_k: int,
    budget: int,
) -> tuple[DraftTree, torch.Tensor]:
    """Prompt-lookup trees for B rows.

    The row's sequence is ``history[b, :seq_len[b]]`` then ``next_tok[b]``; ``history`` is updated in
    place at ``seq_len`` with ``next_tok``. Returns a DraftTree with [B, budget] fields (scores rank the
    nodes by insertion order, 0 = best) and ``valid`` [B, budget] bool (False = padding node, token 0).
    """
    B = history.shape[0]
    dev = history.device
    history.scatter_(1, seq_len[:, None], next_tok[:, None])
    lens = (seq_len + 1).tolist()
    rows = history[:, : max(lens)].tolist()
    tok = torch.zeros(B, budget, dtype=torch.long)
    par = torch.full((B, budget), -1, dtype=torch.long)
    dep = torch.ones(B, budget, dtype=torch.long)
    valid = torch.zeros(B, budget, dtype=torch.bool)
    for b in range(B):
        t, p, d = _trie(_continuations(rows[b][: lens[b]], n_max, depth, top_k), budget)
        m = len(t)
        if m:
            tok[b, :m], par[b, :m], dep[b, :m] = torch.tensor(t), torch.tensor(p), torch.tensor(d)
            valid[b, :m] = True
    scores = -torch.arange(budget, dtype=torch.float32).expand(B, budget).clone()
    tree = DraftTree(tok.to(dev), par.to(dev), dep.to(dev), scores.to(dev))
    return tree, valid.to(dev)
