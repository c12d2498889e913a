"""BF16 GEMV for decode rows: ``y = x @ W^T (+ bias)`` for a few rows of x (Triton), and its reference.

Why: at batch 1 a decode step's projections are matrix-vector products. On the H200, cuBLAS reads the
Llama-3.1-8B's small projections at 2.5-3.2 TB/s of the ~4.3 an H200 streams (the rounds issue), and the real
SmolLM2's at ~3.9 us a call whatever their size (rounds_h200.json, 8fdc58d: 90 calls of its 8x64 tile kernel
took 351 us of a 1.11 ms step), so a step of one token sits well above its weight-byte floor.

The kernel: one program per ``BLOCK_N`` output features, the whole reduction over K in one program (no split-K:
deterministic, one launch, and N / BLOCK_N programs fill the SMs at every projection of the models here);
``BLOCK_K`` columns of W a step, loaded as [BLOCK_N, BLOCK_K] tiles, multiplied by each of the M <= MAX_ROWS
rows of x and summed in fp32; the bias is added in fp32 and the result rounded once to x's dtype, as cuBLAS
does (its sums run in another order, so the last bit may differ: a near-tie may tip, which token forcing
judges). ``pick_config`` chooses the tile from static shapes only (graph- and compile-safe).

Not in the engine yet: ``benchmarks/gemv_bench.py`` times it against cuBLAS on the models' shapes (weight
copies rotated past L2, in CUDA graphs) before any default uses it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

MAX_ROWS = 4  # decode rows a launch takes (batch-1 decode is 1; a few rows of a small batch)
TILE_ELEMS = 4096  # weights of one [BLOCK_N, BLOCK_K] tile (a starting point: the benchmark's sweep decides)


class GemvConfig(NamedTuple):
    block_n: int  # output features per program
    block_k: int  # reduction columns a step
    num_warps: int


def pick_config(N: int, K: int, num_sms: int = 132) -> GemvConfig:
    """The tile from static shapes: the widest BLOCK_N (of 32, 16, 8, 4) that still gives two programs per SM,
    and BLOCK_K columns so that a W tile holds TILE_ELEMS weights (at most 512, at least 64, at most K's
    power of two): the tile's fp32 products live in registers, TILE_ELEMS / 128 a thread at four warps."""
    block_n = 4
    for b in (32, 16, 8):
        if triton.cdiv(N, b) >= 2 * num_sms:
            block_n = b
            break
    block_k = min(512, TILE_ELEMS // block_n, max(64, triton.next_power_of_2(K)))
    return GemvConfig(block_n, max(64, block_k), 4)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None], other=0.0)
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None], other=0.0)
        else:
            k_ok = k < K
            w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # [BLOCK_M, 1, BLOCK_K] * [1, BLOCK_N, BLOCK_K], summed over K in fp32.
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])


# TRITON_INTERPRET=1 counts only if it was set before triton was imported: ask the kernel.
INTERPRETED = isinstance(_gemv_kernel, InterpretedFunction)


def _launchable(kernel):
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: GemvConfig | None = None):
    """``x [..., K]`` (at most MAX_ROWS rows in all) times ``weight [N, K]``^T (+ ``bias [N]``) -> ``[..., N]``
    in x's dtype. Runs on the GPU or in the Triton interpreter."""
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.shape != (N, K):
        raise ValueError(f"weight {tuple(weight.shape)} does not take x with {K} features")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"gemv takes 1 to {MAX_ROWS} rows, got {M} (use F.linear)")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("weight must be contiguous along K")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}, expected ({N},)")
    dev = x.device
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    cfg = config or pick_config(N, K, num_sms)
    y = torch.empty((M, N), device=dev, dtype=x.dtype)
    grid = (triton.cdiv(N, cfg.block_n),)
    _launchable(_gemv_kernel)[grid](
        x2,
        weight,
        bias if bias is not None else weight,  # unused without HAS_BIAS
        y,
        M,
        N,
        K,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        BLOCK_M=triton.next_power_of_2(M),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        HAS_BIAS=bias is not None,
        EVEN_K=K % cfg.block_k == 0,
        num_warps=cfg.num_warps,
    )
    return y.reshape(*lead, N)


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: fp32 products and sums, one rounding to x's dtype."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
