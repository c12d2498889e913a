"""The verify tree from a draft lattice in one launch, and its verify masks in another (Triton); the references
are ``tree_verify.best_first`` and ``tree_verify.ancestor_mask``.

Why: between the drafter's last forward and the verify pass, the tree round picked the best N candidates (two
stable sorts and eight gathers and scatters) and built the ancestor mask by pointer chasing (two ops a depth):
about 40 small PyTorch kernels, in a CPU count of one SmolLM2 tree round (budget 32, depth 6, top-k 8), on a
GPU that spends ~2.5 us a kernel in that round.

``best_first_tree``: one program per row ranks every candidate against every other (in ``BLOCK`` x ``BLOCK``
tiles, so any lattice size fits) by the key best_first sorts on (score descending, then depth, then
candidate id); rank r < N makes a candidate node r. A node's parent is its parent candidate's rank, read back
from the rank scratch the same program wrote. Prefix closure (a child's score is its parent's plus an edge
<= 0) puts every parent before its children, as in best_first. NaN scores (a corrupt drafter) give some valid
tree rather than torch.sort's order; the verify pass judges the drafts either way.

``tree_masks``: one program per row walks every block entry's ancestors ``max_depth`` steps at once and
writes the [N + 1, N + 1] ancestor-or-self mask and each entry's depth (its mask row's count less one).
"""

from __future__ import annotations

import torch

from tree_verify import DraftTree, Lattice, ancestor_mask, best_first

from .launch import runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs keep the references
    triton = None

BLOCK = 64  # candidates a rank tile compares (a [64, 64] comparison)
MAX_MASK_NODES = 127  # tree nodes tree_masks takes (a [128, 128] mask in registers)


def _runs_here(t: torch.Tensor) -> bool:
    return runs_on(t, _masks_kernel if triton is not None else None)


