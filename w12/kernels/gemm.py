"""Exact-weight W12 GEMM: ``y[M, N] = x[M, K] @ W^T (+ bias)`` straight from the planes, for decode-time M.

The idea. Small-M GEMMs on an H200 are weight-read bound (cuBLAS BF16 time is flat from M=1 to 32), so
reading 1.5 bytes per weight instead of 2 can make them up to 1.33x faster, if the decode fits the ~11
instructions per weight that the bandwidth leaves (``decode.py`` spends ~3; a whole K-step of the sm_90
build is 4.6-6 per weight, ``config.py``). A program owns BLOCK_N weight
rows and one tile of BLOCK_M activation rows (all M <= 64 in one tile, so each weight is read once), and
walks its share of K in BLOCK_K steps:

* load BLOCK_N x BLOCK_K/4 quads of the hi plane (int32) and the lo plane (int16), evict-first (they are
  streamed once; L2 is better spent on x);
* decode them in registers into BF16 pairs (inline PTX on the GPU, plain ``tl`` in the interpreter): no
  decoded copy of W exists anywhere, and escape slots decode to the row's placeholder like any weight;
* fp32 FMAs (the default at M = 1, up to 4 rows): ``acc[n, m, q] += w[n, 4q+i] * x[m, 4q+i]`` over the
  four weights of a quad (one op turns a BF16 of a pair into fp32), reduced over q once after the loop;
* or tensor cores (the default from M = 2): the weights are the MMA's A operand (BLOCK_N on its M side,
  activations padded to 16 on its N side), two dots per step: the even and the odd columns of the tile
  (``decode.py``). Triton stages the planes through shared memory with cp.async (``num_stages``).

Then the epilogue adds the escapes' corrections (``escapes.py``: sorted by row, no atomics), the bias,
rounds to BF16 and stores. Small grids split K (``split_k``): every split stores an fp32 partial, bumps a
per-tile counter, and the last one to arrive sums the partials in split order (so the result does not
depend on arrival order), writes y and resets the counter to 0 for the next call. The counters live in a
small int32 buffer that must start at 0 (``W12Linear`` owns one; the launcher keeps one per device for
other callers: do not run two split-K GEMMs that share a buffer concurrently on different streams).

Tolerance against decode-then-matmul in fp32 (``gemm_tolerance``):

    |y - y_ref| <= 2^-8 |y_ref| + K 2^-22 sum_k |x[m, k]| |W_hat[n, k]|

where y_ref = ``x.float() @ decode_reference(W).float().T`` and W_hat is W with ``max(|v|, placeholder)`` in
escape slots. 2^-8 is the unit roundoff of the BF16 output; the second term is the worst-case fp32
summation error of a K-term dot product in another order (K 2^-24, times 4 for the tensor cores'
truncating fp32 accumulation, split-K's extra additions and the escape terms' roundings). The same bound
holds for the 8-bit view against ``decode_view8_reference`` (``view8_gemm.py``).

``w12_gemm`` calls a ``torch.library.custom_op`` (``w12::gemm``), so ``torch.compile(fullgraph=True)`` keeps it
as one opaque node; it reads no tensor values on the host (CUDA-graph safe). On a plain CPU it runs the reference,
under TRITON_INTERPRET=1 the kernel in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from w12.format import W12Tensor, decode_reference, decode_view8_reference

from . import gemm_tc, mma
from .config import COUNTER_SLOTS, TC_MIN_M, GemmConfig, TcConfig, pick_config, tc_tuned_for
from .decode import (
    INTERPRETED,
    USE_ASM,
    _decode_exact,
    _decode_view8,
    _load_quads,
    _pair_hi_f32,
    _pair_lo_f32,
    _pairs_to_columns,
    _row_base2,
    _to_bf16,
    check_w12,
    quads_aligned,
)
from .escapes import _apply_escapes, escape_row_ptr, placeholder_values
from .mma import MmaConfig

# ---------------------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _load_x_lane(x_ptr, stride_xm, ms, m_ok, quads, i, K):
    # x[m, 4q + i] as fp32 [BLOCK_M, BLOCK_Q]: the i-th weight of every quad (strided, 8-byte steps).
    k = quads * 4 + i
    return tl.load(x_ptr + ms[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def _load_x_lane1(x_row, quads, i, K):
    # The same for one activation row, 1-D; broadcast with [None, :], the compiler moves it into the weights'
    # layout through a small shared-memory exchange. The sm_90 SASS per K-step, in instructions per weight:
    # 6.0 this way; 6.2 (and 32 barriers) loading x's tile contiguously and splitting it; 11.2 with a
    # [BLOCK_N, BLOCK_Q] broadcast load; 9.8 reducing over K every step instead of once after the loop.
    k = quads * 4 + i
    return tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)


@triton.jit
def _load_x_halves(
    x_ptr, stride_xm, ms, m_ok, kt, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr
):
    # The tile's even and odd columns of x, transposed for the MMA's B operand: [BLOCK_K / 2, BLOCK_M] each.
    ks = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    xt = tl.load(x_ptr + ms[:, None] * stride_xm + ks[None, :], mask=m_ok[:, None] & (ks < K)[None, :], other=0.0)
    if UPCAST:
        xt = xt.to(tl.float32)
    x_even, x_odd = tl.split(xt.reshape(BLOCK_M, BLOCK_K // 2, 2))
    return tl.trans(x_even), tl.trans(x_odd)


@triton.jit
def _w12_gemm_kernel(
    x_ptr,
    hi_ptr,
    lo_ptr,
    base_ptr,
    esc_idx_ptr,
    esc_val_ptr,
    esc_row_ptr,
    bias_ptr,
    y_ptr,
    part_ptr,
    counter_ptr,
    M,
    N,
    K,
    K2,
    Q,
    stride_xm,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    VIEW8: tl.constexpr,
    ALIGNED: tl.constexpr,
    EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_ASM: tl.constexpr,
    UPCAST: tl.constexpr,
    UPCAST_OUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ESC_PRECISION: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_K // 4
    # -- program id -> (weight rows, K split, activation rows) ---------------------------------------------
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    m0 = pid_m * BLOCK_M
    rows = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)  # N * K / 4 can pass 2**31 quads in a big LM head
    ms = m0 + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    base2 = _row_base2(base_ptr, rows, N, VIEW8)

    # -- this split's K tiles --------------------------------------------------------------------------------
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_k * per_split
    kt1 = tl.minimum(kt0 + per_split, k_tiles)

    # -- the K loop: load quads, decode in registers, multiply-accumulate ------------------------------------
    if USE_DOT:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_Q], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_N, BLOCK_M, BLOCK_Q], dtype=tl.float32)
    for kt in range(kt0, kt1):
        quads = kt * BLOCK_Q + tl.arange(0, BLOCK_Q)
        h, lw = _load_quads(hi_ptr, lo_ptr, rows, quads, N, K, K2, Q, BLOCK_N, BLOCK_Q, ALIGNED, not EVEN, not VIEW8)
        if VIEW8:
            we, wo = _decode_view8(h, base2, USE_ASM)
        else:
            we, wo = _decode_exact(h, lw, base2, USE_ASM)
        if USE_DOT:
            x_even, x_odd = _load_x_halves(x_ptr, stride_xm, ms, m_ok, kt, K, BLOCK_M, BLOCK_K, UPCAST)
            acc = tl.dot(_pairs_to_columns(we, BLOCK_N, BLOCK_Q, UPCAST), x_even, acc, input_precision=DOT_PRECISION)
            acc = tl.dot(_pairs_to_columns(wo, BLOCK_N, BLOCK_Q, UPCAST), x_odd, acc, input_precision=DOT_PRECISION)
        else:
            if BLOCK_M == 1:
                # One activation row: 1-D x lanes broadcast over the rows, a [BLOCK_N, BLOCK_Q] accumulator.
                x_row = x_ptr + m0 * stride_xm
                acc2 += _pair_lo_f32(we) * _load_x_lane1(x_row, quads, 0, K)[None, :]
                acc2 += _pair_lo_f32(wo) * _load_x_lane1(x_row, quads, 1, K)[None, :]
                acc2 += _pair_hi_f32(we) * _load_x_lane1(x_row, quads, 2, K)[None, :]
                acc2 += _pair_hi_f32(wo) * _load_x_lane1(x_row, quads, 3, K)[None, :]
            else:
                x0 = _load_x_lane(x_ptr, stride_xm, ms, m_ok, quads, 0, K)
                x1 = _load_x_lane(x_ptr, stride_xm, ms, m_ok, quads, 1, K)
                x2 = _load_x_lane(x_ptr, stride_xm, ms, m_ok, quads, 2, K)
                x3 = _load_x_lane(x_ptr, stride_xm, ms, m_ok, quads, 3, K)
                acc3 += _pair_lo_f32(we)[:, None, :] * x0[None, :, :]
                acc3 += _pair_lo_f32(wo)[:, None, :] * x1[None, :, :]
                acc3 += _pair_hi_f32(we)[:, None, :] * x2[None, :, :]
                acc3 += _pair_hi_f32(wo)[:, None, :] * x3[None, :, :]
    if not USE_DOT:
        if BLOCK_M == 1:
            acc = tl.sum(acc2, axis=1)[:, None]
        else:
            acc = tl.sum(acc3, axis=2)

    # -- epilogue: escapes (split 0 only), bias, BF16 store or split-K reduction -----------------------------
    if not VIEW8:
        acc = _apply_escapes(
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
            pid_k == 0,
            0,
            1,
            BLOCK_N,
            BLOCK_M,
            USE_DOT,
            ESC_PRECISION,
        )
    out_rows = n0 + tl.arange(0, BLOCK_N)
    n_ok = out_rows < N
    out_mask = n_ok[:, None] & m_ok[None, :]
    y_ptrs = y_ptr + ms.to(tl.int64)[None, :] * stride_ym + out_rows[:, None]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + out_rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, _to_bf16(acc, UPCAST_OUT), mask=out_mask)
    else:
        part = part_ptr + ms.to(tl.int64)[None, :] * N + out_rows[:, None]
        plane = N * M  # partial s of the [SPLIT_K, M, N] workspace starts at s * plane
        tl.store(part + pid_k.to(tl.int64) * plane, acc, mask=out_mask)
        tile = pid_m * tl.num_programs(0) + pid_n
        # One thread does the scalar atomic, so first a CTA barrier: every thread's partial store happens
        # before it. Release then publishes them with the count; acquire lets the last program see all.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            src = part
            for _ in tl.static_range(SPLIT_K):
                # .cg: read through L2, where the other SMs' partials are (L1 is not coherent).
                total += tl.load(src, mask=out_mask, other=0.0, cache_modifier=".cg")
                src += plane
            if HAS_BIAS:
                total += tl.load(bias_ptr + out_rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, _to_bf16(total, UPCAST_OUT), mask=out_mask)
            tl.atomic_xchg(counter_ptr + tile, 0)


# ---------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------


@torch.library.custom_op("w12::gemm", mutates_args=("counters",))
def _w12_gemm_op(
    x: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    view8: bool,
    block_n: int,
    block_k: int,
    split_k: int,
    use_dot: bool,
    num_warps: int,
    num_stages: int,
    use_asm: bool,
) -> torch.Tensor:
    # An opaque custom op, not a triton_op: inductor inlines a triton_op's kernel source into its generated
    # Python, and the inline PTX's multi-line string broke that file (SyntaxError, H200, torch 2.11). Host-side
    # choices (the config lookup and its caches) happen here, in eager code that dynamo never traces.
    M, K = x.shape
    N = hi.shape[0]
    if block_n == 0 and kernel_for(M, K, N=N, device=x.device, view8=view8) == "tc":
        # M = 1 on a shape where the tuned table says the tensor-core kernel is faster (decided here, in eager
        # code: the table lookup must not be traced by torch.compile).
        cfg = (0, 0, 1, 4, 3)
        return gemm_tc.run(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, cfg, use_asm, view8)
    if block_n == 0:
        cfg = pick_config(M, N, K, x.device, view8=view8)
    else:
        cfg = GemmConfig(block_n, block_k, split_k, use_dot, num_warps, num_stages)
    block_m = cfg.block_m(M)
    grid = (triton.cdiv(N, cfg.block_n), cfg.split_k, triton.cdiv(M, block_m))
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if cfg.split_k > 1:
        assert counters.numel() >= grid[0] * grid[2], f"split-K needs {grid[0] * grid[2]} counters"
        assert M * N < 2**31, "split-K partials are indexed in int32 planes of M * N"
        part = torch.empty((cfg.split_k, M, N), device=x.device, dtype=torch.float32)
    else:
        part = torch.empty(1, device=x.device, dtype=torch.float32)  # unused
    upcast = INTERPRETED and cfg.use_dot
    _w12_gemm_kernel[grid](
        x,
        hi,
        lo,
        base,
        esc_idx,
        esc_val,
        esc_row_ptr,
        bias if bias is not None else base,  # unused without HAS_BIAS
        y,
        part,
        counters,
        M,
        N,
        K,
        (K + 1) // 2,
        K // 4,
        x.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot,
        VIEW8=view8,
        ALIGNED=quads_aligned(hi, lo, K),
        EVEN=N % cfg.block_n == 0 and K % cfg.block_k == 0,
        HAS_BIAS=bias is not None,
        USE_ASM=use_asm,
        UPCAST=upcast,
        UPCAST_OUT=INTERPRETED,
        DOT_PRECISION="ieee" if upcast else "tf32",  # bf16 operands on the GPU: the precision does not apply
        ESC_PRECISION="ieee" if INTERPRETED else "tf32x3",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y


@_w12_gemm_op.register_fake
def _(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, view8, *config):
    return x.new_empty((x.shape[0], hi.shape[0]))


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def shared_counters(device: torch.device) -> torch.Tensor:
    """The launcher's own split-K counters on ``device`` (zeroed once; every launch leaves them at 0).

    Shared by every call that passes no ``counters``: fine on one stream, wrong for two split-K GEMMs
    running at once on two streams (give each its own buffer, as ``W12Linear`` does).
    """
    device = torch.device(device)
    buf = _COUNTERS.get(device)
    if buf is None:
        buf = _COUNTERS[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return buf


def launch(
    x: torch.Tensor,
    w: W12Tensor,
    bias: torch.Tensor | None,
    *,
    view8: bool,
    esc_row_ptr: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    use_asm: bool | None = None,
    backend: str = "auto",
    mma_config: MmaConfig | None = None,
    tc_config: TcConfig | None = None,
    x_split: bool | None = None,
) -> torch.Tensor:
    """Shared launcher of ``w12_gemm`` and ``w12_view8_gemm``: checks, then one kernel (``kernel_for``): the
    quad Triton op ``w12::gemm`` (backend "triton"), the tensor-core Triton op ``w12::tc_gemm`` (backend
    "tc"), or the CUDA kernel (``mma.py``, backend "cuda"); "auto" picks per M bucket."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: one of {', '.join(BACKENDS)}")
    check_w12(w)
    N, K = w.shape
    assert x.shape[-1] == K, f"x has {x.shape[-1]} features, W12 weight [N, K] = {tuple(w.shape)}"
    assert x.dtype == torch.bfloat16, f"x must be bfloat16, got {x.dtype}"
    assert x.device == w.hi.device, f"x on {x.device}, weights on {w.hi.device}"
    if bias is not None:
        assert bias.shape == (N,), f"bias: [{N}]"
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.shape[0] == 0 or N == 0 or K == 0:
        y = torch.zeros((x2.shape[0], N), device=x.device, dtype=x.dtype)
        return (y + bias if bias is not None else y).reshape(*lead, N)
    esc_idx, esc_val = w.esc_idx, w.esc_val
    if view8 or esc_idx.numel() == 0:
        # Nothing to apply: an all-zero row pointer keeps the escape loop empty (and no pointer is empty).
        esc_row_ptr = torch.zeros(N + 1, dtype=torch.int32, device=x.device)
        esc_idx = torch.zeros(1, dtype=torch.int64, device=x.device)
        esc_val = torch.zeros(1, dtype=torch.bfloat16, device=x.device)
    elif esc_row_ptr is None:
        esc_row_ptr = escape_row_ptr(w)
    assert esc_row_ptr.shape == (N + 1,) and esc_row_ptr.dtype == torch.int32, "esc_row_ptr: int32 [N + 1]"
    if counters is None:
        counters = shared_counters(x.device)
    assert counters.dtype == torch.int32, "counters: int32"
    hi, lo = w.hi.contiguous(), w.lo.contiguous()
    # Static choice here (this code is traced by torch.compile); the M = 1 table check happens in the quad op.
    kernel = kernel_for(x2.shape[0], K, view8=view8, backend=backend, config=config, tc_config=tc_config)
    if kernel == "tc":
        y = gemm_tc.tc_gemm(
            x2, hi, lo, w.base, esc_idx, esc_val, esc_row_ptr, bias, counters, tc_config, use_asm, view8=view8,
            x_split=x_split,
        )  # fmt: skip
        return y.reshape(*lead, N)
    # "auto" is Triton: on the H200 (2026-11-29, Llama-3.1-8B projections) the CUDA kernel measured 0.58-1.22x
    # cuBLAS at M = 1 and 0.35-0.48x at M = 32, the Triton FMA kernel 1.00-1.25x at M = 1 (see the README).
    if backend == "cuda":
        if not mma.supports(K):
            raise ValueError(f"the CUDA W12 GEMM needs K % 64 == 0 and 16-byte aligned rows (K = {K})")
        y = mma.mma_gemm(x2, hi, lo, w.base, esc_idx, esc_val, esc_row_ptr, bias, counters, view8, mma_config)
        return y.reshape(*lead, N)
    # block_n = 0 asks the op to pick the config itself, from static shapes (config.pick_config).
    c = (0, 0, 1, False, 4, 2) if config is None else config.op_args()
    y = _w12_gemm_op(
        x2,
        hi,
        lo,
        w.base,
        esc_idx,
        esc_val,
        esc_row_ptr,
        bias,
        counters,
        view8,
        *c,
        USE_ASM if use_asm is None else use_asm,
    )
    return y.reshape(*lead, N)


