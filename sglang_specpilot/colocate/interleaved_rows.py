"""Cross-model interleaved row operations: RMSNorm and residual add of several members in one launch.

Built like the grouped GEMM (``grouped_gemm.py``): a descriptor table holds one row per unit (member,
which rows or elements, operand addresses, sizes), so members of unrelated widths from both models share
one launch. A unit reads and writes only its own member's data. Units are interleaved in proportion to
each member's work (bytes moved; these ops are memory bound), with the same ``interleave_order``.

RMSNorm follows ``models.llama.rms_norm`` op for op: normalize in fp32, cast to the input dtype, then
multiply by the weight, so fp32 results agree with the reference to rounding of the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .grouped_gemm import _TL_DTYPE, INTERPRETED, interleave_order, kernel_available

# RMSNorm descriptor row: member, row, x, w, y, width, stride_x, stride_y.
R_MEMBER, R_ROW, R_X, R_W, R_Y, R_H, R_SX, R_SY = range(8)
RMS_DESC_WIDTH = 8
# Residual-add descriptor row: member, start element, numel, a, b, y.
A_MEMBER, A_START, A_NUMEL, A_A, A_B, A_Y = range(6)
ADD_DESC_WIDTH = 6


@dataclass
class RMSNormMember:
    """``y = w * (x * rsqrt(mean(x^2) + eps))``; x [R, H] (rows contiguous), w [H]."""

    x: torch.Tensor
    w: torch.Tensor
    eps: float


@dataclass
class AddMember:
    """``y = a + b``; a, b contiguous with the same shape."""

    a: torch.Tensor
    b: torch.Tensor


def rms_norm_ref(members: list[RMSNormMember]) -> list[torch.Tensor]:
    """The separate kernels, the model's own ``rms_norm`` per member."""
    from ..models.llama import rms_norm

    return [rms_norm(m.x, m.w, m.eps) for m in members]


def add_ref(members: list[AddMember]) -> list[torch.Tensor]:
    return [m.a + m.b for m in members]


@triton.jit
def _interleaved_rms_norm_kernel(desc_ptr, eps_ptr, ELEM: tl.constexpr, BLOCK_H: tl.constexpr, DESC_W: tl.constexpr):
    row = desc_ptr + tl.program_id(0).to(tl.int64) * DESC_W
    member = tl.load(row + 0)
    r = tl.load(row + 1)
    x_ptr = tl.load(row + 2).to(tl.pointer_type(ELEM))
    w_ptr = tl.load(row + 3).to(tl.pointer_type(ELEM))
    y_ptr = tl.load(row + 4).to(tl.pointer_type(ELEM))
    H = tl.load(row + 5)
    stride_x = tl.load(row + 6)
    stride_y = tl.load(row + 7)
    eps = tl.load(eps_ptr + member)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    x = tl.load(x_ptr + r * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H.to(tl.float32) + eps)
    normed = (x * inv).to(ELEM)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + r * stride_y + offs, (w.to(tl.float32) * normed.to(tl.float32)).to(ELEM), mask=mask)


@triton.jit
def _interleaved_add_kernel(desc_ptr, ELEM: tl.constexpr, BLOCK: tl.constexpr, DESC_W: tl.constexpr):
    row = desc_ptr + tl.program_id(0).to(tl.int64) * DESC_W
    start = tl.load(row + 1)
    numel = tl.load(row + 2)
    a_ptr = tl.load(row + 3).to(tl.pointer_type(ELEM))
    b_ptr = tl.load(row + 4).to(tl.pointer_type(ELEM))
    y_ptr = tl.load(row + 5).to(tl.pointer_type(ELEM))
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    # Add in fp32 and round once, as torch does for half types (exact for fp32).
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (a + b).to(ELEM), mask=mask)


def _check_same(tensors: list[torch.Tensor]) -> tuple[torch.dtype, torch.device]:
    dtype, dev = tensors[0].dtype, tensors[0].device
    if any(t.dtype != dtype or t.device != dev for t in tensors):
        raise ValueError("members of one interleaved kernel share dtype and device")
    return dtype, dev


