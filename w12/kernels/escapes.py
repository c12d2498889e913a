"""Escapes without branches in the hot loop: decode the placeholder, then add a sparse correction.

The idea. An escape slot holds code 0 in both planes, which the hot loop decodes like any weight: to the
row's *placeholder* ``p[n] = bf16(base[n] << 7) = 2^(base[n] - 127)`` (+0 when base = 0), so the main loop
computes ``x @ W_hat^T`` where W_hat has p[n] in every escape slot of row n. The epilogue of the program
that owns rows n0 .. n0 + BN then adds, for each escape (n, k, v) of those rows,

    acc[n, m] += x[m, k] * (v - p[n])                                     (fp32)

Escapes are sorted by flat index n * K + k, so one row's escapes are contiguous; ``escape_row_ptr`` gives
``esc_row_ptr[n] = `` the first escape of row n (a CSR row pointer, [N + 1] int32, computed on the device
with ``searchsorted``: no host sync; ``W12Linear`` keeps it as a buffer). A program walks its range
``esc_row_ptr[n0] .. esc_row_ptr[min(n0 + BN, N)]`` in chunks of BLOCK_E escapes, gathers x[:, k] for them,
and folds the chunk into its rows:

* fp32 FMA path (at most 4 rows): ``sum_e where(row_e == n, contrib[e, m], 0)`` over a [BN, BLOCK_E, BM] tile;
* tensor-core path: ``tl.dot(onehot[BN, BLOCK_E], contrib[BLOCK_E, BM])`` with ``tf32x3`` (one-hot is exact,
  contrib keeps ~22 bits); a contribution that is inf or NaN (an inf/NaN weight, or an inf activation)
  would turn 0 * inf into NaN for every row of the tile, so such a chunk also takes a per-escape ``where``
  loop that touches only its own row (a branch per chunk, never taken on a finite model).

Deterministic: no atomics; each (row, column) sums its escapes in index order, after the K loop. With
split-K, either split 0 applies them all (the quad kernel, gemm.py) or split s takes the chunks s, s + S, ..
(the tensor-core kernel, gemm_tc.py), each into its own partial; the partials are summed in split order.

Cost: one chunk per ~BLOCK_E escapes of the tile's rows. At the escape rates the codec reports for BF16
checkpoints (well under 0.1%), a 64-row x 4096 tile has ~50 escapes: 4 chunks against 64 K-iterations.
A row with thousands of escapes (a rare pathological row) is correct but slow: see the report on the format.

Accuracy: ``v - p`` is rounded to fp32 (exact unless v is ~2^17 below the window), and the main loop's
``x * p`` term cancels against ``-x * p`` only to fp32 rounding, so the output bound counts
``max(|v|, p)`` for every escape slot (``gemm.gemm_tolerance``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from w12.format import W12Tensor

BLOCK_E = tl.constexpr(16)  # escapes per chunk: tl.dot needs 16 along its inner dimension


def escape_row_ptr(w: W12Tensor) -> torch.Tensor:
    """CSR row pointer of the escapes: int32 [N + 1], row n's escapes are ``esc_idx[ptr[n]:ptr[n + 1]]``.

    Computed on the escapes' device without reading values on the host (``searchsorted``), so it may run
    inside a CUDA graph; cache it next to the record when the weights are fixed (``W12Linear`` does).
    """
    N, K = w.shape
    bounds = torch.arange(N + 1, device=w.esc_idx.device, dtype=torch.int64) * K
    return torch.searchsorted(w.esc_idx, bounds).to(torch.int32)


def placeholder_values(base: torch.Tensor) -> torch.Tensor:
    """What code 0 decodes to in row n: ``2^(base[n] - 127)`` (+0 for base 0), fp32 [N]."""
    return (base.to(torch.int32) << 23).view(torch.float32)


@triton.jit
def _apply_escapes(
    acc,
    x_ptr,
    stride_xm,
    base_ptr,
    esc_idx_ptr,
    esc_val_ptr,
    esc_row_ptr,
    n0,
    m0,
    N,
    K,
    M,
    active,
    chunk0,
    chunk_step,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # acc [BLOCK_N, BLOCK_M] fp32, rows n0.., columns (activation rows) m0..; active: this program applies
    # escapes (otherwise its range is made empty), the chunks chunk0, chunk0 + chunk_step, .. of its rows'
    # (split-K: split 0 alone with 0, 1; or split s of S with s, S, which spreads a tile's chunks over its
    # splits so that no split waits for all of them).
    start = tl.load(esc_row_ptr + n0)
    end = tl.load(esc_row_ptr + tl.minimum(n0 + BLOCK_N, N))
    end = tl.where(active, end, start)
    stride = BLOCK_E * chunk_step
    start = start + chunk0 * BLOCK_E
    n_chunks = tl.maximum(end - start + stride - 1, 0) // stride  # (a run-time step: a counted loop)
    local = tl.arange(0, BLOCK_N)
    ms = m0 + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    for i in range(0, n_chunks):
        e = start + i * stride + tl.arange(0, BLOCK_E)
        ok = e < end
        idx = tl.load(esc_idx_ptr + e, mask=ok, other=0)
        val = tl.load(esc_val_ptr + e, mask=ok, other=0.0).to(tl.float32)
        n_e = idx // K
        k_e = idx - n_e * K
        p = (tl.load(base_ptr + n_e, mask=ok, other=0).to(tl.uint32) << 23).to(tl.float32, bitcast=True)
        delta = tl.where(ok, val - p, 0.0)
        xg = tl.load(x_ptr + ms[None, :] * stride_xm + k_e[:, None], mask=ok[:, None] & m_ok[None, :], other=0.0)
        contrib = xg.to(tl.float32) * delta[:, None]  # [BLOCK_E, BLOCK_M]
        hit = (n_e - n0)[None, :] == local[:, None]  # [BLOCK_N, BLOCK_E]
        if USE_DOT:
            finite = tl.abs(contrib) < float("inf")  # False for inf and NaN
            acc = tl.dot(hit.to(tl.float32), tl.where(finite, contrib, 0.0), acc, input_precision=DOT_PRECISION)
            bad = tl.sum(tl.sum((~finite).to(tl.int32), axis=1), axis=0)
            if bad > 0:
                # inf / NaN: one escape at a time, so 0 * inf never reaches another row.
                lane = tl.arange(0, BLOCK_E)
                for j in range(0, BLOCK_E):
                    pick = (lane == j)[:, None] & ~finite
                    c_j = tl.sum(tl.where(pick, contrib, 0.0), axis=0)  # [BLOCK_M]; 0 if escape j was finite
                    r_j = tl.sum(tl.where(lane == j, n_e - n0, 0), axis=0)
                    acc = tl.where((local == r_j)[:, None], acc + c_j[None, :], acc)
        else:
            acc += tl.sum(tl.where(hit[:, :, None], contrib[None, :, :], 0.0), axis=1)
    return acc


def escape_correction_ref(x: torch.Tensor, w: W12Tensor) -> torch.Tensor:
    """Plain PyTorch of what the epilogue adds: [M, N] fp32, ``sum_e x[:, k_e] (v_e - p[n_e])`` in column n_e.

    With it, ``x @ W_hat^T + escape_correction_ref(x, w)`` equals ``x @ W^T`` up to fp32 rounding, where W_hat
    is W with the placeholder in every escape slot (what the hot loop sees).
    """
    N, K = w.shape
    x2 = x.reshape(-1, K).float()
    out = torch.zeros(x2.shape[0], N, dtype=torch.float32, device=x.device)
    if w.esc_idx.numel():
        n_e, k_e = w.esc_idx // K, w.esc_idx % K
        delta = w.esc_val.float() - placeholder_values(w.base)[n_e]
        out.index_add_(1, n_e, x2[:, k_e] * delta[None, :])
    return out
