"""``W12Linear``: a drop-in ``nn.Linear`` whose weight lives as W12 planes and is decoded in the GEMM.

The engine swaps its BF16 ``nn.Linear`` modules for these (``W12Linear.from_linear``). ``forward`` is the
exact GEMM (``w12.kernels.w12_gemm``): on CUDA, and on CPU tensors when TRITON_INTERPRET=1 was set before
triton was imported; on a plain CPU it is the reference, ``F.linear(x, decode_reference(W), bias)``.
``forward_view8`` is the cheap pass of two-level verification: the same shapes from the hi plane alone.

One module serves every row count: the launcher picks the kernel per M bucket (``w12.kernels.kernel_for``):
the quad kernel's fp32 FMAs at M = 1 (AR steps), the tensor-core kernel (``gemm_tc.py``, wgmma) from M = 2
(chain and tree verify), each with its config for (N, K, M bucket) from the tuned table or its formula.

Capture-friendly: the escape row pointer and the split-K counters are buffers made once, the launchers read
no tensor values on the host, and the GEMM is a ``torch.library.custom_op`` that ``torch.compile`` keeps whole.
The planes, base, escapes and bias are persistent buffers (they are the state dict); the row pointer and
the counters are derived, non-persistent ones.

One compiled block serves every layer (``models.llama.run_block``), and ``torch.compile`` guards on each
buffer's shape, so layers whose escape counts differ would each compile anew: on the real SmolLM2 with W12
a TLV suite run hit dynamo's limit of 256 recompiles (H200, 4fb4ff5). ``pad_escapes_alike`` gives the
kernel copies of the escapes one length per group of alike modules (the same projection of every layer):
the extra entries hold the index N * K, past every row's range of the row pointer, which is computed from
the real escapes, so no kernel ever reads them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from w12.format import W12Tensor, decode_reference, decode_view8_reference
from w12.kernels import INTERPRETED, escape_row_ptr, w12_gemm, w12_view8_gemm
from w12.kernels.escapes import BLOCK_E
from w12.kernels.gemm import COUNTER_SLOTS


class W12Linear(nn.Module):
    """``y = x @ W^T + bias`` with W [out_features, in_features] stored as a W12 record.

    Parameters
    ----------
    weight : W12Tensor [N, K]; its tensors become this module's buffers (on their device)
    bias : [N] tensor or None; kept as given (bf16 for a converted bf16 ``nn.Linear``)
    """

    def __init__(self, weight: W12Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        N, K = (int(s) for s in weight.shape)
        self.in_features, self.out_features = K, N
        self.register_buffer("hi", weight.hi)
        self.register_buffer("lo", weight.lo)
        self.register_buffer("base", weight.base)
        self.register_buffer("esc_idx", weight.esc_idx)
        self.register_buffer("esc_val", weight.esc_val)
        self.register_buffer("bias", bias)
        self.register_buffer("esc_row_ptr", escape_row_ptr(weight), persistent=False)
        # What the kernels read: the escapes, or a padded copy of them (pad_escapes_alike).
        self.register_buffer("kernel_esc_idx", weight.esc_idx, persistent=False)
        self.register_buffer("kernel_esc_val", weight.esc_val, persistent=False)
        # Split-K tiles (< 2 programs per SM) of one launch; left at 0 by every launch.
        self.register_buffer(
            "counters",
            torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=weight.hi.device),
            persistent=False,
        )
        # "auto": the kernel per M bucket (w12.kernels.kernel_for); "triton" (quad), "tc" or "cuda" force one.
        self.backend = "auto"

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> W12Linear:
        """Encode a BF16 ``nn.Linear`` losslessly (``w12.codec.encode``); the bias is kept as it is."""
        from w12.codec import encode  # the codec is only needed to convert

        if linear.weight.dtype != torch.bfloat16:
            raise TypeError(f"W12Linear.from_linear needs a bfloat16 weight, got {linear.weight.dtype}")
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(encode(linear.weight.detach()), bias)

    @property
    def weight_w12(self) -> W12Tensor:
        """The record as a ``W12Tensor`` view of the buffers (no copy)."""
        return W12Tensor(self.hi, self.lo, self.base, self.esc_idx, self.esc_val, (self.out_features, self.in_features))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The escape count is part of the record: take the loaded escapes' shape, re-derive the row pointer.
        for name in ("esc_idx", "esc_val"):
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name], device=self.hi.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.esc_row_ptr = escape_row_ptr(self.weight_w12)
        self.kernel_esc_idx, self.kernel_esc_val = self.esc_idx, self.esc_val

    @property
    def kernel_weight(self) -> W12Tensor:
        """The record the kernels read: the planes with ``kernel_esc_idx`` / ``kernel_esc_val``."""
        shape = (self.out_features, self.in_features)
        return W12Tensor(self.hi, self.lo, self.base, self.kernel_esc_idx, self.kernel_esc_val, shape)

    def pad_escapes(self, count: int) -> None:
        """Give the kernels ``count`` escape entries (at least the real ones): the real escapes, then
        entries at index N * K (past the row pointer's last row, never read) with value 0."""
        real = int(self.esc_idx.numel())
        if count < real:
            raise ValueError(f"pad_escapes({count}): this weight has {real} escapes")
        if count > real and self.kernel_esc_idx.numel() == count:
            # Already this length: keep the tensors. Every engine's runner pads the model it runs, and a CUDA
            # graph another engine captured on the same model reads these by address: a new copy would free
            # the old one under that graph (on the H200 the tlv suite's second engine did exactly that, and
            # the first engine's next replay hit an illegal memory access).
            return
        if count == real:
            self.kernel_esc_idx, self.kernel_esc_val = self.esc_idx, self.esc_val
            return
        n_pad = count - real
        end = self.out_features * self.in_features
        pad_idx = torch.full((n_pad,), end, dtype=self.esc_idx.dtype, device=self.esc_idx.device)
        pad_val = torch.zeros(n_pad, dtype=self.esc_val.dtype, device=self.esc_val.device)
        self.kernel_esc_idx = torch.cat([self.esc_idx, pad_idx])
        self.kernel_esc_val = torch.cat([self.esc_val, pad_val])

    def _kernel_here(self, x: torch.Tensor) -> bool:
        return x.is_cuda or INTERPRETED

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Exact: ``x [..., K]`` (bf16 for the kernel) -> ``[..., N]``."""
        if self._kernel_here(x):
            w = self.kernel_weight
            return w12_gemm(x, w, self.bias, esc_row_ptr=self.esc_row_ptr, counters=self.counters, backend=self.backend)
        w = self.weight_w12
        return F.linear(x, decode_reference(w).to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def forward_view8(self, x: torch.Tensor) -> torch.Tensor:
        """Approximate (8-bit view: hi plane only, escapes ignored): ``x [..., K]`` -> ``[..., N]``."""
        if self._kernel_here(x):
            return w12_view8_gemm(x, self.kernel_weight, self.bias, counters=self.counters, backend=self.backend)
        w = decode_view8_reference(self.weight_w12)
        return F.linear(x, w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, escapes={self.esc_idx.numel()}"
        )


def pad_escapes_alike(modules) -> int:
    """Pad the kernel escapes of ``modules`` (W12Linear) to one length: the largest count among them, rounded
    up to a multiple of the kernels' escape chunk (``escapes.BLOCK_E``), so a block compiled once runs all
    of them without a recompile. Returns that length (0 for no modules)."""
    modules = list(modules)
    if not modules:
        return 0
    most = max(int(m.esc_idx.numel()) for m in modules)
    chunk = int(BLOCK_E.value)
    count = -(-most // chunk) * chunk
    for m in modules:
        m.pad_escapes(count)
    return count