BACKENDS = ("auto", "triton", "tc", "cuda")


def kernel_for(
    M: int,
    K: int,
    *,
    N: int | None = None,
    device: torch.device | None = None,
    view8: bool = False,
    backend: str = "auto",
    config: GemmConfig | None = None,
    tc_config: TcConfig | None = None,
) -> str:
    """Which kernel a launch runs: "tc" (``gemm_tc.py``), "quad" (this file's) or "cuda" (``mma.py``).

    "auto": the tensor-core kernel for exact weights at M >= ``config.TC_MIN_M`` with an even K (verify
    passes: chains and trees); at M = 1 the quad kernel (its fp32 FMAs measured 1.0-1.25x cuBLAS on the
    H200) unless, given ``N`` and ``device``, the device's tuned table has an M = 1 entry for (N, K) or a
    nearest shape (the benchmark's sweep writes one only where the tensor-core kernel was faster; the
    launcher asks this inside its op, untraced). The 8-bit view follows the same rule (its table entries are
    keyed "tc8_.."). An explicit ``config`` (a quad ``GemmConfig``) or ``tc_config`` decides instead.
    """
    if backend == "cuda":
        return "cuda"
    if tc_config is not None or backend == "tc":
        if not gemm_tc.supports(K):
            raise ValueError(f"the tensor-core W12 GEMM needs an even K (K = {K})")
        return "tc"
    if backend == "triton" or config is not None:
        return "quad"
    if not gemm_tc.supports(K):
        return "quad"
    if M >= TC_MIN_M:
        return "tc"
    known = N is not None and device is not None and tc_tuned_for(M, N, K, device, view8=view8)
    return "tc" if known else "quad"