class InterleavedRMSNorm:
    """RMSNorm of every member in one launch, bound to fixed operands (capturable; see GroupedGemm)."""

    def __init__(self, members: list[RMSNormMember], outs: list[torch.Tensor]):
        dtype, dev = _check_same([t for m, y in zip(members, outs, strict=True) for t in (m.x, m.w, y)])
        rows = []
        for k, (m, y) in enumerate(zip(members, outs, strict=True)):
            if m.x.dim() != 2 or m.x.stride(1) != 1 or y.shape != m.x.shape or m.w.shape != (m.x.shape[1],):
                raise ValueError(f"member {k}: x [R, H] row-contiguous, w [H], y like x")
            rows.append(
                [
                    [k, r, m.x.data_ptr(), m.w.data_ptr(), y.data_ptr(), m.x.shape[1], m.x.stride(0), y.stride(0)]
                    for r in range(m.x.shape[0])
                ]
            )
        self.members, self.outs, self.dtype = members, outs, dtype
        self.block_h = triton.next_power_of_2(max(m.x.shape[1] for m in members))
        self.use_kernel = kernel_available(dev)
        order = interleave_order([len(r) for r in rows])
        self.desc = torch.tensor([rows[k][i] for k, i in order], dtype=torch.int64, device=dev)
        self.eps = torch.tensor([m.eps for m in members], dtype=torch.float32, device=dev)

    def __call__(self) -> list[torch.Tensor]:
        if not self.use_kernel:
            for y, r in zip(self.outs, rms_norm_ref(self.members), strict=True):
                y.copy_(r)
            return self.outs
        _interleaved_rms_norm_kernel[(self.desc.shape[0],)](
            self.desc, self.eps, ELEM=_TL_DTYPE[self.dtype], BLOCK_H=self.block_h, DESC_W=RMS_DESC_WIDTH
        )
        return self.outs


class InterleavedAdd:
    """Residual add of every member in one launch, ``block`` elements per unit (capturable)."""

    def __init__(self, members: list[AddMember], outs: list[torch.Tensor], *, block: int = 1024):
        dtype, dev = _check_same([t for m, y in zip(members, outs, strict=True) for t in (m.a, m.b, y)])
        if block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        rows = []
        for k, (m, y) in enumerate(zip(members, outs, strict=True)):
            if m.a.shape != m.b.shape or y.shape != m.a.shape:
                raise ValueError(f"member {k}: a, b and y need one shape")
            if not (m.a.is_contiguous() and m.b.is_contiguous() and y.is_contiguous()):
                raise ValueError(f"member {k}: a, b and y must be contiguous")
            n = m.a.numel()
            rows.append([[k, s, n, m.a.data_ptr(), m.b.data_ptr(), y.data_ptr()] for s in range(0, n, block)])
        self.members, self.outs, self.dtype, self.block = members, outs, dtype, block
        self.use_kernel = kernel_available(dev)
        order = interleave_order([len(r) for r in rows])
        self.desc = torch.tensor([rows[k][i] for k, i in order], dtype=torch.int64, device=dev)

    def __call__(self) -> list[torch.Tensor]:
        if not self.use_kernel:
            for y, r in zip(self.outs, add_ref(self.members), strict=True):
                y.copy_(r)
            return self.outs
        _interleaved_add_kernel[(self.desc.shape[0],)](
            self.desc, ELEM=_TL_DTYPE[self.dtype], BLOCK=self.block, DESC_W=ADD_DESC_WIDTH
        )
        return self.outs


def interleaved_rms_norm(members: list[RMSNormMember]) -> list[torch.Tensor]:
    """One-shot: ``[rms_norm(x_k, w_k, eps_k)]`` in one launch; each y_k [R_k, H_k]."""
    outs = [torch.empty_like(m.x) for m in members]
    return InterleavedRMSNorm(members, outs)()


def interleaved_add(members: list[AddMember], *, block: int = 1024) -> list[torch.Tensor]:
    """One-shot: ``[a_k + b_k]`` in one launch."""
    outs = [torch.empty_like(m.a) for m in members]
    return InterleavedAdd(members, outs, block=block)()


__all__ = [
    "INTERPRETED",
    "AddMember",
    "InterleavedAdd",
    "InterleavedRMSNorm",
    "RMSNormMember",
    "add_ref",
    "interleaved_add",
    "interleaved_rms_norm",
    "rms_norm_ref",
]
