"""BF16 GEMM for verify-sized row counts: ``y = x @ W^T (+ bias)`` for 2 to 64 rows of x (Triton), and its
reference.

Why: a speculative verify pass multiplies a few rows (a chain of gamma + 1, a 32-node tree's 33) by every
weight matrix, so it is as memory-bound as a decode step, and should cost about one decode step. On the H200
cuBLAS does not get there: the lifted 8B's 33-row verify spent 4.14 ms in cuBLAS GEMMs against 3.64 ms for
the same weights read at one row by ``gemv.py`` (round_profile_h200.json, 57541d1), and the 64-row verify
step took 1.30x the one-row step (rounds_h200.json, 1c734a8).

The kernel, "swap-AB": the weights are the MMA's A operand (``BLOCK_N`` rows of W on its 64-row side) and
the activations its B (``BLOCK_M`` = M rounded up to 16, 32 or 64), so one program reads a [BLOCK_N,
BLOCK_K] tile of W per step through Triton's multi-stage cp.async pipeline and multiplies it by the
[BLOCK_K, BLOCK_M] tile of x^T, accumulating [BLOCK_N, BLOCK_M] in fp32. Rows of x past M re-read row
M - 1 and rows of W past N re-read row N - 1 (never stored), so the loop has no masks when BLOCK_K divides K.

Split-K (``split_k`` programs a tile, a run-time argument): a projection with few output tiles (the 8B's o
and down: 4,096 outputs, 64 tiles of 64) would leave most SMs idle, so each tile's K range is cut into
``split_k`` parts. Every part writes an fp32 partial, bumps the tile's counter, and the last to arrive sums
the partials in split order (deterministic whatever the arrival order), adds the bias, rounds once to bf16
and resets the counter, all in the same launch. The counters belong to the caller (one buffer per layer,
zero between calls): two GEMMs running at once on two streams never share one.

The sums run in another order than cuBLAS's, so an output may differ in its last bit: a greedy near-tie may
tip, which token forcing judges. ``pick_config`` chooses the tile from (M, N, K) only (graph- and
compile-safe). ``benchmarks/skinny_gemm_bench.py`` times it against cuBLAS on the models' shapes (weight
copies rotated past L2, CUDA graphs) and sweeps the tiles.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .gemv import gemv_ref
from .pdl import uses_pdl

MIN_ROWS, MAX_ROWS = 2, 64  # row counts the kernel takes (one row is gemv.py's)
COUNTER_SLOTS = 4096  # tiles a split-K launch may count in one counters buffer
SMS_H200 = 132


class SkinnyConfig(NamedTuple):
    block_n: int  # output features per program (the MMA's M side)
    block_k: int  # reduction columns a step
    split_k: int  # programs per output tile along K (1: none)
    num_warps: int
    num_stages: int


def block_m(M: int) -> int:
    """x rows a program holds: M rounded up to 16, 32 or 64 (the MMA's N side)."""
    return 16 if M <= 16 else 32 if M <= 32 else 64


def split_for(tiles: int, k_steps: int, sms: int = SMS_H200) -> int:
    """Splits that fill the GPU: enough programs for two a SM where the tiles alone do not give one a SM,
    and never fewer than 8 K steps a split (each split pays a partial's store and a counter)."""
    if tiles >= sms:
        return 1
    want = -(-2 * sms // tiles)
    return max(1, min(want, k_steps // 8, 8))


def pick_config(M: int, N: int, K: int) -> SkinnyConfig:
    """The tile for an [M, K] x [N, K]^T product (static: graph- and compile-safe)."""
    bn, bk = 64, 128
    stages = 5 if M <= 32 else 4
    tiles = -(-N // bn)
    return SkinnyConfig(bn, bk, split_for(tiles, -(-K // bk)), 4, stages)


# A benchmarking hook for A/B runs in separate processes (the choice is baked into compiled blocks and captured
# graphs): SPECPILOT_VERIFY_GEMM=1 gives every verify-sized projection but the heads to the kernel, =0 none.
VERIFY_GEMM = os.environ.get("SPECPILOT_VERIFY_GEMM", "auto")
# The largest weight (N x K elements) the kernel takes by default: SmolLM2's projections (the largest, gate_up,
# 3,072 x 576 = 1.8M) are launch-bound at verify sizes, where cuBLAS pays ~3.7 us a call whatever the size and
# its layer needs four more kernels (two norms, silu_mul, the add) that the kernel's prologues take.
# The 8B's (16.8M to 117M) are bandwidth-bound, where cuBLAS wins (below).
SMALL_WEIGHT = 4 * 2**20
MAX_SKINNY_N = 32768  # no vocabulary head


def skinny_wins(M: int, N: int, K: int) -> bool:
    """Whether ``skinny_gemm`` (with its fused prologues) beats cuBLAS at this shape on the H200: on small,
    launch-bound weights (``SMALL_WEIGHT``), not on the 8B's. skinny_gemm_h200.json (6e058fb, Llama-3.1-8B's
    projections): geomean 0.92x / 0.97x / 0.96x / 0.62x / 0.81x cuBLAS at M = 4 / 8 / 16 / 33 / 64 (the odd
    shapes' single wins, the head at 8 and 16 rows, 1.03x, are within noise), and the bench's one-ulp check
    flags gate_up and the head at 33 rows and the head at 64, not diagnosed; so the 8B keeps cuBLAS."""
    if not MIN_ROWS <= M <= MAX_ROWS or N > MAX_SKINNY_N or VERIFY_GEMM == "0":
        return False
    return VERIFY_GEMM == "1" or N * K <= SMALL_WEIGHT


@triton.jit
def _x_tile(x_ptr, m_rows, stride_xm, k, k_ok, K, rstd, nw_ptr, MASKED: tl.constexpr, NORM: tl.constexpr,
            SILU: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    # The [BLOCK_K, BLOCK_M] tile of x^T the MMA takes, after the prologue: SILU, x holds [gate | up] (2K
    # features) and the tile is silu(gate) * up in fp32, rounded once (as inductor's fused silu_mul rounds);
    # NORM, it is rms_norm(x) with the rows' 1/rms in ``rstd``: x * rstd in fp32 rounded to x's dtype, times
    # the weight in that dtype, rounded again (models/llama.py's rms_norm, compiled).
    dt = x_ptr.dtype.element_ty
    ptrs = x_ptr + m_rows[None, :] * stride_xm + k[:, None]
    if SILU:
        g = _load(ptrs, k_ok[:, None], MASKED).to(tl.float32)
        u = _load(ptrs + K, k_ok[:, None], MASKED).to(tl.float32)
        xt = (g / (1.0 + tl.exp(-g)) * u).to(dt)
    elif NORM:
        xf = _load(ptrs, k_ok[:, None], MASKED).to(tl.float32)
        nw = _load(nw_ptr + k, k_ok, MASKED).to(tl.float32)
        xt = ((xf * rstd[None, :]).to(dt).to(tl.float32) * nw[:, None]).to(dt)
    else:
        xt = _load(ptrs, k_ok[:, None], MASKED)
    if UPCAST:  # the interpreter's bf16 dot is not reliable: multiply in fp32 there
        xt = xt.to(tl.float32)
    return xt


@triton.jit
def _load(ptrs, ok, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=ok, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _w_tile(w_rows, k, k_ok, MASKED: tl.constexpr, UPCAST: tl.constexpr):
    if MASKED:
        w = tl.load(w_rows + k[None, :], mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
    else:
        w = tl.load(w_rows + k[None, :], eviction_policy="evict_first")
    if UPCAST:
        w = w.to(tl.float32)
    return w


@triton.jit
def _epilogue(acc, y_ptr, stride_ym, rows, ms, out_mask, b_ptr, res_ptr, stride_rm, n_ok,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):  # fmt: skip
    # Bias in fp32, one rounding to y's dtype; HAS_RES then adds the residual's row and rounds again (the
    # unfused ``residual + linear(x)``, bit for bit, given the same linear output).
    dt = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    y = acc.to(dt)
    if HAS_RES:
        r = tl.load(res_ptr + ms[None, :] * stride_rm + rows[:, None], mask=out_mask, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
    tl.store(y_ptr + ms[None, :] * stride_ym + rows[:, None], y, mask=out_mask)


@triton.jit(do_not_specialize=["M", "split_k"])
def _skinny_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    counter_ptr,
    res_ptr,
    nw_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_rm,
    split_k,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    NORM: tl.constexpr = False,
    SILU: tl.constexpr = False,
    HAS_RES: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    # NORM / SILU: the prologue ``_x_tile`` applies to every x tile (NORM first sums each row's squares over
    # all of K, a pass over x, which is a few KB to a few hundred and cache-resident); HAS_RES: the residual
    # epilogue. USE_PDL (kernels/pdl.py): the first W tile is loaded before the wait for the kernel that wrote
    # x, so a launch-bound verify pass overlaps each GEMM's weight fetch with the kernel before it; that step
    # is peeled off the loop (the same products in the same order).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rows < N
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    m_rows = tl.minimum(ms, M - 1)
    ks = tl.arange(0, BLOCK_K)
    k_steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_steps, split_k)
    s0 = pid_k * per_split
    s1 = tl.minimum(s0 + per_split, k_steps)
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_wn
    # The peeled step is masked to this split's range (a last split may have no steps at all).
    k = s0 * BLOCK_K + ks
    k_ok = k < tl.minimum(K, s1 * BLOCK_K)
    w = _w_tile(w_rows, k, k_ok, True, UPCAST)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            xf = tl.load(x_ptr + m_rows[None, :] * stride_xm + kk[:, None], mask=(kk < K)[:, None], other=0.0)
            xf = xf.to(tl.float32)
            ss += tl.sum(xf * xf, axis=0)
        rstd = tl.math.rsqrt(ss / K + eps)
    xt = _x_tile(x_ptr, m_rows, stride_xm, k, k_ok, K, rstd, nw_ptr, True, NORM, SILU, UPCAST)
    acc = tl.dot(w, xt, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32))
    for s in range(s0 + 1, s1):
        k = s * BLOCK_K + ks
        k_ok = k < K
        w = _w_tile(w_rows, k, k_ok, not EVEN_K, UPCAST)
        xt = _x_tile(x_ptr, m_rows, stride_xm, k, k_ok, K, rstd, nw_ptr, not EVEN_K, NORM, SILU, UPCAST)
        acc = tl.dot(w, xt, acc)

    out_mask = n_ok[:, None] & m_ok[None, :]
    if split_k == 1:
        _epilogue(acc, y_ptr, stride_ym, rows, ms, out_mask, b_ptr, res_ptr, stride_rm, n_ok, HAS_BIAS, HAS_RES)
    else:
        plane = N * M  # partial s of the [split_k, M, N] workspace starts at s * plane
        part = part_ptr + ms[None, :] * N + rows[:, None]
        tl.store(part + pid_k.to(tl.int64) * plane, acc, mask=out_mask)
        # Every thread's partial is stored before one thread takes the ticket (a CTA barrier), and the
        # ticket is acquire-release, so the last program to arrive sees every partial.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
        if arrived == split_k - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for p in range(0, split_k):  # split order: the sum does not depend on arrival order
                total += tl.load(part + p * plane, mask=out_mask, other=0.0, cache_modifier=".cg")
            _epilogue(total, y_ptr, stride_ym, rows, ms, out_mask, b_ptr, res_ptr, stride_rm, n_ok, HAS_BIAS,
                      HAS_RES)  # fmt: skip
            tl.atomic_xchg(counter_ptr + pid_n, 0)


# TRITON_INTERPRET=1 counts only if it was set before triton was imported: ask the kernel.
INTERPRETED = isinstance(_skinny_kernel, InterpretedFunction)


def _launchable(kernel):
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


def new_counters(device) -> torch.Tensor:
    """A zeroed counters buffer for one layer's split-K launches (the kernel leaves it zero)."""
    return torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    *,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """``x [..., K]`` (2 to 64 rows in all) times ``weight [N, K]``^T (+ ``bias [N]``) -> ``[..., N]`` in x's
    dtype. ``counters`` (``new_counters``) is needed when the config splits K. Runs on the GPU or in the
    Triton interpreter.

    The fused prologues and epilogue of a verify layer (as ``gemv.gemv``'s at one row): ``silu``, x has 2K
    features and each row is ``silu_mul(x)``; ``norm`` (a [K] weight, with ``eps``), each row is
    ``rms_norm(x, norm, eps)``; ``residual`` ([..., N]), the result is ``residual + y``. Each rounds where
    the unfused ops (``models/llama.py``, compiled) round."""
    if norm is not None and silu:
        raise ValueError("skinny_gemm takes one prologue: norm or silu, not both")
    K = x.shape[-1] // 2 if silu else x.shape[-1]
    N = weight.shape[0]
    if weight.shape != (N, K) or (silu and x.shape[-1] != 2 * K):
        raise ValueError(f"weight {tuple(weight.shape)} does not take x with {x.shape[-1]} features (silu={silu})")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    M = x2.shape[0]
    if not MIN_ROWS <= M <= MAX_ROWS:
        raise ValueError(f"skinny_gemm takes {MIN_ROWS} to {MAX_ROWS} rows, got {M} (use F.linear)")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("weight must be contiguous along K")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}, expected ({N},)")
    if residual is not None:
        if residual.numel() != M * N or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype}, expected {M}x{N} of {x.dtype}")
        residual = residual.reshape(M, N).contiguous()
    if norm is not None and (norm.shape != (K,) or norm.dtype != x.dtype):
        raise ValueError(f"norm weight {tuple(norm.shape)} {norm.dtype}, expected ({K},) {x.dtype}")
    cfg = config or pick_config(M, N, K)
    tiles = triton.cdiv(N, cfg.block_n)
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if cfg.split_k > 1:
        if counters is None or counters.numel() < tiles:
            raise ValueError(f"split-K over {tiles} tiles needs a counters buffer of at least {tiles} slots")
        part = torch.empty((cfg.split_k, M, N), device=x.device, dtype=torch.float32)
    else:  # unused, but typed as the kernel expects (one compiled variant)
        part = torch.empty(1, device=x.device, dtype=torch.float32)
        if counters is None:
            counters = torch.empty(1, device=x.device, dtype=torch.int32)
    pdl = uses_pdl(x2, INTERPRETED)
    # The PDL launch needs the raw kernel (wrap_triton has no launch attribute); it runs inside the opaque op.
    kernel = _skinny_kernel if pdl else _launchable(_skinny_kernel)
    kernel[(tiles, cfg.split_k)](
        x2,
        weight,
        bias if bias is not None else weight,  # unused without HAS_BIAS
        y,
        part,
        counters,
        residual if residual is not None else weight,  # unused without HAS_RES
        norm if norm is not None else weight,  # unused without NORM
        M,
        N,
        K,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        N,
        cfg.split_k,
        float(eps),
        BLOCK_M=block_m(M),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=K % cfg.block_k == 0,
        HAS_BIAS=bias is not None,
        UPCAST=INTERPRETED,
        NORM=norm is not None,
        SILU=silu,
        HAS_RES=residual is not None,
        USE_PDL=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    return y.reshape(*lead, N)


@torch.library.custom_op("specpilot::skinny_gemm", mutates_args=())
def _skinny_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    residual: torch.Tensor | None,
    norm: torch.Tensor | None,
    eps: float,
    silu: bool,
) -> torch.Tensor:
    # Opaque to torch.compile: the config is chosen here, in eager code, from static shapes, and the launch
    # may carry PDL's attribute (kernels/pdl.py). ``counters`` is scratch the launch returns to zero, so the op
    # mutates nothing a caller can observe (declaring it mutated would make the compiled graph copy the
    # buffer around every call).
    return skinny_gemm(x, weight, bias, counters, silu=silu, residual=residual, norm=norm, eps=eps)


@_skinny_op.register_fake
def _(x, weight, bias, counters, residual, norm, eps, silu):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    *,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
):
    """``skinny_gemm`` with ``pick_config``'s tile (and its prologue / epilogue), as one op a compiled graph
    calls (``models/linear.py``)."""
    return _skinny_op(x, weight, bias, counters, residual, norm, float(eps), silu)


def skinny_gemm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu: bool = False,
    residual: torch.Tensor | None = None,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """The reference: the prologue as the unfused ops compute it, then fp32 products and sums, one rounding to
    x's dtype, then the residual add (``gemv.gemv_ref``'s, which does the same for any row count)."""
    return gemv_ref(x, weight, bias, silu=silu, residual=residual, norm=norm, eps=eps)