if triton is not None:

    @triton.jit
    def _best_first_kernel(scores_ptr, depths_ptr, tokens_ptr, lpar_ptr, rank_ptr,
                           tok_ptr, par_ptr, dep_ptr, score_ptr, cand_ptr,
                           C, E, N, K: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        row = b * C
        for i0 in range(0, C, BLOCK):
            i = i0 + tl.arange(0, BLOCK)
            i_ok = i < C
            s_i = tl.load(scores_ptr + row + i, mask=i_ok, other=0.0)
            d_i = tl.load(depths_ptr + row + i, mask=i_ok, other=0)
            rank = tl.zeros([BLOCK], dtype=tl.int32)
            for j0 in range(0, C, BLOCK):
                j = j0 + tl.arange(0, BLOCK)
                j_ok = j < C
                s_j = tl.load(scores_ptr + row + j, mask=j_ok, other=0.0)
                d_j = tl.load(depths_ptr + row + j, mask=j_ok, other=0)
                same = s_j[None, :] == s_i[:, None]
                first = (d_j[None, :] < d_i[:, None]) | ((d_j[None, :] == d_i[:, None]) & (j[None, :] < i[:, None]))
                ahead = ((s_j[None, :] > s_i[:, None]) | (same & first)) & j_ok[None, :]
                rank += tl.sum(ahead.to(tl.int32), 1)
            tl.store(rank_ptr + row + i, rank, mask=i_ok)
        tl.debug_barrier()  # the ranks this program stored are read back below
        for i0 in range(0, C, BLOCK):
            i = i0 + tl.arange(0, BLOCK)
            i_ok = i < C
            rank = tl.load(rank_ptr + row + i, mask=i_ok, other=N)
            take = i_ok & (rank < N)
            node = b * N + rank
            tl.store(tok_ptr + node, tl.load(tokens_ptr + row + i, mask=take, other=0), mask=take)
            tl.store(dep_ptr + node, tl.load(depths_ptr + row + i, mask=take, other=0), mask=take)
            tl.store(score_ptr + node, tl.load(scores_ptr + row + i, mask=take, other=0.0), mask=take)
            tl.store(cand_ptr + node, i.to(tl.int64), mask=take)
            cp = tl.load(lpar_ptr + b * E + i // K, mask=take, other=-1)  # the parent candidate, -1: the root
            pr = tl.load(rank_ptr + row + cp, mask=take & (cp >= 0), other=N)
            tl.store(par_ptr + node, tl.where(pr < N, pr, -1).to(tl.int64), mask=take)

    @triton.jit
    def _masks_kernel(par_ptr, anc_ptr, depth_ptr, N, STEPS: tl.constexpr, RP: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        r = tl.arange(0, RP)  # block entries: 0 the root, n + 1 node n
        c = tl.arange(0, RP)
        r_ok = r <= N
        ptr = r
        mark = c[None, :] == ptr[:, None]
        for _ in tl.static_range(STEPS):
            up = tl.load(par_ptr + b * N + ptr - 1, mask=r_ok & (ptr > 0), other=-1) + 1
            ptr = tl.where(ptr > 0, up, 0)
            mark = mark | (c[None, :] == ptr[:, None])
        ok = r_ok[:, None] & (c[None, :] <= N)
        tl.store(anc_ptr + (b * (N + 1) + r[:, None]) * (N + 1) + c[None, :], mark.to(tl.uint8), mask=ok)
        depth = tl.sum((mark & ok).to(tl.int32), 1) - 1
        tl.store(depth_ptr + b * (N + 1) + r, depth.to(tl.int64), mask=r_ok)


def best_first_tree(lattice: Lattice, num_nodes: int) -> DraftTree:
    """``tree_verify.best_first`` of a batched lattice with scores and depths, in one launch where Triton runs
    (a GPU or the interpreter); the same tree, field for field."""
    if not (lattice.batched and lattice.scores is not None and lattice.depths is not None) or not _runs_here(
        lattice.tokens
    ):
        return best_first(lattice, num_nodes)
    B, E, k = lattice.tokens.shape
    C = E * k
    if not 1 <= num_nodes <= C:
        raise ValueError(f"num_nodes must be in 1..{C} (the lattice's candidates), got {num_nodes}")
    scores, depths = lattice.scores.contiguous(), lattice.depths.contiguous()
    tokens, parents = lattice.tokens.reshape(B, C).contiguous(), lattice.parents.contiguous()
    dev = scores.device
    rank = torch.empty(B, C, dtype=torch.int32, device=dev)
    out = [torch.empty(B, num_nodes, dtype=torch.long, device=dev) for _ in range(3)]
    score_out = torch.empty(B, num_nodes, dtype=scores.dtype, device=dev)
    cand = torch.empty(B, num_nodes, dtype=torch.long, device=dev)
    _best_first_kernel[(B,)](
        scores, depths, tokens, parents, rank, out[0], out[1], out[2], score_out, cand, C, E, num_nodes,
        K=k, BLOCK=BLOCK, num_warps=4,
    )  # fmt: skip
    return DraftTree(tokens=out[0], parents=out[1], depths=out[2], scores=score_out, candidates=cand)


def tree_masks_ref(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: (ancestor-or-self mask [B, N + 1, N + 1], block depths [B, N + 1], the root 0)."""
    anc = ancestor_mask(parents, max_depth)
    return anc, torch.cat([torch.zeros_like(parents[:, :1]), anc[:, 1:].sum(-1) - 1], 1)


def tree_masks(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tree_masks_ref`` in one launch where Triton runs and the tree has at most ``MAX_MASK_NODES`` nodes."""
    B, N = parents.shape
    if not _runs_here(parents) or N > MAX_MASK_NODES:
        return tree_masks_ref(parents, max_depth)
    anc = torch.empty(B, N + 1, N + 1, dtype=torch.bool, device=parents.device)
    depth = torch.empty(B, N + 1, dtype=torch.long, device=parents.device)
    _masks_kernel[(B,)](
        parents.contiguous(), anc.view(torch.uint8), depth, N, STEPS=min(N, max_depth),
        RP=max(16, triton.next_power_of_2(N + 1)), num_warps=4,
    )  # fmt: skip
    return anc, depth
