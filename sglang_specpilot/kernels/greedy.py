"""Greedy pick over logit rows: each row's argmax and whether it holds a NaN or inf, in one pass (Triton).

Why: a greedy round ends with ``logits.argmax(-1)`` and ``nonfinite_rows(logits)`` (the per-row corrupt-
checkpoint flag), which PyTorch runs as separate passes over the logits: on the H200 the lifted 8B's AR
round spent 37 us in the argmax over 128,256 logits (one row leaves most of the GPU idle) and ~25 us in the
seven kernels of the flag, against a 4.4 ms round; SmolLM2's spent 13 us and ~15 us of a 0.90 ms round
(round_profile_h200.json, 57541d1). Here each row is cut into ``CHUNK``-logit pieces, one program each,
which read their piece once for both answers; a second launch merges the pieces of a row.

Ties go to the smallest index, as ``torch.argmax`` does. A row with a NaN is flagged; its index is then
the argmax of its other entries (``torch.argmax`` would name a NaN), which nothing uses: the round fails a
flagged row. ``greedy_pick_ref`` is the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 8192  # logits a program reads: 16 programs a row at Llama 3's 128,256, 6 at SmolLM2's 49,152
BLOCK = 2048  # logits a program loads a step


@triton.jit
def _pick_chunks(x_ptr, val_ptr, idx_ptr, bad_ptr, V, stride_x, n_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int64)
    bad = tl.full([], 0, tl.int32)
    base = x_ptr + row.to(tl.int64) * stride_x
    for s in tl.static_range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + s + tl.arange(0, BLOCK)
        ok = offs < V
        x = tl.load(base + offs, mask=ok, other=float("-inf")).to(tl.float32)
        nonfinite = ((x != x) | (tl.abs(x) == float("inf"))) & ok
        bad = tl.maximum(bad, tl.max(nonfinite.to(tl.int32), 0))
        x = tl.where(x != x, float("-inf"), x)
        m = tl.max(x, 0)
        i = tl.min(tl.where((x == m) & ok, offs, V), 0).to(tl.int64)
        # Strictly greater: an earlier step keeps a tie (the smaller index).
        take = m > best
        best_i = tl.where(take, i, best_i)
        best = tl.where(take, m, best)
    # A chunk of -inf only (masked or real) keeps index 0 of the row's first chunk (argmax of all -inf is 0).
    best_i = tl.where(best == float("-inf"), (chunk * CHUNK).to(tl.int64), best_i)
    out = row * n_chunks + chunk
    tl.store(val_ptr + out, best)
    tl.store(idx_ptr + out, best_i)
    tl.store(bad_ptr + out, bad)


@triton.jit
def _pick_merge(val_ptr, idx_ptr, bad_ptr, tok_ptr, flag_ptr, n_chunks, SPLITS: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, SPLITS)
    ok = c < n_chunks
    v = tl.load(val_ptr + row * n_chunks + c, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + row * n_chunks + c, mask=ok, other=0)
    b = tl.load(bad_ptr + row * n_chunks + c, mask=ok, other=0)
    m = tl.max(v, 0)
    # The first chunk holding the maximum (chunks are in index order, so the smallest index).
    first = tl.min(tl.where((v == m) & ok, c, SPLITS), 0)
    tok = tl.sum(tl.where(c == first, i, 0), 0)
    tl.store(tok_ptr + row, tok)
    tl.store(flag_ptr + row, tl.max(b, 0) != 0)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [..., V]`` -> (argmax int64 [...], non-finite bool [...]) per row; GPU or interpreter."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    n_chunks = triton.cdiv(V, CHUNK)
    dev = logits.device
    val = torch.empty(R * n_chunks, device=dev, dtype=torch.float32)
    idx = torch.empty(R * n_chunks, device=dev, dtype=torch.int64)
    bad = torch.empty(R * n_chunks, device=dev, dtype=torch.int32)
    tok = torch.empty(R, device=dev, dtype=torch.int64)
    flag = torch.empty(R, device=dev, dtype=torch.bool)
    _pick_chunks[(R, n_chunks)](x, val, idx, bad, V, x.stride(0), n_chunks, CHUNK=CHUNK, BLOCK=BLOCK, num_warps=4)
    _pick_merge[(R,)](val, idx, bad, tok, flag, n_chunks, SPLITS=triton.next_power_of_2(n_chunks), num_warps=1)
    return tok.view(lead), flag.view(lead)


def greedy_pick_ref(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: NaN read as -inf for the argmax (see the module docstring), the flag as torch computes it."""
    clean = torch.where(torch.isnan(logits), float("-inf"), logits)
    return clean.argmax(-1), ~torch.isfinite(logits).all(-1)
