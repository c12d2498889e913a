"""A batch of DraftTrees as SGLang's verify tensors (the format ``EagleVerifyInput`` takes).

SGLang numbers a request's verify block like ``tree_verify`` does: entry 0 is the last verified token (the
root), entries 1..N-1 are the draft nodes, parents before children. For request b of a batch with
``seq_lens`` (tokens already in the KV cache, the root not among them):

    draft_token           [B * N]    int64  block tokens, request after request
    positions             [B * N]    int64  seq_lens[b] + depth (root depth 0)
    retrive_index         [B, N]     int64  b * N + i: the entry's row in the flat tensors
    retrive_next_token    [B, N]     int64  the entry's first child (smallest index), -1 for a leaf
    retrive_next_sibling  [B, N]     int64  the next sibling (next larger index, same parent), -1 if last
    custom_mask           [sum_b N * (seq_lens[b] + N)] bool  request b's N rows of seq_lens[b] + N
                                            columns, flattened and concatenated: the prefix columns are
                                            all True, the block columns are ancestor-or-self

These are exactly what ``sgl_kernel.build_tree_kernel_efficient`` writes in FULL_MASK mode: it links each
parent's children smallest index first, which is the order SGLang's greedy and sampling verification try
them in, so for a best-first tree the better-scored sibling is tried first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tree_verify import DraftTree, ancestor_mask


@dataclass
class SGLangTree:
    """SGLang's tree tensors for one verify step (shapes in the module docstring; N = num_verify_tokens)."""

    draft_token: torch.Tensor
    custom_mask: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    num_verify_tokens: int


def _first_later(match: torch.Tensor) -> torch.Tensor:
    """For a [B, N, N] bool ``match[b, u, v]``: the smallest v with match, else -1; [B, N] int64."""
    N = match.shape[-1]
    idx = torch.arange(N, device=match.device)
    # Non-matches get index N, so min picks the smallest matching v; N itself means none.
    first = torch.where(match, idx, N).min(dim=-1).values
    return torch.where(first == N, -1, first)


def sglang_tree_tensors(
    tree: DraftTree, verified_id: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor | None = None
) -> SGLangTree:
    """SGLang's verify tensors for a batch of trees.

    Parameters
    ----------
    tree : DraftTree with [B, N - 1] fields (N - 1 draft nodes per request, ``tree_verify`` conventions)
    verified_id : [B] int64, the last verified token of each request (the root)
    seq_lens : [B] int64, tokens in each request's KV cache (on the tree's device)
    seq_lens_cpu : the same on the host (SGLang keeps one); without it ``seq_lens`` is copied to the host,
        because the mask is ragged (one row length per request)

    Returns
    -------
    SGLangTree with N = nodes + 1 (the root counts, as in ``speculative_num_draft_tokens``).
    """
    if tree.tokens.dim() != 2:
        raise ValueError(f"expected a batched tree [B, N - 1], got tokens {tuple(tree.tokens.shape)}")
    B, n_nodes = tree.tokens.shape
    N = n_nodes + 1
    dev = tree.tokens.device
    block_parent = torch.cat([torch.full((B, 1), -1, device=dev, dtype=torch.long), tree.parents + 1], dim=1)
    idx = torch.arange(N, device=dev)

    is_child = block_parent[:, None, :] == idx[None, :, None]  # [B, u, v]: v's parent is u
    # Siblings: same parent, later index; the root (parent -1) has no siblings.
    same_parent = (block_parent[:, None, :] == block_parent[:, :, None]) & (idx[None, None, :] > idx[None, :, None])
    same_parent &= (block_parent >= 0)[:, :, None]

    anc = ancestor_mask(tree.parents)  # [B, N, N], the block part of the mask
    lens = [int(s) for s in (seq_lens if seq_lens_cpu is None else seq_lens_cpu).tolist()]
    rows = [
        torch.cat([torch.ones(N, s, dtype=torch.bool, device=dev), anc[b]], dim=1).flatten() for b, s in enumerate(lens)
    ]
    seq = torch.as_tensor(seq_lens, dtype=torch.long, device=dev)
    depth = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), tree.depths], dim=1)
    return SGLangTree(
        draft_token=tree.block_tokens(verified_id).flatten(),
        custom_mask=torch.cat(rows),
        positions=(seq[:, None] + depth).flatten(),
        retrive_index=(torch.arange(B, device=dev)[:, None] * N + idx).contiguous(),
        retrive_next_token=_first_later(is_child),
        retrive_next_sibling=_first_later(same_parent),
        num_verify_tokens=N,
    )
