"""Renames a W12 checkpoint's tensors to the parameters of SGLang's layers while SGLang loads it.

Our converter stores weight ``X.weight`` as five tensors ``X.weight.w12_{hi,lo,base,esc_idx,esc_val}``.
SGLang's model ``load_weights`` maps checkpoint names to parameters by substring (``q_proj`` ->
``qkv_proj`` with shard ``"q"``, ...) and looks the result up in ``named_parameters()``, where a
``W12LinearMethod`` layer holds ``X.w12_hi`` etc. So each plane is yielded as ``X.w12_<plane>``, and the
model's own stacking and shard routing do the rest. A module that exists under ``X`` but has no W12
planes (embedding, LM head: SGLang's unquantized path) gets its record decoded, bit-exactly, to the BF16
``X.weight`` it expects.

The planes of one record are adjacent in a safetensors file (its keys are sorted), so at most one
record is buffered at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from w12.checkpoint import PLANES
from w12.codec import decode
from w12.format import W12Tensor

_SUFFIX = ".w12_"


def _split(name: str) -> tuple[str, str] | None:
    """``X.weight.w12_hi`` -> (``X.weight``, ``hi``); None for an ordinary tensor."""
    base, sep, plane = name.rpartition(_SUFFIX)
    return (base, plane) if sep and plane in PLANES else None


def w12_weight_stream(
    weights: Iterable[tuple[str, torch.Tensor]], model: nn.Module
) -> Iterator[tuple[str, torch.Tensor]]:
    """SGLang's ``(name, tensor)`` stream of a W12 checkpoint, with names the model's loader resolves."""
    modules = dict(model.named_modules())
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        split = _split(name)
        if split is None:
            yield name, tensor
            continue
        base, plane = split
        planes = pending.setdefault(base, {})
        planes[plane] = tensor
        if len(planes) < len(PLANES):
            continue
        del pending[base]
        module_name = base.removesuffix(".weight")
        module = modules.get(module_name)
        if module is not None and not hasattr(module, "w12_hi"):
            hi = planes["hi"]
            record = W12Tensor(**planes, shape=(hi.shape[0], hi.shape[1]))
            yield base, decode(record)
            continue
        for p in PLANES:
            yield f"{module_name}{_SUFFIX}{p}", planes[p]
    if pending:
        raise ValueError(f"w12: incomplete records in the checkpoint (missing planes): {sorted(pending)[:5]}")


def uses_w12(model: nn.Module) -> bool:
    return any(hasattr(m, "w12_hi") for m in model.modules())
