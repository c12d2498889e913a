"""One best-first tree round: draft a tree, verify it in one target pass, accept a path, commit its K/V.

    draft    lattice of candidates (draft model: ``draft_tree.expand_lattice``; prompt lookup:
             ``ngram_tree``) -> best-first tree of ``budget`` nodes per row (``tree_verify.best_first``)
    verify   [next_tok, nodes] at slots seq_len .. seq_len + N, positions seq_len + depth, each node
             seeing the prefix and its ancestors only -> N + 1 target rows
    accept   greedy: longest path matching the target's argmax + bonus; sampling: recursive rejection
             among siblings with residual resampling (``tree_verify.accept_sampling_batched``)
    commit   the accepted path's target K/V packed after the prefix (``KVCache.commit``), its tokens
             written to ``history``; the draft's K/V of the accepted nodes moved likewise

Rows are padded, not packed: every row carries a tree of ``budget`` nodes (prompt-lookup rows with
fewer real nodes pad with nodes that can never be accepted). Output layout matches the chain round:
``tokens [B, depth + 1]`` = accepted nodes then the bonus at index n, and ``n [B]``.
"""

from __future__ import annotations

import torch

from tree_verify import accept_greedy_batched, accept_sampling_batched, ancestor_mask, best_first

from .draft_tree import commit_draft, expand_lattice
from .ngram_tree import ngram_tree
from .runner import ModelRunner
from .sampling import BatchSampling, probs_from_logits


class TreeRounds:
    def __init__(self, target: ModelRunner, draft: ModelRunner | None, ngram: int, depth: int, top_k: int, budget: int):
        if draft is None and not ngram:
            raise ValueError("tree rounds need a drafter: a draft model or prompt lookup (ngram_size > 0)")
        self.target, self.draft, self.ngram = target, draft, ngram
        self.depth, self.top_k, self.budget = depth, top_k, budget

    def draft_tree(self, history, seq_len, next_tok, max_len):
        """(tree with [B, N] fields, tokens for acceptance [B, N] (-1 = padding), draft bookkeeping)."""
        if self.draft is None:
            tree, valid = ngram_tree(history, seq_len, next_tok, self.ngram, self.depth, self.top_k, self.budget)
            return tree, torch.where(valid, tree.tokens, -1), None
        lattice, expanded_by = expand_lattice(self.draft, history, seq_len, next_tok, self.depth, self.top_k, max_len)
        tree = best_first(lattice, self.budget)
        return tree, tree.tokens, expanded_by

    def verify(self, history, seq_len, next_tok, tree, accept_tokens, expanded_by, bs: BatchSampling, max_len):
        """Target pass, acceptance and commits; returns (tokens [B, depth + 1], n [B])."""
        B = seq_len.shape[0]
        block = tree.block_tokens(next_tok)  # [B, N + 1]
        anc = ancestor_mask(tree.parents)
        depth = torch.cat([torch.zeros_like(tree.depths[:, :1]), tree.depths], 1)
        logits = self.target.step(block, seq_len, anc, depth, max_len_hint=max_len)
        if bs.all_greedy:
            res = accept_greedy_batched(tree.parents, accept_tokens, logits.argmax(-1))
        else:
            res = accept_sampling_batched(tree.parents, accept_tokens, probs_from_logits(logits, bs), bs.generator)
        n = res.accept_length
        # Path of depth + 1 entries, padded by repeating the last accepted one (lands past the new end).
        path = torch.where(res.path < 0, res.last[:, None], res.path)[:, : self.depth + 1]
        if path.shape[1] < self.depth + 1:
            path = torch.cat([path, path[:, -1:].expand(B, self.depth + 1 - path.shape[1])], 1)
        self.target.kv.commit(seq_len, path)
        if self.draft is not None:
            commit_draft(self.draft, seq_len, tree.candidates, expanded_by, path)
        accepted = block.gather(1, path)  # [B, depth + 1]: root, a_1 .. a_n, repeats
        history.scatter_(1, seq_len[:, None] + torch.arange(self.depth + 1, device=seq_len.device), accepted)
        out = torch.cat([accepted[:, 1:], res.bonus[:, None]], 1)
        out.scatter_(1, n[:, None], res.bonus[:, None])
        return out, n

    def round(self, history, seq_len, next_tok, bs: BatchSampling, max_len):
        tree, accept_tokens, expanded_by = self.draft_tree(history, seq_len, next_tok, max_len)
        return self.verify(history, seq_len, next_tok, tree, accept_tokens, expanded_by, bs, max_len)
