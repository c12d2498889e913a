"""Static KV cache: one [max_batch, max_seq, kv_heads, head_dim] tensor pair per layer.

All layers live in one [L, 2, max_batch, max_seq, kv_heads, head_dim] tensor, so moving a round's
accepted K/V (``commit``) is one gather and one scatter over every layer at once instead of four
indexing kernels per layer (120 of them per round on the 30-layer SmolLM2).
"""

from __future__ import annotations

import torch

from ..models.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, max_batch: int, max_seq: int, device, dtype):
        shape = (cfg.num_layers, 2, max_batch, max_seq, cfg.num_kv_heads, cfg.head_dim)
        self.max_batch, self.max_seq = max_batch, max_seq
        self.storage = torch.zeros(shape, device=device, dtype=dtype)
        self.layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(cfg.num_layers)]

    @torch.no_grad()
    def commit(self, seq_len: torch.Tensor, path: torch.Tensor) -> None:
        """Keep the accepted nodes of the last verified block, packed after the prefix.

        seq_len : [B] prefix length before the block; path : [B, A] node indices of the accepted path in
        order (a topological tree order guarantees path[t] >= t). Node path[t]'s K/V moves from slot
        ``seq_len + path[t]`` to ``seq_len + t``. Entries past the accepted length may hold anything:
        they lie beyond the new sequence end and are never read. For a chain (path[t] = t) nothing moves.
        """
        B, A = path.shape
        b = torch.arange(B, device=path.device)[:, None]
        src = seq_len[:, None] + path
        dst = seq_len[:, None] + torch.arange(A, device=path.device)
        kv = self.storage[:, :, :B]  # [L, 2, B, S, H, D]
        moved = kv[:, :, b, src]  # gather everything first: sources and targets can overlap
        kv[:, :, b, dst] = moved

    @torch.no_grad()
    def clear_row(self, row: int) -> None:
        """Zero one row's K/V in every layer (scratch slots included).

        A released row is reused as it is, which is safe only while its stale entries are finite: masked
        attention weighs them by 0, and 0 * NaN is NaN. A row whose model produced non-finite values is
        cleared before anyone else gets it.
        """
        self.storage[:, :, row].zero_()
