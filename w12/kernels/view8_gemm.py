"""8-bit-view GEMM: ``y = x @ W8^T`` with W8 the approximate weights of the hi plane alone.

The cheap pass of two-level verification reads only the hi plane (1 byte per weight: half of BF16's
bytes) and decodes every weight with its low four mantissa bits set to 1000b, escapes ignored
(``format.decode_view8_reference``). The kernels are the exact GEMM's with ``VIEW8=True`` (the quad kernel
``gemm._w12_gemm_kernel`` at M = 1, the tensor-core ``gemm_tc._w12_tc_kernel`` from M = 2): no lo loads, a
19-instruction-per-8-weights decode (``decode.VIEW8_PTX``), no escape epilogue. Its tolerance
against ``decode_view8_reference(w).float()`` in fp32 is ``gemm.gemm_tolerance(.., view8=True)``, the same
bound as the exact GEMM's. How far W8 is from W is the codec's business (``codec.decode_view8``: at most
2^-4 relative for in-window normal weights; escapes and window slots with exponent field 0 or 255 have no
bound).
"""

from __future__ import annotations

import torch

from w12.format import W12Tensor, decode_view8_reference

from .config import GemmConfig
from .decode import INTERPRETED
from .gemm import launch


def w12_view8_gemm(
    x: torch.Tensor,
    w: W12Tensor,
    bias: torch.Tensor | None = None,
    *,
    counters: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    use_asm: bool | None = None,
    backend: str = "auto",
    mma_config=None,
    tc_config=None,
    x_split: bool | None = None,
) -> torch.Tensor:
    """Approximate GEMM ``y = x @ W8^T + bias`` reading only the hi plane of ``w``.

    Parameters
    ----------
    x : [..., K] bfloat16
    w : W12Tensor [N, K] on x's device (lo and escapes are not read)
    bias, counters, config, use_asm, backend, mma_config, tc_config, x_split : as in ``gemm.w12_gemm`` (the same kernel
        per M: the quad kernel at M = 1, the tensor-core one from M = 2)

    Returns
    -------
    y : [..., N] bfloat16, fp32-accumulated; within ``gemm_tolerance(.., view8=True)`` of
    ``w12_view8_gemm_ref(.., out_dtype=torch.float32)``
    """
    if x.device.type == "cpu" and not INTERPRETED:
        return w12_view8_gemm_ref(x, w, bias)
    return launch(
        x, w, bias, view8=True, counters=counters, config=config, use_asm=use_asm, backend=backend,
        mma_config=mma_config, tc_config=tc_config, x_split=x_split,
    )  # fmt: skip


def w12_view8_gemm_ref(
    x: torch.Tensor, w: W12Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x.float() @ decode_view8_reference(w).float().T (+ bias)`` cast to ``out_dtype`` (default x's)."""
    y = x.float() @ decode_view8_reference(w).float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)
