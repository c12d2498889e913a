"""Register-level W12 decode: four weights per 32-bit load, two BF16 weights per 32-bit register.

The idea. Decode is bound by instructions, not bytes (DEVICE.md: at 4.3 TB/s and 1.5 B/weight an H200 has
~11 thread-instructions per weight for everything), so weights are never decoded one at a time. The unit
is a *quad*, four consecutive weights k = 4q .. 4q+3 of one row:

    H   uint32  the four hi bytes b0 b1 b2 b3 (the uint8 hi plane read as uint32 [N, K/4])
    L   uint16  the two lo bytes of the quad: L0 = nibbles of k=4q, 4q+1; L1 = of 4q+2, 4q+3
                (the lo plane read as uint16 [N, K/4]; 16-byte vector loads carry 4 and 8 quads)

and it decodes to two registers of two BF16 each, paired by parity so that no nibble has to cross a byte:

    we = bf16(k=4q) | bf16(k=4q+2) << 16        wo = bf16(k=4q+1) | bf16(k=4q+3) << 16

A BF16 weight is ``(b & 0x80) << 8 | (b & 0x7F) << 4 | nibble`` plus ``base << 7`` (``format.py``: bits 6..3
of b are the exponent offset, 2..0 the top mantissa bits). On a whole quad, per output register:

    s  = H << 4 (even) or H >> 4 (odd)        b's low 7 bits land on bits 4..10 / 20..26 of each half
    t  = [L0, 0, L1, 0] (even) or the same of L >> 4 (odd): a nibble on bits 0..3 / 16..19
    x  = (s & KEEP) | (t & SEL)               KEEP = 0x07F007F0, SEL = ~KEEP: one LOP3 takes s's
                                              bits 4..10 and t's everywhere else (t is 0 on 8..15, 24..31,
                                              which also clears the sign bit s dragged onto bit 11 / 27)
    w  = (x | (sign source & 0x80008000)) + (base << 7 | base << 23)
                                              signs: H << 8 (even) or H itself (odd) already has them on
                                              bits 15 / 31; one IADD adds both exponents' base (an
                                              in-window exponent never carries into the sign: base <= 240)

On the GPU this is inline PTX (``tl.inline_asm_elementwise``, two quads per asm block): 23 instructions
per 8 weights (~2.9 per weight; ptxas keeps them as PRMT / SHF / LOP3 with immediates / IADD). The
interpreter cannot run inline asm, so ``USE_ASM=False`` selects the same formulas in plain ``tl`` integer
ops (also the fallback if the asm ever misbehaves on a GPU: pass ``use_asm=False``). The tests run the PTX text
through a small emulator of its instructions and the ``tl`` path in the interpreter, and build both for
sm_90 with ptxas; the generated PTX passes the asm one 16-byte-load register per pack, element 0 in the
low half, as the emulator assumes.

The 8-bit view is the same without L: ``x = s & KEEP`` and the added base carries the 1000b fill
(``base2 + 0x00080008``): 18 instructions per 8 weights.

The fp32 FMA path turns a pair into two fp32 with one op each (``w << 16``, ``w & 0xFFFF0000``); the tensor
core path splits it into two BF16 columns (k = 4q and 4q+2 of ``we`` are the even columns 2q, 2q+1 of
``W[:, 0::2]``) and runs ``W_even @ x_even + W_odd @ x_odd``.

This file: the ``@triton.jit`` helpers the GEMM kernels share (quad loads, both decodes, pair splitting),
then a small decode-to-memory kernel ``w12_decode`` (a debugging aid, and the way to time a
"decompress, then cuBLAS" alternative), and its reference, ``format.decode_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from w12.format import W12Tensor, decode_reference

# Globals that @triton.jit code reads must be tl.constexpr (the compiler checks; the interpreter does not).
KEEP = tl.constexpr(0x07F007F0)  # bits of s that survive: offset and top mantissa of each half
SEL = tl.constexpr(0xF80FF80F)  # ~KEEP: from t (the nibbles, and zeros over the exponent's top and the sign)
SIGN = tl.constexpr(0x80008000)
VIEW8_FILL = tl.constexpr(0x00080008)  # the 1000b low mantissa of both halves of an 8-bit-view pair

# The exact decode of two quads (pack=2): $0 $1 = we of quad 0, 1; $2 $3 = wo; $4 $5 = H; $6 = the two
# L of quad 0 (low half) and quad 1; $7 $8 = base2. prmt selector 0x4140 builds [byte0, 0, byte1, 0] of its
# first operand (selector nibbles 4..7 read the immediate 0), 0x4342 the same of bytes 2 and 3. lop3 LUT
# 0xD8 = c ? b : a, 0xF8 = a | (b & c).
EXACT_PTX = """
{
.reg .b32 keep, sel, sgn, l4, s, t, x, g;
mov.b32 sel, 0xF80FF80F;
mov.b32 sgn, 0x80008000;
shr.u32 l4, $6, 4;
shl.b32 s, $4, 4;
prmt.b32 t, $6, 0, 0x4140;
lop3.b32 x, s, t, sel, 0xD8;
shl.b32 g, $4, 8;
lop3.b32 x, x, g, sgn, 0xF8;
add.u32 $0, x, $7;
shr.u32 s, $4, 4;
prmt.b32 t, l4, 0, 0x4140;
lop3.b32 x, s, t, sel, 0xD8;
lop3.b32 x, x, $4, sgn, 0xF8;
add.u32 $2, x, $7;
shl.b32 s, $5, 4;
prmt.b32 t, $6, 0, 0x4342;
lop3.b32 x, s, t, sel, 0xD8;
shl.b32 g, $5, 8;
lop3.b32 x, x, g, sgn, 0xF8;
add.u32 $1, x, $8;
shr.u32 s, $5, 4;
prmt.b32 t, l4, 0, 0x4342;
lop3.b32 x, s, t, sel, 0xD8;
lop3.b32 x, x, $5, sgn, 0xF8;
add.u32 $3, x, $8;
}
"""

# The 8-bit view of two quads: $0 $1 = we, $2 $3 = wo, $4 $5 = H, $6 $7 = base2 + VIEW8_FILL.
VIEW8_PTX = """
{
.reg .b32 keep, sgn, s, x, g;
mov.b32 keep, 0x07F007F0;
mov.b32 sgn, 0x80008000;
shl.b32 s, $4, 4;
and.b32 x, s, keep;
shl.b32 g, $4, 8;
lop3.b32 x, x, g, sgn, 0xF8;
add.u32 $0, x, $6;
shr.u32 s, $4, 4;
and.b32 x, s, keep;
lop3.b32 x, x, $4, sgn, 0xF8;
add.u32 $2, x, $6;
shl.b32 s, $5, 4;
and.b32 x, s, keep;
shl.b32 g, $5, 8;
lop3.b32 x, x, g, sgn, 0xF8;
add.u32 $1, x, $7;
shr.u32 s, $5, 4;
and.b32 x, s, keep;
lop3.b32 x, x, $5, sgn, 0xF8;
add.u32 $3, x, $7;
}
"""

# The exact decode of one quad with its two lo bytes in a 16-bit operand: EXACT_PTX's quad-0 half, for
# ``gemm_tc.py``'s elementwise decode (pack=2 over a uint16 hi view and the uint8 lo plane: $2 = the quad's
# hi bytes, $3 = its lo bytes as loaded (ld.shared.b16, no byte shuffles), $4 = base2; $0 = we, $1 = wo).
# Passing lo as four bytes of a 32-bit operand instead made LLVM unpack and repack them: 711 against 622
# SASS instructions per 128 weights of the sm_90 K loop.
EXACT_QUAD_PTX = """
{
.reg .b32 sel, sgn, l, l4, s, t, x, g;
mov.b32 sel, 0xF80FF80F;
mov.b32 sgn, 0x80008000;
cvt.u32.u16 l, $3;
shr.u32 l4, l, 4;
shl.b32 s, $2, 4;
prmt.b32 t, l, 0, 0x4140;
lop3.b32 x, s, t, sel, 0xD8;
shl.b32 g, $2, 8;
lop3.b32 x, x, g, sgn, 0xF8;
add.u32 $0, x, $4;
shr.u32 s, $2, 4;
prmt.b32 t, l4, 0, 0x4140;
lop3.b32 x, s, t, sel, 0xD8;
lop3.b32 x, x, $2, sgn, 0xF8;
add.u32 $1, x, $4;
}
"""

_EXACT_PTX = tl.constexpr(EXACT_PTX)
_EXACT_QUAD_PTX = tl.constexpr(EXACT_QUAD_PTX)
_VIEW8_PTX = tl.constexpr(VIEW8_PTX)


# ---------------------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _load_quads(
    hi_ptr,
    lo_ptr,
    rows,
    quads,
    N,
    K,
    K2,
    Q,
    BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    ALIGNED: tl.constexpr,
    MASKED: tl.constexpr,
    LOAD_LO: tl.constexpr,
):
    # rows int64 [BN], quads int32 [BQ] -> H uint32 [BN, BQ], L uint16 [BN, BQ] (0 where out of range, which
    # decodes to the row's placeholder, multiplied by a masked-out x = 0).
    row_ok = rows < N
    if ALIGNED:
        # The uint8 planes read as uint32 [N, Q] and uint16 [N, Q], Q = K / 4 (a separate argument, so that
        # its divisibility by 16 is known and the loads become 16-byte vectors of 4 quads).
        hi32 = hi_ptr.to(tl.pointer_type(tl.uint32))
        lo16 = lo_ptr.to(tl.pointer_type(tl.uint16))
        offs = rows[:, None] * Q + quads[None, :]
        if MASKED:
            ok = row_ok[:, None] & (quads < Q)[None, :]
            h = tl.load(hi32 + offs, mask=ok, other=0, eviction_policy="evict_first")
            if LOAD_LO:
                lw = tl.load(lo16 + offs, mask=ok, other=0, eviction_policy="evict_first")
        else:
            h = tl.load(hi32 + offs, eviction_policy="evict_first")
            if LOAD_LO:
                lw = tl.load(lo16 + offs, eviction_policy="evict_first")
        if not LOAD_LO:
            lw = h.to(tl.uint16)  # unused
    else:
        # K % 4 != 0: rows are not 4-byte aligned, so the quads are assembled from bytes (slow; no real model
        # has such a K, the path exists so that every shape is correct).
        h = tl.zeros([BLOCK_N, BLOCK_Q], tl.uint32)
        for i in tl.static_range(4):
            k = quads * 4 + i
            b = tl.load(hi_ptr + rows[:, None] * K + k[None, :], mask=row_ok[:, None] & (k < K)[None, :], other=0)
            h = h | (b.to(tl.uint32) << (8 * i))
        lw32 = tl.zeros([BLOCK_N, BLOCK_Q], tl.uint32)
        if LOAD_LO:
            for j in tl.static_range(2):
                c = quads * 2 + j
                b = tl.load(
                    lo_ptr + rows[:, None] * K2 + c[None, :],
                    mask=row_ok[:, None] & (c < K2)[None, :],
                    other=0,
                )
                lw32 = lw32 | (b.to(tl.uint32) << (8 * j))
        lw = lw32.to(tl.uint16)
    return h, lw


@triton.jit
def _decode_exact(h, lw, base2, USE_ASM: tl.constexpr):
    # H uint32 [BN, BQ], L uint16 [BN, BQ], base2 uint32 [BN, 1] -> (we, wo) uint32 [BN, BQ] (module doc).
    if USE_ASM:
        we, wo = tl.inline_asm_elementwise(
            _EXACT_PTX,
            "=r,=r,=r,=r,r,r,r,r,r",
            [h, lw, base2],
            dtype=(tl.uint32, tl.uint32),
            is_pure=True,
            pack=2,
        )
    else:
        lw = lw.to(tl.uint32)
        te = (lw & 0xFF) | ((lw & 0xFF00) << 8)  # prmt [L0, 0, L1, 0]
        l4 = lw >> 4
        to = (l4 & 0xFF) | ((l4 & 0xFF00) << 8)
        xe = ((h << 4) & KEEP) | (te & SEL)
        xo = ((h >> 4) & KEEP) | (to & SEL)
        we = (xe | ((h << 8) & SIGN)) + base2
        wo = (xo | (h & SIGN)) + base2
    return we, wo


@triton.jit
def _decode_view8(h, base2v, USE_ASM: tl.constexpr):
    # The 8-bit view: hi alone; base2v = base2 + VIEW8_FILL carries the 1000b low mantissa.
    if USE_ASM:
        we, wo = tl.inline_asm_elementwise(
            _VIEW8_PTX,
            "=r,=r,=r,=r,r,r,r,r",
            [h, base2v],
            dtype=(tl.uint32, tl.uint32),
            is_pure=True,
            pack=2,
        )
    else:
        we = (((h << 4) & KEEP) | ((h << 8) & SIGN)) + base2v
        wo = (((h >> 4) & KEEP) | (h & SIGN)) + base2v
    return we, wo


@triton.jit
def _pair_lo_f32(w):
    # The low BF16 of a pair as fp32: a BF16 is the top half of the fp32 with the same value.
    return (w << 16).to(tl.float32, bitcast=True)


@triton.jit
def _pair_hi_f32(w):
    return (w & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _pairs_to_columns(w, BN: tl.constexpr, BQ: tl.constexpr, UPCAST: tl.constexpr):
    # [BN, BQ] pairs (k = 4q + p, 4q + p + 2) -> [BN, 2 BQ] columns c = 2q, 2q + 1, i.e. k = p + 2c: one
    # parity class of the tile. tl.join puts the two halves side by side in a thread's registers, where they
    # were.
    if UPCAST:
        # Interpreter only: its bf16 tl.dot multiplies the raw bit patterns (triton-lang/triton#11584).
        lo = _pair_lo_f32(w)
        hi = _pair_hi_f32(w)
    else:
        lo = (w & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (w >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.join(lo, hi).reshape(BN, 2 * BQ)


@triton.jit
def _row_base2(base_ptr, rows, N, VIEW8: tl.constexpr):
    # base << 7 | base << 23 per row, [BN, 1] uint32; rows past N get 0 (they decode to +0 or tiny values
    # and are never stored).
    b = tl.load(base_ptr + rows, mask=rows < N, other=0).to(tl.uint32)
    base2 = (b << 7) | (b << 23)
    if VIEW8:
        base2 = base2 + VIEW8_FILL
    return base2[:, None]


@triton.jit
def _to_bf16(acc, BY_BITS: tl.constexpr):
    # fp32 -> bf16, round to nearest even. The GPU's conversion does that in one instruction per pair; the
    # interpreter's truncates, so there the rounding is done on the bits (NaN stays a quiet NaN).
    if BY_BITS:
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(acc != acc, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return acc.to(tl.bfloat16)


# ---------------------------------------------------------------------------------------------------------
# Decode-to-memory kernel
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _w12_decode_kernel(
    hi_ptr,
    lo_ptr,
    base_ptr,
    out_ptr,  # bf16 [N, K], written as uint32 pairs when ALIGNED, else as uint16
    N,
    K,
    K2,
    Q,
    BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    ALIGNED: tl.constexpr,
    VIEW8: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    quads = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    h, lw = _load_quads(hi_ptr, lo_ptr, rows, quads, N, K, K2, Q, BLOCK_N, BLOCK_Q, ALIGNED, True, not VIEW8)
    base2 = _row_base2(base_ptr, rows, N, VIEW8)
    if VIEW8:
        we, wo = _decode_view8(h, base2, USE_ASM)
    else:
        we, wo = _decode_exact(h, lw, base2, USE_ASM)
    row_ok = (rows < N)[:, None]
    if ALIGNED:
        # Back to k order: pairs (4q, 4q+1) and (4q+2, 4q+3), side by side, so a row is one contiguous store.
        p01 = (we & 0xFFFF) | (wo << 16)
        p23 = (we >> 16) | (wo & 0xFFFF0000)
        cols = tl.arange(0, 2 * BLOCK_Q) + tl.program_id(1) * 2 * BLOCK_Q
        pairs = tl.join(p01, p23).reshape(BLOCK_N, 2 * BLOCK_Q)
        out32 = out_ptr.to(tl.pointer_type(tl.uint32))
        tl.store(out32 + rows[:, None] * (2 * Q) + cols[None, :], pairs, mask=row_ok & (cols < 2 * Q)[None, :])
    else:
        k0 = quads * 4
        dst = out_ptr.to(tl.pointer_type(tl.uint16)) + rows[:, None] * K
        w0 = (we & 0xFFFF).to(tl.uint16)
        w1 = (wo & 0xFFFF).to(tl.uint16)
        w2 = (we >> 16).to(tl.uint16)
        w3 = (wo >> 16).to(tl.uint16)
        tl.store(dst + k0[None, :], w0, mask=row_ok & (k0 < K)[None, :])
        tl.store(dst + (k0 + 1)[None, :], w1, mask=row_ok & (k0 + 1 < K)[None, :])
        tl.store(dst + (k0 + 2)[None, :], w2, mask=row_ok & (k0 + 2 < K)[None, :])
        tl.store(dst + (k0 + 3)[None, :], w3, mask=row_ok & (k0 + 3 < K)[None, :])


# ---------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------

# TRITON_INTERPRET=1 counts only if it was set before triton was imported, so ask a kernel.
INTERPRETED = isinstance(_w12_decode_kernel, InterpretedFunction)
# Inline PTX wherever it can run. The asm was checked by emulation only so far: a first GPU run should
# compare it with the plain-tl decode by passing ``use_asm=False`` to the launchers (tests do).
USE_ASM = not INTERPRETED


def launchable(kernel):
    """The kernel as torch.compile sees it: ``wrap_triton`` on the GPU; interpreted ones launch directly."""
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


def quads_aligned(hi: torch.Tensor, lo: torch.Tensor, K: int) -> bool:
    """Whether the contiguous planes can be read as whole quads (uint32 hi, uint16 lo): K % 4 == 0 and the
    planes start 4- / 2-byte aligned. Decided from metadata (storage offset; allocations themselves are
    aligned), so it also works on the fake tensors torch.compile traces with."""
    return K % 4 == 0 and hi.storage_offset() % 4 == 0 and lo.storage_offset() % 2 == 0


def check_w12(w: W12Tensor) -> None:
    """Cheap shape and dtype checks of a record (never reads values: no host sync)."""
    N, K = w.shape
    assert w.hi.dtype == torch.uint8 and tuple(w.hi.shape) == (N, K), "hi: [N, K] uint8"
    assert w.lo.dtype == torch.uint8 and tuple(w.lo.shape) == (N, (K + 1) // 2), "lo: [N, ceil(K/2)] uint8"
    assert w.base.dtype == torch.uint8 and tuple(w.base.shape) == (N,), "base: [N] uint8"
    assert w.esc_idx.dtype == torch.int64 and w.esc_val.dtype == torch.bfloat16, "esc_idx int64, esc_val bf16"
    assert w.esc_idx.shape == w.esc_val.shape and w.esc_idx.dim() == 1, "esc_idx, esc_val: [E]"


def w12_decode(w: W12Tensor, *, view8: bool = False, use_asm: bool | None = None) -> torch.Tensor:
    """Decode a W12 record to BF16 [N, K] with the kernels' register decode (escapes scattered after).

    Bit-exact: equal to ``format.decode_reference(w)`` (``view8=True``: ``decode_view8_reference``). A
    debugging aid and the decompress-then-cuBLAS baseline; the GEMMs never write decoded weights.

    Parameters
    ----------
    w : W12Tensor [N, K] on a CUDA device (or anywhere under TRITON_INTERPRET=1)
    view8 : decode the 8-bit view instead (hi plane only, escapes ignored)
    use_asm : force the inline-PTX (True) or plain-tl (False) decode; default: PTX on the GPU

    Returns
    -------
    [N, K] bfloat16
    """
    check_w12(w)
    N, K = w.shape
    hi, lo = w.hi.contiguous(), w.lo.contiguous()
    aligned = quads_aligned(hi, lo, K)
    out = torch.empty(N, K, dtype=torch.bfloat16, device=w.hi.device)
    if N == 0 or K == 0:
        return out
    asm = USE_ASM if use_asm is None else use_asm
    block_n, block_q = 16, 64
    grid = (triton.cdiv(N, block_n), triton.cdiv(triton.cdiv(K, 4), block_q))
    launchable(_w12_decode_kernel)[grid](
        hi,
        lo,
        w.base,
        out,
        N,
        K,
        (K + 1) // 2,
        K // 4,
        BLOCK_N=block_n,
        BLOCK_Q=block_q,
        ALIGNED=aligned,
        VIEW8=view8,
        USE_ASM=asm,
        num_warps=4,
    )
    if not view8 and w.esc_idx.numel():
        out.view(-1)[w.esc_idx] = w.esc_val
    return out


# The reference is the format's own: ``decode_reference`` / ``decode_view8_reference``.
w12_decode_ref = decode_reference