def w12_gemm(
    x: torch.Tensor,
    w: W12Tensor,
    bias: torch.Tensor | None = None,
    *,
    esc_row_ptr: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    use_asm: bool | None = None,
    backend: str = "auto",
    mma_config: MmaConfig | None = None,
    tc_config: TcConfig | None = None,
    x_split: bool | None = None,
) -> torch.Tensor:
    """Exact-weight GEMM ``y = x @ W^T + bias`` with W decoded in registers from its W12 planes.

    Parameters
    ----------
    x : [..., K] bfloat16 (any leading shape; M = their product, best for M <= 64)
    w : W12Tensor [N, K] on x's device
    bias : [N] (bf16 or fp32), optional; added in fp32 before the BF16 rounding
    esc_row_ptr : int32 [N + 1], ``escape_row_ptr(w)``; computed per call if None (cache it)
    counters : int32 zeros for split-K, one per tile (1024 cover any split launch); left at 0 afterwards.
        None: the launcher's own buffer (``shared_counters``: not for concurrent streams)
    config : a quad-kernel launch configuration (runs the quad kernel); None: ``kernel_for`` picks the kernel
        and the kernel's own lookup its config (tuned table, else formula)
    use_asm : inline-PTX decode (True) or plain tl (False); default PTX on the GPU
    backend : "auto" (per M: the quad kernel at M = 1, the tensor-core kernel ``gemm_tc`` from M = 2, see
        ``kernel_for``), "triton" (the quad kernel), "tc" (the tensor-core kernel, even K), or "cuda"
        (``mma.py``, K % 64 == 0)
    mma_config : launch shape of the CUDA kernel (None: its heuristic)
    tc_config : launch configuration of the tensor-core kernel (runs it; None: ``config.pick_tc_config``)
    x_split : the tensor-core kernel's pre-split activations (``gemm_tc.split_x``; None: its default)

    Returns
    -------
    y : [..., N] bfloat16, fp32-accumulated; within ``gemm_tolerance`` of ``w12_gemm_ref(.., fp32)``
    """
    if x.device.type == "cpu" and not INTERPRETED:
        return w12_gemm_ref(x, w, bias)
    return launch(
        x, w, bias, view8=False, esc_row_ptr=esc_row_ptr, counters=counters, config=config, use_asm=use_asm,
        backend=backend, mma_config=mma_config, tc_config=tc_config, x_split=x_split,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Reference and tolerance
# ---------------------------------------------------------------------------------------------------------


def w12_gemm_ref(
    x: torch.Tensor, w: W12Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Decode, then matmul in fp32: ``x.float() @ decode_reference(w).float().T (+ bias)``, cast to
    ``out_dtype`` (default x's dtype)."""
    y = x.float() @ decode_reference(w).float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)


def gemm_tolerance(x: torch.Tensor, w: W12Tensor, y_ref: torch.Tensor, *, view8: bool = False) -> torch.Tensor:
    """Per-element bound on ``|y - y_ref|`` (see the module doc): ``2^-8 |y_ref| + K 2^-22 |x| @ |W_hat|^T``.

    ``y_ref`` is the fp32 reference (``w12_gemm_ref(.., out_dtype=torch.float32)``, or the view8 one). For
    ``view8`` W_hat is the 8-bit view itself (escapes play no part).
    """
    N, K = w.shape
    wd = (decode_view8_reference(w) if view8 else decode_reference(w)).float().abs()
    if not view8 and w.esc_idx.numel():
        flat = wd.view(-1)
        p = placeholder_values(w.base)[w.esc_idx // K].abs()
        flat[w.esc_idx] = torch.maximum(flat[w.esc_idx], p)
    s = x.float().abs() @ wd.T
    return 2.0**-8 * y_ref.float().abs() + K * 2.0**-22 * s
