"""Recurrent and convolution state of a hybrid model's GDN layers, one row per KV-cache row.

Like ``KVCache`` for attention, one object per model holds every GDN layer's state for every row:

    ssm  [L_gdn, R, H_v, d_k, d_v] float32   the delta-rule state after the row's last committed token
    conv [L_gdn, R, K - 1, C]                the last K - 1 convolution inputs along the row's sequence

and a forward is given a step object (``rec``, the protocol in ``models/gdn.py``):

    prefill  (``prefill``): a chunk of prompt tokens, ``valid[b]`` of them real; the state advances over
             exactly those (padding is the identity: g = 0, beta = 0) and is written at once. A row whose
             chunk starts at seq_len 0 starts from zero state (a new request in a reused row), a row parked
             in the scratch slots (seq_len >= max_seq) does not move.
    verify   (``verify``): a round's block (the AR token, a chain or a tree, given by its ancestor mask).
             Nothing committed changes; each node's output uses the state along its root path
             (``gdn_verify``) and the step keeps what ``commit`` needs.
    commit   (``commit(last, seq_len)``): every row keeps the state after block node ``last[b]`` (the last
             accepted node), like ``KVCache.commit`` keeps the accepted path's K/V; rows parked in the
             scratch slots keep theirs. The runner commits an AR step (one node) itself.

Convolution windows follow paths too. In the extended sequence X = [conv state (K - 1 entries), block
inputs (T)], block node i sits at K - 1 + i, its parent at K - 1 + parent(i) (the root's parent is the
last committed input, K - 2) and entry e < K - 1 at e - 1; node i's window is its K - 1 nearest
ancestors and itself, found by K - 1 pointer steps.
"""

from __future__ import annotations

import torch

from ..models.config import ModelConfig
from ..models.gdn import gdn_dims
from ..models.gdn_ops import causal_conv, chunked
from .gdn_verify import Tree, gdn_tree_wy, strategy


