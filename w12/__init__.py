"""w12: lossless 12-bit BF16 weights (see ../shared/DESIGN.md and ``format.py`` for the record layout).

``encode``/``decode`` turn a BF16 [N, K] matrix into a :class:`W12Tensor` and back bit for bit;
``load_w12_folder`` reads a checkpoint written by ``specpilot w12 convert`` (``w12.convert``).
"""

from w12.checkpoint import load_w12_folder, verify_w12_folder
from w12.codec import W12FormatError, decode, decode_view8, encode, escape_rate, to_bf16_exact, validate
from w12.format import W12Tensor, decode_reference, decode_view8_reference

__all__ = [
    "W12FormatError",
    "W12Tensor",
    "decode",
    "decode_reference",
    "decode_view8",
    "decode_view8_reference",
    "encode",
    "escape_rate",
    "load_w12_folder",
    "to_bf16_exact",
    "validate",
    "verify_w12_folder",
]
