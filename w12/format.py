"""The W12 record layout: lossless 12-bit BF16 weights in two planes plus exact escapes.

A BF16 weight is sign (1) | biased exponent e (8) | mantissa (7). For each output channel n (a row of
W [N, K]) the encoder picks a base exponent ``base[n]`` such that the 16-binade window
``base[n] .. base[n] + 15`` holds the most of that row's weights. A weight inside its window is stored as

    sign (1) | exponent offset e - base[n] (4) | mantissa (7)          = 12 bits

split into two planes so that a pass can read the high 8 bits alone:

    hi [N, K]      uint8   bit 7 sign | bits 6..3 exponent offset | bits 2..0 mantissa bits 6..4
    lo [N, K2]     uint8   mantissa bits 3..0, two weights per byte along K: k even -> low nibble,
                           k odd -> high nibble; K2 = ceil(K / 2), an odd K leaves the last high nibble 0
    base [N]       uint8   biased exponent of offset 0

Every other weight (outside the window; exact zeros and subnormals unless the window starts at field 0;
NaN and infinities unless it ends at field 255) is an escape; in-window slots may therefore hold zeros,
subnormals or non-finite values when base is 0 or 240, and kernels must not assume normal numbers.
An escape's planes hold code 0 (hi = 0, nibble = 0) and its exact BF16 value sits in
the sparse list

    esc_idx [E]    int64   flat index n * K + k, strictly increasing
    esc_val [E]    bf16    the exact value

so ``decode`` is bit-exact for every BF16 pattern, NaN and infinities included (they are escapes too).
The 8-bit view decodes ``hi`` alone with the four low mantissa bits set to 1000b (the middle of the
dropped range) and ignores escapes: an approximation for the cheap pass of two-level verification.

Bits per weight = (12 N K + 8 N + (64 + 16) E) / (N K), plus the K2 padding nibble when K is odd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WINDOW = 16  # binades per channel: 4 exponent-offset bits
ESCAPE_BITS = 64 + 16  # int64 index + bf16 value per escape


@dataclass
class W12Tensor:
    """One encoded weight matrix [N, K] (see the module docstring for every field)."""

    hi: torch.Tensor  # [N, K] uint8
    lo: torch.Tensor  # [N, ceil(K / 2)] uint8
    base: torch.Tensor  # [N] uint8
    esc_idx: torch.Tensor  # [E] int64
    esc_val: torch.Tensor  # [E] bfloat16
    shape: tuple[int, int]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.hi, self.lo, self.base, self.esc_idx, self.esc_val))

    def bits_per_weight(self) -> float:
        return 8 * self.nbytes() / (self.shape[0] * self.shape[1])


def decode_reference(w: W12Tensor) -> torch.Tensor:
    """Plain PyTorch decode to BF16 [N, K]; bit-exact (the reference every kernel is checked against)."""
    N, K = w.shape
    hi = w.hi.to(torch.int32)
    nib = torch.stack([w.lo & 0xF, w.lo >> 4], dim=-1).reshape(N, 2 * w.lo.shape[1])[:, :K].to(torch.int32)
    sign = (hi >> 7) & 1
    exp = ((hi >> 3) & 0xF) + w.base.to(torch.int32)[:, None]
    mant = ((hi & 0x7) << 4) | nib
    bits = (sign << 15) | (exp << 7) | mant
    out = bits.to(torch.int16).view(torch.bfloat16).clone()  # int32 -> int16 keeps the low 16 bits
    if w.esc_idx.numel():
        out.view(-1)[w.esc_idx] = w.esc_val
    return out


def decode_view8_reference(w: W12Tensor) -> torch.Tensor:
    """The approximate 8-bit view [N, K] in BF16: hi plane only, low mantissa bits 1000b, no escapes."""
    hi = w.hi.to(torch.int32)
    sign = (hi >> 7) & 1
    exp = ((hi >> 3) & 0xF) + w.base.to(torch.int32)[:, None]
    mant = ((hi & 0x7) << 4) | 0x8
    bits = (sign << 15) | (exp << 7) | mant
    return bits.to(torch.int16).view(torch.bfloat16).clone()
