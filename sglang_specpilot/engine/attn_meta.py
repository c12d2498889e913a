"""Per-step attention inputs: where the new tokens go, their positions, and who may see whom.

The contract (DESIGN.md, tree verification): request b has ``seq_len[b]`` tokens in the cache, in slots
``0 .. seq_len[b]-1``. A step brings N new tokens; token i is written to slot ``seq_len[b] + i``, sits at
rope position ``seq_len[b] + depth[i]``, and sees every prefix slot plus the new tokens that
``anc[i, j]`` marks as its ancestors (itself included). A chain is ``anc = tril``, ``depth = arange``.
Everything here is tensor arithmetic on the device: no host sync, safe inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepMeta:
    positions: torch.Tensor  # [B, N] int64
    slots: torch.Tensor  # [B, N] int64
    mask: torch.Tensor | None  # [B, 1, N * G, kv_len] bool; None when the fused kernel masks itself


def causal_tree(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(anc, depth) of a chain of n tokens: anc [n, n] lower-triangular bool, depth [n] = 0..n-1."""
    anc = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return anc, torch.arange(n, device=device)


def build_step_meta(
    seq_len: torch.Tensor, anc: torch.Tensor, depth: torch.Tensor, kv_len: int, group: int, with_mask: bool = True
) -> StepMeta:
    """Build positions, slots and the boolean mask.

    Parameters
    ----------
    seq_len : [B] int64, tokens already in the cache per request
    anc : [N, N] or [B, N, N] bool, anc[i, j] = node j is an ancestor of node i or i itself
    depth : [N] or [B, N] int64, node depth (0 for the first new token)
    kv_len : number of cache slots attention reads (>= max(seq_len) + N)
    group : query heads per KV head; the mask repeats each token's row ``group`` times
    with_mask : build the dense mask (SDPA); the fused tree-attention kernel needs none
    """
    B = seq_len.shape[0]
    N = anc.shape[-1]
    dev = seq_len.device
    seq = seq_len[:, None]
    positions = seq + depth.expand(B, N)
    slots = seq + torch.arange(N, device=dev)
    if not with_mask:
        return StepMeta(positions, slots, None)
    rel = torch.arange(kv_len, device=dev)[None, :] - seq  # [B, S]: slot index relative to the new block
    in_new = (rel >= 0) & (rel < N)
    idx = rel.clamp(0, N - 1)[:, None, :].expand(B, N, kv_len)
    tree = anc.expand(B, N, N).gather(2, idx)  # [B, N, S]
    mask = (rel < 0)[:, None, :] | (in_new[:, None, :] & tree)
    mask = mask[:, :, None, :].expand(B, N, group, kv_len).reshape(B, 1, N * group, kv_len)
    return StepMeta(positions, slots, mask)


def window_mask(seq_len: torch.Tensor, visible: torch.Tensor, kv_len: int, group: int) -> torch.Tensor:
    """Dense mask for tokens that see the prefix plus chosen slots of a window after it.

    Used by draft-tree expansion, where a step's tokens attend to ancestors written by earlier steps
    (so ``anc`` over the step's own tokens is not enough).

    Parameters
    ----------
    seq_len : [B] int64, prefix length: every token sees slots ``0 .. seq_len - 1``
    visible : [B, N, W] bool, token i also sees slot ``seq_len + j`` where ``visible[b, i, j]``
    kv_len : cache slots attention reads (>= max(seq_len) + W)
    group : query heads per KV head

    Returns
    -------
    [B, 1, N * G, kv_len] bool
    """
    B, N, W = visible.shape
    rel = torch.arange(kv_len, device=seq_len.device)[None, :] - seq_len[:, None]  # [B, S]
    in_win = (rel >= 0) & (rel < W)
    idx = rel.clamp(0, W - 1)[:, None, :].expand(B, N, kv_len)
    mask = (rel < 0)[:, None, :] | (in_win[:, None, :] & visible.gather(2, idx))
    return mask[:, :, None, :].expand(B, N, group, kv_len).reshape(B, 1, N * group, kv_len)
