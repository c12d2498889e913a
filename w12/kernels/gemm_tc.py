"""Exact-weight W12 GEMM on the tensor cores for verify-sized M (2 .. 64 rows): ``y = x @ W^T (+ bias)``.

The idea. From M = 2 on, the quad kernel (``gemm.py``) pays for its register-level quad decode twice: the
decoded pairs are joined, reshaped and moved into the MMA layout every K step, and the x tile is split
and transposed the same way (0.36-0.60x cuBLAS at M = 2..64 on the H200, 2026-11-29). Here the decode is written so
that every op between the plane loads and ``tl.dot`` is elementwise on one [BLOCK_N, BLOCK_C] tile, with
BLOCK_C = BLOCK_K / 2 *pairs* of weights per row:

    h16[n, c] = hi[n, 2c] | hi[n, 2c + 1] << 8      the hi plane read as uint16 [N, K/2]
    l8[n, c]  = lo[n, c]                            nibbles of k = 2c (low) and 2c + 1 (high)

    W[n, 2c]     = (h16 << 8 & 0x8000 | h16 << 4 & 0x07F0 | l8 & 0xF) + (base[n] << 7)     "even"
    W[n, 2c + 1] = (h16      & 0x8000 | h16 >> 4 & 0x07F0 | l8 >> 4 ) + (base[n] << 7)     "odd"

(``format.py``: bit 7 of a hi byte is the sign, bits 6..0 the exponent offset and top mantissa bits; an
in-window exponent never carries into the sign, base <= 240). The even and the odd weights are two
[BLOCK_N, BLOCK_C] BF16 operands, multiplied by x's even and odd columns (x read as uint32 pairs
[BLOCK_C, BLOCK_M], split by a shift): ``acc += W_even @ x_even + W_odd @ x_odd``. Weights are the MMA's
A operand (BLOCK_N on wgmma's 64-row side), the activations its B (M padded to 16, 32 or 64), so the
planes are staged through shared memory by Triton's cp.async pipeline (``num_stages``) and, the chain
being elementwise, decoded in the operand's own register layout (``decode.EXACT_QUAD_PTX``: 4.9 SASS
instructions per weight for the whole K-step of the sm_90 build, 64 x 256 tiles at M = 16, against ~11.6
that 4.3 TB/s leaves): no decoded copy of W exists anywhere, not even in shared memory.

Escapes: an escape slot holds code 0 in both planes, which decodes to the row's placeholder; the epilogue
adds ``x[m, k] (v - p[n])`` per escape (``escapes.py``: sorted by row, one-hot tensor-core dots, a per-escape
path for inf/NaN; never a branch in the K loop), its chunks of 16 escapes spread over the splits. Split-K
(``split_k``, a run-time argument, so trying splits compiles nothing): every split writes an fp32 partial,
bumps a per-tile counter, and the last to arrive sums the partials in split order (deterministic), adds the
bias, stores BF16 and resets the counter.
Same tolerance as every W12 GEMM (``gemm.gemm_tolerance``).

Needs an even K (the uint16 view of hi); odd K goes to the quad kernel (``gemm.launch`` decides). In the
interpreter, operands are upcast to fp32 (its bf16 ``tl.dot`` multiplies raw bit patterns).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .config import TcConfig, pick_tc_config
from .decode import _EXACT_QUAD_PTX, _VIEW8_PTX, INTERPRETED, USE_ASM, _to_bf16
from .escapes import _apply_escapes


@triton.jit
def _decode_pairs(h, lo, b7, USE_ASM: tl.constexpr):
    # h uint16 [BN, BC], lo uint8 [BN, BC], b7 uint16 [BN, 1] (base << 7) -> (even, odd) uint16 BF16 patterns.
    if USE_ASM:
        # decode.py's EXACT_QUAD_PTX, elementwise over packs of 2: Triton packs 2 consecutive elements (in the
        # thread's register order) as h -> $2, lo -> $3 (16 bits), b7 -> $4; out even -> $0, odd -> $1.
        # Element j of a register is its j-th 16-bit half (j-th byte of lo), and the PTX treats each half on
        # its own (module doc of decode.py), so any layout Triton picks is correct: per element, even =
        # W[n, 2c] and odd = W[n, 2c + 1]. (Where the two are c, c + 1 of one row, as in wgmma's operand
        # layout, $2 is a quad of hi and $0 / $1 are decode.py's we / wo.)
        even, odd = tl.inline_asm_elementwise(
            _EXACT_QUAD_PTX,
            "=r,=r,r,h,r",
            [h, lo, b7.broadcast_to(h.shape)],
            dtype=(tl.uint16, tl.uint16),
            is_pure=True,
            pack=2,
        )
        return even, odd
    h = h.to(tl.int32)
    lo = lo.to(tl.int32)
    b7 = b7.to(tl.int32)
    even = (((h << 8) & 0x8000) | ((h << 4) & 0x07F0) | (lo & 0xF)) + b7
    odd = ((h & 0x8000) | ((h >> 4) & 0x07F0) | (lo >> 4)) + b7
    return even.to(tl.uint16), odd.to(tl.uint16)


@triton.jit
def _decode_pairs_view8(h, b7v, USE_ASM: tl.constexpr):
    # The 8-bit view: hi alone, b7v = base << 7 plus the 1000b low mantissa (decode.py's VIEW8_PTX, same packs).
    if USE_ASM:
        even, odd = tl.inline_asm_elementwise(
            _VIEW8_PTX,
            "=r,=r,=r,=r,r,r,r,r",
            [h, b7v.broadcast_to(h.shape)],
            dtype=(tl.uint16, tl.uint16),
            is_pure=True,
            pack=4,
        )
        return even, odd
    h = h.to(tl.int32)
    b7v = b7v.to(tl.int32)
    even = (((h << 8) & 0x8000) | ((h << 4) & 0x07F0)) + b7v
    odd = ((h & 0x8000) | ((h >> 4) & 0x07F0)) + b7v
    return even.to(tl.uint16), odd.to(tl.uint16)


@triton.jit
def _bits_to_operand(bits, UPCAST: tl.constexpr):
    # uint16 BF16 patterns -> the MMA operand (bf16; fp32 in the interpreter).
    if UPCAST:
        return (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.bfloat16, bitcast=True)


# M and split_k vary per call and shape; not specializing them (on 1 or multiples of 16) keeps the variants
# one per tile shape and M bucket, so the benchmark's sweep compiles ~15 kernels, not ~40.
@triton.jit(do_not_specialize=["M", "split_k"])
def _w12_tc_kernel(
    x_ptr,  # bf16 [M, K], read as uint32 pairs (stride_xm even, 4-byte aligned); the escapes read it always
    xs_ptr,  # X_SPLIT: bf16 [2, M, C], x's even columns then its odd ones (``split_x``); else unused
    hi_ptr,  # uint8 [N, K], read as uint16 [N, C]
    lo_ptr,  # uint8 [N, C]
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
    C,  # K / 2: weight pairs per row
    stride_xm,
    stride_ym,
    split_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    VIEW8: tl.constexpr,
    USE_ASM: tl.constexpr,
    UPCAST: tl.constexpr,
    UPCAST_OUT: tl.constexpr,
    ESC_PRECISION: tl.constexpr,
    X_SPLIT: tl.constexpr,
):
    # -- program id -> (weight rows, K split, activation rows) ---------------------------------------------
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    m0 = pid_m * BLOCK_M
    rows = n0 + tl.arange(0, BLOCK_N)
    n_ok = rows < N
    ms = m0 + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    b7 = (tl.load(base_ptr + rows, mask=n_ok, other=0).to(tl.uint16) << 7)[:, None]
    if VIEW8:
        b7 = b7 + 8  # the 1000b fill of the four dropped mantissa bits

    # -- pointers: planes [BLOCK_N, BLOCK_C], x pairs [BLOCK_C, BLOCK_M] -------------------------------------
    cs = tl.arange(0, BLOCK_C)
    plane_offs = rows.to(tl.int64)[:, None] * C + cs[None, :]  # N * K / 2 passes 2**31 in a big LM head
    hi16 = hi_ptr.to(tl.pointer_type(tl.uint16)) + plane_offs
    lo8 = lo_ptr + plane_offs
    x32 = x_ptr.to(tl.pointer_type(tl.uint32)) + ms[None, :] * (stride_xm // 2) + cs[:, None]
    # X_SPLIT: the two operand tiles [BLOCK_M, BLOCK_C] of the even and the odd columns, loaded as they are and
    # fed to wgmma from the pipeline's shared-memory buffers (see ``split_x``).
    xe = xs_ptr + ms[:, None] * C + cs[None, :]  # int32: the launcher keeps M * K below 2**31
    xo = xe + M * C

    # -- this split's K tiles --------------------------------------------------------------------------------
    c_tiles = tl.cdiv(C, BLOCK_C)
    per_split = tl.cdiv(c_tiles, split_k)
    ct0 = pid_k * per_split
    ct1 = tl.minimum(ct0 + per_split, c_tiles)
    hi16 += ct0 * BLOCK_C
    lo8 += ct0 * BLOCK_C
    x32 += ct0 * BLOCK_C
    xe += ct0 * BLOCK_C
    xo += ct0 * BLOCK_C

    # -- the K loop: stream the planes, decode elementwise, two MMAs -----------------------------------------
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # X_SPLIT: the odd columns' own accumulator
    for ct in range(ct0, ct1):
        if EVEN_N and EVEN_C:
            h = tl.load(hi16, eviction_policy="evict_first")
            if not VIEW8:
                lo = tl.load(lo8, eviction_policy="evict_first")
        else:
            w_ok = n_ok[:, None] & (cs[None, :] < C - ct * BLOCK_C)
            h = tl.load(hi16, mask=w_ok, other=0, eviction_policy="evict_first")
            if not VIEW8:
                lo = tl.load(lo8, mask=w_ok, other=0, eviction_policy="evict_first")
        if X_SPLIT:
            if EVEN_C:
                x_ok = m_ok[:, None]
            else:
                x_ok = m_ok[:, None] & (cs[None, :] < C - ct * BLOCK_C)
            x_even = tl.trans(tl.load(xe, mask=x_ok, other=0.0))
            x_odd = tl.trans(tl.load(xo, mask=x_ok, other=0.0))
            if UPCAST:
                x_even = x_even.to(tl.float32)
                x_odd = x_odd.to(tl.float32)
        else:
            if EVEN_C:
                xp = tl.load(x32, mask=m_ok[None, :], other=0)
            else:
                xp = tl.load(x32, mask=m_ok[None, :] & (cs[:, None] < C - ct * BLOCK_C), other=0)
            x_even = _bits_to_operand((xp & 0xFFFF).to(tl.uint16), UPCAST)
            x_odd = _bits_to_operand((xp >> 16).to(tl.uint16), UPCAST)
        if VIEW8:
            w_even, w_odd = _decode_pairs_view8(h, b7, USE_ASM)
        else:
            w_even, w_odd = _decode_pairs(h, lo, b7, USE_ASM)
        acc = tl.dot(_bits_to_operand(w_even, UPCAST), x_even, acc)
        if X_SPLIT:
            acc_o = tl.dot(_bits_to_operand(w_odd, UPCAST), x_odd, acc_o)
        else:
            acc = tl.dot(_bits_to_operand(w_odd, UPCAST), x_odd, acc)
        hi16 += BLOCK_C
        lo8 += BLOCK_C
        x32 += BLOCK_C
        xe += BLOCK_C
        xo += BLOCK_C

    if X_SPLIT:
        acc += acc_o
    # -- epilogue: escapes (split s takes chunks s, s + split_k, ..), bias, BF16 store or the split-K sum -----
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
            True,
            pid_k,
            split_k,
            BLOCK_N,
            BLOCK_M,
            True,
            ESC_PRECISION,
        )
    out_mask = n_ok[:, None] & m_ok[None, :]
    y_ptrs = y_ptr + ms.to(tl.int64)[None, :] * stride_ym + rows[:, None]
    if split_k == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, _to_bf16(acc, UPCAST_OUT), mask=out_mask)
    else:
        plane = N * M  # partial s of the [split_k, M, N] workspace starts at s * plane
        part = part_ptr + ms.to(tl.int64)[None, :] * N + rows[:, None]
        tl.store(part + pid_k.to(tl.int64) * plane, acc, mask=out_mask)
        tile = pid_m * tl.num_programs(0) + pid_n
        # A CTA barrier first (one thread does the scalar atomic), then release/acquire: the last program to
        # arrive sees every partial (gemm.py does the same).
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if arrived == split_k - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(0, split_k):  # split order: the sum does not depend on arrival order
                total += tl.load(part + s * plane, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, _to_bf16(total, UPCAST_OUT), mask=out_mask)
            tl.atomic_xchg(counter_ptr + tile, 0)


def supports(K: int) -> bool:
    """Shapes this kernel takes: an even K (hi is read as uint16 pairs)."""
    return K % 2 == 0


@torch.library.custom_op("w12::tc_gemm", mutates_args=("counters",))
def _w12_tc_gemm_op(
    x: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    xs: torch.Tensor | None,
    view8: bool,
    block_n: int,
    block_k: int,
    split_k: int,
    num_warps: int,
    num_stages: int,
    use_asm: bool,
) -> torch.Tensor:
    # Opaque custom op, as gemm.py's: the config lookup happens in run(), in eager code. ``xs`` is made
    # outside it (``tc_gemm``), in traced code, so that a compiled model fuses the split into x's producer.
    cfg = (block_n, block_k, split_k, num_warps, num_stages)
    return run(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, cfg, use_asm, view8, xs)


def run(
    x: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    config: tuple[int, int, int, int, int],
    use_asm: bool,
    view8: bool = False,
    xs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The body of the ``w12::tc_gemm`` op (eager; ``gemm.py``'s op calls it too): ``config`` holds
    ``TcConfig.op_args()``, or block_n = 0 for ``pick_tc_config``'s choice; ``view8``: the 8-bit view (lo and
    the escapes are not read); ``xs``: ``split_x(x)``, which selects the X_SPLIT operand path."""
    block_n, block_k, split_k, num_warps, num_stages = config
    if x.stride(0) % 2 or x.data_ptr() % 4:  # x is read as uint32 pairs
        x = torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)  # fresh: aligned rows
    if hi.data_ptr() % 2:  # hi as uint16
        hi = hi.clone()
    M, K = x.shape
    N = hi.shape[0]
    if xs is not None:
        assert xs.shape == (2, M, K // 2) and xs.is_contiguous() and M * K < 2**31, "xs: split_x(x)"
    if block_n == 0:
        cfg = pick_tc_config(M, N, K, x.device, view8=view8)
    else:
        cfg = TcConfig(block_n, block_k, split_k, num_warps, num_stages)
    block_m = cfg.block_m(M)
    grid = (triton.cdiv(N, cfg.block_n), cfg.split_k, triton.cdiv(M, block_m))
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if cfg.split_k > 1:
        assert counters.numel() >= grid[0] * grid[2], f"split-K needs {grid[0] * grid[2]} counters"
        part = torch.empty((cfg.split_k, M, N), device=x.device, dtype=torch.float32)
    else:
        part = torch.empty(1, device=x.device, dtype=torch.float32)  # unused
    C = K // 2
    block_c = cfg.block_k // 2
    _w12_tc_kernel[grid](
        x,
        xs if xs is not None else x,  # unused without X_SPLIT
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
        C,
        x.stride(0),
        y.stride(0),
        cfg.split_k,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_C=block_c,
        EVEN_N=N % cfg.block_n == 0,
        EVEN_C=C % block_c == 0,
        HAS_BIAS=bias is not None,
        VIEW8=view8,
        USE_ASM=use_asm,
        UPCAST=INTERPRETED,
        UPCAST_OUT=INTERPRETED,
        ESC_PRECISION="ieee" if INTERPRETED else "tf32x3",
        X_SPLIT=xs is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y


@_w12_tc_gemm_op.register_fake
def _(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, xs, view8, *config):
    return x.new_empty((x.shape[0], hi.shape[0]))


def split_x(x2: torch.Tensor) -> torch.Tensor:
    """``[2, M, K / 2]``: x's even columns, then its odd ones, each contiguous (the X_SPLIT operands)."""
    M, K = x2.shape
    return x2.unflatten(1, (K // 2, 2)).permute(2, 0, 1).contiguous()


# Whether tc_gemm feeds wgmma pre-split activations (X_SPLIT) when its caller does not say: x's even and odd
# columns come through the pipeline straight into wgmma's shared-memory operand, instead of being loaded as
# uint32 pairs, split in registers and stored back to shared memory every K-step. The even and odd columns
# also accumulate apart (summed after the loop), so no wgmma waits for the previous one. In the sm_90 build
# at M = 64 (64 x 128 tiles) the default path's K loop has two local_alloc stores, fences and two full
# wgmma waits a step; X_SPLIT's TTGIR and PTX have none of them, at 198 registers against 180
# (tests/test_w12_tc.py checks the IR), but ptxas serializes its wgmmas (warning C7515: its SASS waits after
# each of the 16 a step). Measured (H100, a02a30b, w12_xsplit_h100.json, the 8B's four per-layer projections):
# the kernel with x already split is 1.003 / 1.012 / 1.007x the default path (geomean, M = 16 / 32 / 64), and
# with its split copy in each call 0.93 / 0.94 / 0.97x; with the serialized wgmmas that does not show what
# the x round trip costs. The path stays off; SPECPILOT_W12_X_SPLIT=1 turns it on.
X_SPLIT_DEFAULT = os.environ.get("SPECPILOT_W12_X_SPLIT", "0") == "1"


def tc_gemm(
    x2: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    config: TcConfig | None = None,
    use_asm: bool | None = None,
    view8: bool = False,
    x_split: bool | None = None,
) -> torch.Tensor:
    """``x2 [M, K] @ W^T (+ bias)`` for 2-D bf16 x2 with unit stride along K and an even K (the other checks
    are the caller's, ``gemm.launch``). ``config`` None: ``config.pick_tc_config`` (tuned table with a
    nearest-shape rule, else the formula); ``use_asm`` as in ``gemm.w12_gemm``; ``view8``: the 8-bit view;
    ``x_split``: the X_SPLIT operand path (None: ``X_SPLIT_DEFAULT``)."""
    c = (0, 0, 1, 4, 3) if config is None else config.op_args()
    asm = USE_ASM if use_asm is None else use_asm
    xs = split_x(x2) if (X_SPLIT_DEFAULT if x_split is None else x_split) else None
    return _w12_tc_gemm_op(x2, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, xs, view8, *c, asm)
