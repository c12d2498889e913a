"""W12 Triton kernels: exact-weight GEMM, 8-bit-view GEMM and register decode, straight from the planes.

Two exact GEMM kernels, chosen per M by ``kernel_for``: the quad kernel (``gemm.py``, fp32 FMAs at M = 1) and
the tensor-core kernel (``gemm_tc.py``, wgmma, from M = 2: the rows of a verify pass).
``w12_gemm`` / ``w12_view8_gemm`` are the launchers modules call (``w12.linear.W12Linear`` does); each has
a plain PyTorch reference (``*_ref``) and ``gemm_tolerance`` states how close they must be. On a CPU
without TRITON_INTERPRET=1 the launchers run the references.
"""

from .config import GemmConfig, TcConfig, default_config, default_tc_config, pick_config, pick_tc_config
from .decode import INTERPRETED, w12_decode, w12_decode_ref
from .escapes import escape_correction_ref, escape_row_ptr, placeholder_values
from .gemm import gemm_tolerance, kernel_for, shared_counters, w12_gemm, w12_gemm_ref
from .view8_gemm import w12_view8_gemm, w12_view8_gemm_ref

__all__ = [
    "INTERPRETED",
    "GemmConfig",
    "TcConfig",
    "default_config",
    "default_tc_config",
    "escape_correction_ref",
    "escape_row_ptr",
    "gemm_tolerance",
    "kernel_for",
    "pick_config",
    "pick_tc_config",
    "placeholder_values",
    "shared_counters",
    "w12_decode",
    "w12_decode_ref",
    "w12_gemm",
    "w12_gemm_ref",
    "w12_view8_gemm",
    "w12_view8_gemm_ref",
]
