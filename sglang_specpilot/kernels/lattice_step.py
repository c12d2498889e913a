"""One depth's selection in the draft lattice's expansion (``engine/draft_tree.expand_lattice``), in one launch
(Triton), and its PyTorch reference.

Why: between two drafter forwards, the lattice's bookkeeping (pick the k best candidates of the previous depth
by path score, record which expansion takes each, grow the visibility table, gather the tokens, positions and
slots the next forward reads) ran as about 25 small PyTorch kernels a depth, a stable sort among them. A CPU
count of one SmolLM2 tree round (budget 32, depth 6, top-k 8) found 216 such operations in the expansion
against ~100 more in the rest of the round's bookkeeping; on the H200 the tree round spends ~2.5 us a kernel.
Here one program per row does a depth's selection: at most ``MAX_CANDIDATES`` scores fit in registers, so
the stable descending top-k is a rank count over all pairs.

The lattice (per row): candidates c = e * k + j (child j of expansion e) with ``scores``, ``tokens`` [B, C];
``parents`` [B, E] (the candidate each expansion expands, -1 for the root); ``vis`` [B, E, E] (expansion e'
is e or one of its ancestors); ``expanded_by`` [B, C] (the expansion that expanded a candidate, -1 if none).
At depth d the previous depth's candidates are those of ``n_exp`` expansions from ``first_exp``; the k best
become expansions ``e0 .. e0 + k - 1`` with e0 = 1 + (d - 1) * k.

Ties keep candidate order (a stable sort), as ``tree_verify.best_first`` resolves them. NaN scores (a corrupt
drafter) give some valid pick rather than torch.sort's order; the verify pass judges the drafts either way.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .launch import runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs keep the reference
    triton = None

MAX_CANDIDATES = 128  # a depth's candidates the kernel ranks in registers (a [128, 128] comparison)


class Selection(NamedTuple):
    """What the next drafter forward reads, [B, k] each: the candidates expanded, their tokens, positions and
    draft slots, the expansion each candidate belongs to (whose hidden state it continues), and its path
    score."""

    cand: torch.Tensor
    x: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    parent_exp: torch.Tensor
    base: torch.Tensor


@functools.cache
def _depth_constants(e0: int, k: int, E: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    # A depth's expansion ids [k] and their one-hot rows [k, E]: constants a captured round reads (built at
    # warm-up, as device tensors: a Python True put into vis would copy a host scalar, which capture refuses).
    e_ids = torch.arange(e0, e0 + k, device=dev)
    return e_ids, torch.arange(E, device=dev)[None, :] == e_ids[:, None]


def lattice_select_ref(scores, tokens, parents, vis, expanded_by, seq_len, d: int, k: int) -> Selection:
    """The reference (PyTorch ops): updates ``parents``, ``vis`` and ``expanded_by`` in place."""
    B = scores.shape[0]
    first_exp, n_exp = (0, 1) if d == 1 else (1 + (d - 2) * k, k)
    e0 = 1 + (d - 1) * k
    prev = scores[:, first_exp * k : (first_exp + n_exp) * k]
    pick = torch.sort(prev, dim=-1, descending=True, stable=True).indices[:, :k]
    cand = first_exp * k + pick
    E = vis.shape[1]
    e_ids, eye = _depth_constants(e0, k, E, str(scores.device))
    expanded_by.scatter_(1, cand, e_ids.expand(B, k))
    parents[:, e0 : e0 + k] = cand
    parent_exp = cand // k
    vis[:, e0 : e0 + k] = vis.gather(1, parent_exp[:, :, None].expand(B, k, E)) | eye
    pos = (seq_len + d)[:, None].expand(B, k)
    return Selection(cand, tokens.gather(1, cand), pos, seq_len[:, None] + e_ids, parent_exp, scores.gather(1, cand))


if triton is not None:

    @triton.jit
    def _select_kernel(scores_ptr, tokens_ptr, parents_ptr, vis_ptr, exp_ptr, seq_ptr,
                       cand_ptr, x_ptr, pos_ptr, slots_ptr, pexp_ptr, base_ptr,
                       C, E, d, first_exp, n,
                       K: tl.constexpr, NP: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        lo = first_exp * K
        i = tl.arange(0, NP)
        j = tl.arange(0, NP)
        s_i = tl.load(scores_ptr + b * C + lo + i, mask=i < n, other=0.0)
        s_j = tl.load(scores_ptr + b * C + lo + j, mask=j < n, other=0.0)
        # rank_i = #{j: s_j > s_i} + #{j < i: s_j == s_i}, over real candidates only: the real ranks are a
        # permutation of 0 .. n - 1, candidate order breaking ties (torch.sort(stable=True, descending=True)).
        before = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None]))
        before = before & (j[None, :] < n)
        rank = tl.sum(before.to(tl.int32), 1)
        rank = tl.where(i < n, rank, NP)
        r = tl.arange(0, KP)
        hit = rank[None, :] == r[:, None]  # [KP, NP]: candidate i is the r-th best
        pick = tl.sum(tl.where(hit, i[None, :], 0), 1).to(tl.int64)
        r_ok = r < K
        cand = lo + pick
        e = (1 + (d - 1) * K + r).to(tl.int64)
        seq = tl.load(seq_ptr + b)
        out = b * K + r
        tl.store(cand_ptr + out, cand, mask=r_ok)
        tl.store(x_ptr + out, tl.load(tokens_ptr + b * C + cand, mask=r_ok, other=0), mask=r_ok)
        tl.store(base_ptr + out, tl.load(scores_ptr + b * C + cand, mask=r_ok, other=0.0), mask=r_ok)
        tl.store(pos_ptr + out, seq + d + r * 0, mask=r_ok)
        tl.store(slots_ptr + out, seq + e, mask=r_ok)
        pexp = cand // K
        tl.store(pexp_ptr + out, pexp, mask=r_ok)
        tl.store(exp_ptr + b * C + cand, e, mask=r_ok)
        tl.store(parents_ptr + b * E + e, cand, mask=r_ok)
        # vis[e] = vis[parent's expansion] | {e}: the parents are earlier expansions, never rows written here.
        c = tl.arange(0, EP)
        ok = r_ok[:, None] & (c[None, :] < E)
        row = tl.load(vis_ptr + (b * E + pexp[:, None]) * E + c[None, :], mask=ok, other=0)
        row = tl.where(c[None, :] == e[:, None], 1, row)
        tl.store(vis_ptr + (b * E + e[:, None]) * E + c[None, :], row.to(tl.uint8), mask=ok)

    @triton.jit
    def _children_kernel(scores_ptr, logprobs_ptr, tokens_ptr, base_ptr, lp_ptr, tok_ptr, d2t_ptr, C, lo,
                         KK: tl.constexpr, K: tl.constexpr, P: tl.constexpr, HAS_D2T: tl.constexpr):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, P)
        ok = c < KK
        lp = tl.load(lp_ptr + b * KK + c, mask=ok, other=0.0)
        tok = tl.load(tok_ptr + b * KK + c, mask=ok, other=0)
        if HAS_D2T:
            tok = tl.load(d2t_ptr + tok, mask=ok, other=0)
        base = tl.load(base_ptr + b * (KK // K) + c // K, mask=ok, other=0.0)
        tl.store(scores_ptr + b * C + lo + c, base + lp, mask=ok)
        tl.store(logprobs_ptr + b * C + lo + c, lp, mask=ok)
        tl.store(tokens_ptr + b * C + lo + c, tok, mask=ok)


def lattice_children_ref(scores, logprobs, tokens, base, lp, tok, d2t, lo: int) -> None:
    """The reference: expansions' children (``lp``, draft ids ``tok`` [B, n, k], ``d2t`` mapping them to
    target ids or None) written at candidates ``lo ..`` with path scores ``base`` [B, n] + edge."""
    hi = lo + lp.shape[1] * lp.shape[2]
    scores[:, lo:hi] = (base[:, :, None] + lp).flatten(1)
    logprobs[:, lo:hi] = lp.flatten(1)
    tokens[:, lo:hi] = (tok if d2t is None else d2t[tok]).flatten(1)


def lattice_children(scores, logprobs, tokens, base, lp, tok, d2t, lo: int) -> None:
    """``lattice_children_ref`` in one launch where the kernel runs (the same sums: one fp add each)."""
    if not runs_on(scores, _children_kernel if triton is not None else None) or lp.dtype != scores.dtype:
        return lattice_children_ref(scores, logprobs, tokens, base, lp, tok, d2t, lo)
    B, n, k = lp.shape
    lp, tok, base = lp.contiguous(), tok.contiguous(), base.contiguous()
    _children_kernel[(B,)](
        scores, logprobs, tokens, base, lp, tok, tok if d2t is None else d2t, scores.shape[1], lo,
        KK=n * k, K=k, P=max(16, triton.next_power_of_2(n * k)), HAS_D2T=d2t is not None, num_warps=4,
    )  # fmt: skip


def kernel_takes(scores: torch.Tensor, d: int, k: int) -> bool:
    """Whether ``lattice_select`` runs the kernel here (a GPU or the interpreter, a depth that fits)."""
    n = k if d == 1 else k * k
    return n <= MAX_CANDIDATES and runs_on(scores, _select_kernel if triton is not None else None)


def lattice_select(scores, tokens, parents, vis, expanded_by, seq_len, d: int, k: int) -> Selection:
    """A depth's selection: the kernel where ``kernel_takes``, else the reference; the same results (and the
    same in-place updates of ``parents``, ``vis`` and ``expanded_by``). ``vis`` is bool, the rest int64 but
    ``scores`` (float32 or float64)."""
    if not kernel_takes(scores, d, k):
        return lattice_select_ref(scores, tokens, parents, vis, expanded_by, seq_len, d, k)
    B, C = scores.shape
    E = parents.shape[1]
    if vis.dtype != torch.bool or not vis.is_contiguous() or not scores.is_contiguous():
        raise ValueError("lattice_select wants a contiguous bool vis and contiguous scores")
    for t in (tokens, parents, expanded_by):
        if not t.is_contiguous():
            raise ValueError("lattice_select wants contiguous tokens, parents and expanded_by")
    first_exp, n_exp = (0, 1) if d == 1 else (1 + (d - 2) * k, k)
    n = n_exp * k
    dev = scores.device
    cand, x, pos, slots, pexp = (torch.empty(B, k, dtype=torch.long, device=dev) for _ in range(5))
    base = torch.empty(B, k, dtype=scores.dtype, device=dev)
    _select_kernel[(B,)](
        scores, tokens, parents, vis.view(torch.uint8), expanded_by, seq_len,
        cand, x, pos, slots, pexp, base,
        C, E, d, first_exp, n,
        K=k, NP=max(16, triton.next_power_of_2(n)), KP=max(16, triton.next_power_of_2(k)),
        EP=max(16, triton.next_power_of_2(E)), num_warps=4,
    )  # fmt: skip
    return Selection(cand, x, pos, slots, pexp, base)
