"""Greedy acceptance of B draft trees in one launch (Triton); the reference is
``tree_verify.accept_greedy_batched``, plus the round's padded path.

Why: after the verify pass the tree round found the longest matching path with about 25 small PyTorch
kernels (a gather, an any over the [N + 1, N + 1] mask, a key, an argmax, a sort of the path, four gathers)
and padded the path with two more, in a CPU count of one SmolLM2 tree round (budget 32, depth 6, top-k 8), on
a GPU that spends ~2.5 us a kernel in that round.

One program per row holds the ancestor mask ([N + 1, N + 1], N <= ``MAX_NODES``): an entry is accepted when
it and every ancestor matches the target's argmax at its parent; the last accepted entry is the deepest, the
earliest of equal depth (the reference's key); the path is that entry's mask row in index order (ancestors
come first in a topological tree), and the round's copy of it is padded to ``D + 1`` entries by repeating the
last one.
"""

from __future__ import annotations

import torch

from tree_verify import GreedyAccept, accept_greedy_batched

from .launch import runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs keep the reference
    triton = None

MAX_NODES = 127  # tree nodes the kernel holds ([128, 128] in registers)


if triton is not None:

    @triton.jit
    def _accept_kernel(par_ptr, tok_ptr, arg_ptr, anc_ptr, last_ptr, n_ptr, mask_ptr, path_ptr, pad_ptr, bonus_ptr,
                       N, D, RP: tl.constexpr, DP: tl.constexpr):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        r = tl.arange(0, RP)  # block entries (rows): 0 the root, n + 1 node n
        c = tl.arange(0, RP)  # the same entries as columns
        ok = (r[:, None] <= N) & (c[None, :] <= N)
        anc = tl.load(anc_ptr + (b * (N + 1) + r[:, None]) * (N + 1) + c[None, :], mask=ok, other=0) != 0
        # Column c matches when its token is the target's argmax after its parent (the root always matches).
        node = c >= 1
        c_in = node & (c <= N)
        par = tl.load(par_ptr + b * N + c - 1, mask=c_in, other=-1)
        wanted = tl.load(arg_ptr + b * (N + 1) + par + 1, mask=c_in, other=-1)
        tok = tl.load(tok_ptr + b * N + c - 1, mask=c_in, other=-2)
        match = (c == 0) | (c_in & (tok == wanted))
        bad = tl.sum((anc & ~match[None, :]).to(tl.int32), 1)
        depth = tl.sum(anc.to(tl.int32), 1) - 1
        key = tl.where((bad == 0) & (r <= N), depth * (N + 1) + (N - r), -1)
        best = tl.max(key, 0)
        last = tl.min(tl.where(key == best, r, RP), 0)
        n = tl.sum(tl.where(r == last, depth, 0), 0)
        row = tl.sum(tl.where(r[:, None] == last, anc.to(tl.int32), 0), 0) != 0  # anc[last]: the path's entries
        # Entry e of the path sits at slot "path entries before e" (ancestors come first: topological order).
        before = tl.sum(((r[:, None] > c[None, :]) & row[None, :]).to(tl.int32), 1)
        p = tl.arange(0, RP)  # output slots
        at = row[:, None] & (before[:, None] == p[None, :])  # [entries, slots]
        path = tl.where(tl.sum(at.to(tl.int32), 0) > 0, tl.sum(tl.where(at, r[:, None], 0), 0), -1)
        q = tl.arange(0, DP)  # the round's padded copy: slots past the last accepted entry repeat it
        at_q = row[:, None] & (before[:, None] == q[None, :])
        padded = tl.where(q <= n, tl.sum(tl.where(at_q, r[:, None], 0), 0), last)
        tl.store(last_ptr + b, last.to(tl.int64))
        tl.store(n_ptr + b, n.to(tl.int64))
        tl.store(bonus_ptr + b, tl.load(arg_ptr + b * (N + 1) + last))
        tl.store(mask_ptr + b * (N + 1) + c, row.to(tl.uint8), mask=c <= N)
        tl.store(path_ptr + b * (N + 1) + p, path.to(tl.int64), mask=p <= N)
        tl.store(pad_ptr + b * (D + 1) + q, padded.to(tl.int64), mask=q <= D)


def accept_greedy_tree_ref(parents, tokens, target_argmax, anc, D: int) -> tuple[GreedyAccept, torch.Tensor]:
    """The reference: ``accept_greedy_batched`` and the path padded (or cut) to D + 1 entries, the last
    accepted entry repeated (those land past the new end)."""
    res = accept_greedy_batched(parents, tokens, target_argmax, anc)
    return res, padded_path(res, D)


def padded_path(res, D: int) -> torch.Tensor:
    """An acceptance's path (``res.path``, ``res.last``) as D + 1 block indices, the last accepted entry
    repeated past the path's end."""
    path = torch.where(res.path < 0, res.last[:, None], res.path)[:, : D + 1]
    if path.shape[1] < D + 1:
        path = torch.cat([path, path[:, -1:].expand(path.shape[0], D + 1 - path.shape[1])], 1)
    return path


def accept_greedy_tree(parents, tokens, target_argmax, anc, D: int) -> tuple[GreedyAccept, torch.Tensor]:
    """``accept_greedy_tree_ref`` in one launch where Triton runs (a GPU or the interpreter) and N fits."""
    B, N = tokens.shape
    here = runs_on(tokens, _accept_kernel if triton is not None else None)
    if not here or N > MAX_NODES or anc.dtype != torch.bool:
        return accept_greedy_tree_ref(parents, tokens, target_argmax, anc, D)
    dev = tokens.device
    last, n, bonus = (torch.empty(B, dtype=torch.long, device=dev) for _ in range(3))
    mask = torch.empty(B, N + 1, dtype=torch.bool, device=dev)
    path = torch.empty(B, N + 1, dtype=torch.long, device=dev)
    padded = torch.empty(B, D + 1, dtype=torch.long, device=dev)
    _accept_kernel[(B,)](
        parents.contiguous(), tokens.contiguous(), target_argmax.contiguous(), anc.contiguous().view(torch.uint8),
        last, n, mask.view(torch.uint8), path, padded, bonus, N, D,
        RP=max(16, triton.next_power_of_2(N + 1)), DP=max(16, triton.next_power_of_2(D + 1)), num_warps=4,
    )  # fmt: skip
    return GreedyAccept(last=last, accept_length=n, path_mask=mask, path=path, bonus=bonus), padded
