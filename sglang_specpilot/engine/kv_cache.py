"""Static KV cache: one [max_batch, max_seq, kv_heads, head_dim] tensor pair per layer.

All layers live in one [L, 2, max_batch, max_seq, kv_heads, head_dim] tensor, so moving a round's
accepted K/V (``commit``) is one launch over every layer at once (``kernels/kv_commit.py``; before it, one
gather and one scatter) instead of four indexing kernels per layer (120 of them per round on the 30-layer
SmolLM2).
"""

from __future__ import annotations

import torch

from ..kernels import launch
from ..kernels.kv_commit import kv_commit, kv_commit_ref
from ..models.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, max_batch: int, max_seq: int, device, dtype):
        shape = (cfg.num_layers, 2, max_batch, max_seq, cfg.num_kv_heads, cfg.head_dim)
        self.max_batch, self.max_seq = max_batch, max_seq
        self.storage = torch.zeros(shape, device=device, dtype=dtype)
        self.layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(cfg.num_layers)]

    @torch.no_grad()
    def commit(self, seq_len: torch.Tensor, path: torch.Tensor, n: torch.Tensor | None = None) -> None:
        """Keep the accepted nodes of the last verified block, packed after the prefix.

        seq_len : [B] prefix length before the block; path : [B, A] node indices of the accepted path in
        order (a topological tree order guarantees path[t] >= t). Node path[t]'s K/V moves from slot
        ``seq_len + path[t]`` to ``seq_len + t``. Entries past the accepted length may hold anything:
        they lie beyond the new sequence end and are never read. For a chain (path[t] = t) nothing moves.
        n : [B] accepted lengths (path entries 0 .. n are the root and the accepted nodes). Given, and where
        the round kernels run, ``kernels/kv_commit.py`` moves only those entries, and only where a node is
        not already in place; otherwise every entry moves (``kv_commit_ref``).
        """
        if n is not None and launch.ROUND_KERNELS:
            kv_commit(self.storage, seq_len, path, n)
        else:
            kv_commit_ref(self.storage, seq_len, path)

    @torch.no_grad()
    def clear_row(self, row: int) -> None:
        """Zero one row's K/V in every layer (scratch slots included).

        A released row is reused as it is, which is safe only while its stale entries are finite: masked
        attention weighs them by 0, and 0 * NaN is NaN. A row whose model produced non-finite values is
        cleared before anyone else gets it.
        """
        self.storage[:, :, row].zero_()