def _windows(parent: torch.Tensor, K: int) -> torch.Tensor:
    """parent [B, T] (-1: before the block) -> each node's window [B, T, K] in extended indices."""
    B, T = parent.shape
    dev = parent.device
    pre = (torch.arange(K - 1, device=dev) - 1).clamp(min=0).expand(B, K - 1)
    up = torch.cat([pre, K - 1 + parent], 1)  # [B, K - 1 + T]
    cols = [K - 1 + torch.arange(T, device=dev).expand(B, T)]
    for _ in range(K - 1):
        cols.append(up.gather(1, cols[-1]))
    return torch.stack(cols[::-1], -1)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, E, C], idx [B, ...] -> [B, ..., C]."""
    B, C = x.shape[0], x.shape[-1]
    flat = idx.reshape(B, -1)
    return x.gather(1, flat[..., None].expand(B, flat.shape[1], C)).view(*idx.shape, C)


class RecurrentState:
    def __init__(self, cfg: ModelConfig, rows: int, max_seq: int, device, dtype):
        d = gdn_dims(cfg)
        self.max_seq = max_seq
        L, K = len(cfg.gdn_layers), cfg.linear_conv_kernel_dim
        self.K = K
        shape = (L, rows, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        # float32 state (the reference kernels' choice), float64 for a float64 model.
        self.ssm = torch.zeros(shape, device=device, dtype=torch.promote_types(dtype, torch.float32))
        self.conv = torch.zeros(L, rows, K - 1, d["conv_dim"], device=device, dtype=dtype)
        self.strategy_name = "stock"
        self.strategy = strategy("stock")
        self.levels: int | None = None  # the rounds' depth + 1 (None: as many levels as block nodes)
        self._pending: VerifyStep | None = None

    def configure(self, name: str, levels: int | None) -> None:
        self.strategy_name, self.strategy, self.levels = name, strategy(name), levels

    def nbytes_per_row(self) -> int:
        return (self.ssm[:, 0].numel() * self.ssm.element_size()) + self.conv[:, 0].numel() * self.conv.element_size()

    def prefill(self, seq_len: torch.Tensor, valid: torch.Tensor | None, T: int) -> PrefillStep:
        full = torch.full_like(seq_len, T)
        valid = full if valid is None else valid.clamp(0, T)
        return PrefillStep(self, seq_len, torch.where(seq_len >= self.max_seq, 0, valid), T)

    def verify(self, anc: torch.Tensor, batch: int) -> VerifyStep:
        T = anc.shape[-1]
        tree = Tree.from_anc(anc, batch, self.levels if self.levels is not None else T)
        # An AR step (one token) is the same for every strategy: the recurrent step.
        strat = strategy("stock") if T == 1 else self.strategy
        self._pending = VerifyStep(self, tree, strat)
        return self._pending

    @torch.no_grad()
    def commit(self, last: torch.Tensor, seq_len: torch.Tensor) -> None:
        """Keep the state after block node ``last`` [B] of the last verify step.

        Rows parked in the scratch slots (seq_len >= max_seq: a capture warm-up's) keep theirs. Other rows
        not in use move too, as their K/V does: they are free, and a request that gets one starts from
        zero state at prefill."""
        step, self._pending = self._pending, None
        if step is None:
            raise RuntimeError("commit without a verify step")
        B = last.shape[0]
        keep = (seq_len < self.max_seq)[:, None, None]
        win = step.windows.gather(1, last[:, None, None].expand(B, 1, self.K))[:, 0, 1:]  # [B, K - 1]
        for slot, (xext, memo) in step.saved.items():
            S = step.strategy.state_after(memo, self.ssm[slot, :B], step.tree, last)
            self.ssm[slot, :B] = torch.where(keep[..., None], S, self.ssm[slot, :B])
            self.conv[slot, :B] = torch.where(keep, _take(xext, win), self.conv[slot, :B])


class PrefillStep:
    def __init__(self, st: RecurrentState, seq_len, valid, T: int):
        self.st, self.valid = st, valid
        B, dev = seq_len.shape[0], seq_len.device
        self.B = B
        self.fresh = seq_len == 0
        parent = torch.arange(T, device=dev).expand(B, T) - 1
        self.windows = _windows(parent, st.K)
        self.real = torch.arange(T, device=dev)[None, :] < valid[:, None]  # [B, T]

    def conv(self, slot: int, mixed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        st, B, K = self.st, self.B, self.st.K
        old = torch.where(self.fresh[:, None, None], 0, st.conv[slot, :B])
        xext = torch.cat([old.to(mixed.dtype), mixed], 1)
        # The new window: the K - 1 inputs ending at the last real token (extended indices valid .. valid + K - 2).
        tail = self.valid[:, None] + torch.arange(K - 1, device=mixed.device)
        st.conv[slot, :B] = _take(xext, tail).to(st.conv.dtype)
        return causal_conv(_take(xext, self.windows), weight)

    def mix(self, slot: int, q, k, v, g, beta) -> torch.Tensor:
        st, B = self.st, self.B
        S0 = torch.where(self.fresh[:, None, None, None], 0, st.ssm[slot, :B])
        g = torch.where(self.real[..., None], g, 0)
        beta = torch.where(self.real[..., None], beta, 0)
        # Each chunk's causal solve is the TreeWY kernel where it runs (a chain is a tree), else PyTorch.
        o, S = chunked(q, k, v, g, beta, S0, solve=gdn_tree_wy)
        st.ssm[slot, :B] = S
        return o


class VerifyStep:
    def __init__(self, st: RecurrentState, tree: Tree, strat):
        self.st, self.tree, self.strategy = st, tree, strat
        self.windows = _windows(tree.parent, st.K)
        self.saved: dict[int, tuple] = {}
        self._xext: dict[int, torch.Tensor] = {}

    def conv(self, slot: int, mixed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        B = mixed.shape[0]
        xext = torch.cat([self.st.conv[slot, :B].to(mixed.dtype), mixed], 1)
        self._xext[slot] = xext
        return causal_conv(_take(xext, self.windows), weight)

    def mix(self, slot: int, q, k, v, g, beta) -> torch.Tensor:
        o, memo = self.strategy.run(q, k, v, g, beta, self.st.ssm[slot, : q.shape[0]], self.tree)
        self.saved[slot] = (self._xext.pop(slot), memo)
        return o
