"""How a verify step computes the gated delta rule over a block of drafted nodes, and the state a commit keeps.

A verify block holds T nodes (the root, then the drafted nodes in a topological order); node t's output
o_t = S_t^T q_t needs S_t, the state after the root path ending at t, starting from the row's committed
state S_0. After acceptance only the state after the last accepted node survives (``state_after``).
Every strategy is tensor ops over static shapes (no host reads), so a round stays capturable.

    stock   a snapshot per verified position: T recurrent steps in order, keeping every S_t. Exact for a
            chain only (it steps through nodes in block order, node t from node t - 1), so the engine
            refuses it for trees. Memory: T states of [H, d_k, d_v] per layer and row.
    path    path recompute: depth by depth, every node steps from its parent's state (gathered), so
            after D + 1 levels each node holds the state along its own root path. Exact on any tree;
            (D + 1) T steps of work, T states kept.
    wy      all root paths at once (TreeWY, ``models/gdn_ops.tree_wy``): one unit-triangular solve
            over the ancestor mask, prefixes shared; keeps only k, u and the path log-decays (T (d_k +
            d_v + 1) numbers per head instead of T d_k d_v) and rebuilds the one accepted state. On CUDA
            (and under TRITON_INTERPRET=1) the solve is the Triton kernel ``kernels/gdn_tree_wy.py``,
            given ``levels`` as its bound on path length; elsewhere, or for shapes it does not take,
            the PyTorch form.

``run`` returns (o [B, T, H, d_v], memo); ``state_after(memo, S0, tree, last)`` -> [B, H, d_k, d_v].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.gdn_ops import recurrent, recurrent_step, state_at, tree_wy

try:  # Triton is optional on CPU-only installs; the WY strategy then keeps the PyTorch form.
    from ..kernels.gdn_tree_wy import gdn_tree_wy
except ImportError:  # pragma: no cover - exercised only where triton is missing
    gdn_tree_wy = None

STRATEGIES = ("stock", "path", "wy")


@dataclass
class Tree:
    """The block's shape, derived once per step: anc [B, T, T], parent [B, T] (-1: the root), depth [B, T]."""

    anc: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    levels: int  # depths 0 .. levels - 1 occur (the round's depth + 1)

    @classmethod
    def from_anc(cls, anc: torch.Tensor, batch: int, levels: int) -> Tree:
        # In a topological order a node's parent is its latest strict ancestor.
        T = anc.shape[-1]
        anc = anc.expand(batch, T, T)
        idx = torch.arange(T, device=anc.device)
        strict = anc & (idx[None, :] < idx[:, None])
        parent = torch.where(strict, idx, -1).amax(-1)
        return cls(anc, parent, anc.sum(-1) - 1, min(levels, T))


def _gather_nodes(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...], idx [B, M] -> [B, M, ...]."""
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(*idx.shape, *x.shape[2:]))


class Stock:
    def run(self, q, k, v, g, beta, S0, tree: Tree):
        o, states = recurrent(q, k, v, g, beta, S0)
        return o, states

    def state_after(self, memo, S0, tree: Tree, last):
        return _gather_nodes(memo, last[:, None])[:, 0]


class PathRecompute:
    def run(self, q, k, v, g, beta, S0, tree: Tree):
        B, T, H, dk = q.shape
        dv = v.shape[-1]
        flat = lambda x: x.reshape(B * T, *x.shape[2:])  # noqa: E731
        states = S0[:, None].expand(B, T, H, dk, dv)
        o = q.new_zeros(B, T, H, dv)
        root = (tree.parent < 0)[..., None, None, None]
        for d in range(tree.levels):
            # Level d steps every node from its parent's state; only depth-d nodes keep the result, and
            # their parents (depth d - 1) were final after level d - 1.
            prev = torch.where(root, S0[:, None], _gather_nodes(states, tree.parent.clamp(min=0)))
            od, Sd = recurrent_step(flat(q), flat(k), flat(v), flat(g), flat(beta), flat(prev))
            here = tree.depth == d
            states = torch.where(here[..., None, None, None], Sd.view(B, T, H, dk, dv), states)
            o = torch.where(here[..., None, None], od.view(B, T, H, dv), o)
        return o, states

    def state_after(self, memo, S0, tree: Tree, last):
        return _gather_nodes(memo, last[:, None])[:, 0]


class WY:
    def run(self, q, k, v, g, beta, S0, tree: Tree):
        if gdn_tree_wy is None:
            o, u, G = tree_wy(q, k, v, g, beta, S0, tree.anc)
        else:  # the kernel where it runs natively (it falls back to tree_wy itself elsewhere)
            o, u, G = gdn_tree_wy(q, k, v, g, beta, S0, tree.anc, tree.levels)
        return o, (k, u, G)

    def state_after(self, memo, S0, tree: Tree, last):
        k, u, G = memo
        anc_row = _gather_nodes(tree.anc, last[:, None])[:, 0]  # [B, T]: last's ancestors and itself
        return state_at(k, u, G, S0, anc_row)


def strategy(name: str):
    if name not in STRATEGIES:
        raise ValueError(f"unknown gdn_verify strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return {"stock": Stock, "path": PathRecompute, "wy": WY}[name]()
