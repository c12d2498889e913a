"""RMSNorm of rows in one launch (Triton), and its reference (``models.llama.rms_norm``, eager PyTorch).

Why: outside the compiled blocks an RMSNorm runs eagerly as eight kernels (the float cast, the square, the
mean, the add and rsqrt, two multiplies, the cast back); the drafter's head runs one at every draft depth, so
a chain of 6 pays ~48 launches a round and a tree of depth 6 as many, on a GPU that spends ~2.5 us a kernel
in those rounds. Here one program normalises a row: the same fp32 arithmetic and the same two roundings
(normalised value to x's dtype, then the product with the weight), with the mean's sum taken in another
order, so an output may differ from eager's in its last bit. The drafter's outputs only steer the drafts;
the verify pass decides every emitted token.
"""

from __future__ import annotations

import torch

from ..models.llama import rms_norm as rms_norm_ref
from .launch import runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs keep the reference
    triton = None

MAX_FEATURES = 16384  # a row the kernel holds in one block

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, H, stride_x, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        ok = c < H
        x = tl.load(x_ptr + row * stride_x + c, mask=ok, other=0.0).to(tl.float32)
        var = tl.sum(x * x, 0) / H
        xn = (x * tl.math.rsqrt(var + eps)).to(y_ptr.dtype.element_ty)
        w = tl.load(w_ptr + c, mask=ok, other=0.0)
        y = (w.to(tl.float32) * xn.to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * H + c, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``models.llama.rms_norm(x, weight, eps)`` in one launch where Triton runs (a GPU or the interpreter),
    x and weight of one dtype and a row of at most ``MAX_FEATURES``; the reference elsewhere."""
    H = x.shape[-1]
    here = runs_on(x, _rms_norm_kernel if triton is not None else None)
    # float64 stays eager: its weight product runs in float64 there, in float32 here.
    if not here or weight.dtype != x.dtype or x.dtype == torch.float64 or H > MAX_FEATURES or weight.shape != (H,):
        return rms_norm_ref(x, weight, eps)
    x2 = x.reshape(-1, H)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight, y, H, x2.stride(0), eps, BLOCK=triton.next_power_of_2(H), num_warps=4
        )
    return y.view(x.shape)
