"""Quantization method ``w12`` for SGLang: W12 checkpoints from ``specpilot w12 convert`` in SGLang's layers.

``W12Config`` is the ``QuantizationConfig`` SGLang builds for ``--quantization w12``; it hands every linear
layer (``LinearBase``: fused QKV, gate/up, down, o) a ``W12LinearMethod`` and leaves embeddings and the LM
head to SGLang's unquantized path (their W12 records are decoded to BF16 on load, ``w12_weights``).

``W12LinearMethod`` follows SGLang's linear-method life cycle:

- ``create_weights``: the planes of the layer's whole (fused) output, ``w12_hi`` [N, K], ``w12_lo``
  [N, ceil(K/2)], ``w12_base`` [N] (uint8), each with a ``weight_loader`` that copies one shard (q/k/v,
  gate/up, or the whole) into its rows. Escapes vary in number, so their loaders collect them.
- ``process_weights_after_loading``: the collected escapes become ``w12_esc_idx`` / ``w12_esc_val`` (flat
  indices into the fused [N, K], sorted) and the escape row pointer is derived once.
- ``apply``: ``w12.kernels.w12_gemm``, the exact GEMM (its torch reference on a plain CPU).

Tensor parallelism is not supported yet (tp size 1): a shard of a W12 record along K would need the
per-row base and the escapes re-cut, which the converter does not do.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from sglang.srt.layers.quantization.base_config import LinearMethodBase, QuantizationConfig
from torch import nn

from sglang_specpilot.sglang_plugin import QUANT_METHOD
from w12.codec import validate
from w12.format import W12Tensor
from w12.kernels import escape_row_ptr, w12_gemm
from w12.kernels.gemm import COUNTER_SLOTS

PLANES = ("hi", "lo", "base")
_QKV = {"q": 0, "k": 1, "v": 2}


class W12LinearMethod(LinearMethodBase):
    """Linear layers whose weight is a W12 record, decoded inside the GEMM (see the module docstring)."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        N, K = sum(output_partition_sizes), input_size_per_partition
        if K != input_size or N != output_size:
            raise NotImplementedError(
                f"w12: tensor-parallel shards are not supported yet (layer [{output_size}, {input_size}] "
                f"split to [{N}, {K}]); run with --tp-size 1"
            )
        layer.w12_shape = (N, K)
        layer.w12_partition_sizes = list(output_partition_sizes)
        layer.w12_escapes = []  # (flat index in the fused [N, K], value) per loaded shard
        shapes = {"hi": (N, K), "lo": (N, (K + 1) // 2), "base": (N,)}
        for plane, shape in shapes.items():
            param = nn.Parameter(torch.zeros(shape, dtype=torch.uint8), requires_grad=False)
            param.weight_loader = partial(self._load_plane, layer, plane)
            layer.register_parameter(f"w12_{plane}", param)
        for plane, dtype in (("esc_idx", torch.int64), ("esc_val", torch.bfloat16)):
            param = nn.Parameter(torch.zeros(0, dtype=dtype), requires_grad=False)
            param.weight_loader = partial(self._load_escapes, layer, plane)
            layer.register_parameter(f"w12_{plane}", param)

    @staticmethod
    def _row_offset(layer: nn.Module, shard_id: Any) -> tuple[int, int]:
        """(first row, rows) of a shard in the fused output: q/k/v, merged index 0/1, or None = all."""
        sizes = layer.w12_partition_sizes
        if shard_id is None:
            return 0, layer.w12_shape[0]
        i = _QKV[shard_id] if isinstance(shard_id, str) else int(shard_id)
        return sum(sizes[:i]), sizes[i]

    def _load_plane(self, layer: nn.Module, plane: str, param: nn.Parameter, loaded: torch.Tensor, shard_id=None):
        start, rows = self._row_offset(layer, shard_id)
        if loaded.shape[0] != rows or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(
                f"w12_{plane}: shard {shard_id!r} is {tuple(loaded.shape)}, the layer expects "
                f"[{rows}, {', '.join(map(str, param.shape[1:]))}]"
            )
        param.data[start : start + rows].copy_(loaded)

    def _load_escapes(self, layer: nn.Module, plane: str, param: nn.Parameter, loaded: torch.Tensor, shard_id=None):
        start, _ = self._row_offset(layer, shard_id)
        # Pair the two planes of one shard by arrival: idx and val of a shard are yielded together.
        pending = getattr(layer, "w12_pending", {})
        pending.setdefault(shard_id, {})[plane] = loaded
        got = pending[shard_id]
        if len(got) == 2:
            layer.w12_escapes.append((got["esc_idx"].to(torch.int64) + start * layer.w12_shape[1], got["esc_val"]))
            del pending[shard_id]
        layer.w12_pending = pending

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if getattr(layer, "w12_pending", None):
            raise ValueError(f"w12: escape planes without their partner for shards {list(layer.w12_pending)}")
        dev = layer.w12_hi.device
        if layer.w12_escapes:
            idx = torch.cat([i for i, _ in layer.w12_escapes]).to(dev)
            val = torch.cat([v for _, v in layer.w12_escapes]).to(device=dev, dtype=torch.bfloat16)
            # Shards arrive in any order; the format wants strictly increasing flat indices.
            idx, order = torch.sort(idx)
            val = val[order]
        else:
            idx = torch.zeros(0, dtype=torch.int64, device=dev)
            val = torch.zeros(0, dtype=torch.bfloat16, device=dev)
        layer.w12_esc_idx = nn.Parameter(idx, requires_grad=False)
        layer.w12_esc_val = nn.Parameter(val, requires_grad=False)
        layer.w12_escapes = []
        record = self.record(layer)
        validate(record, f"w12 layer {type(layer).__name__}")
        layer.w12_esc_row_ptr = escape_row_ptr(record)
        layer.w12_counters = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=dev)

    @staticmethod
    def record(layer: nn.Module) -> W12Tensor:
        """The layer's weight as a ``W12Tensor`` view of its parameters (no copy)."""
        return W12Tensor(
            layer.w12_hi.data,
            layer.w12_lo.data,
            layer.w12_base.data,
            layer.w12_esc_idx.data,
            layer.w12_esc_val.data,
            layer.w12_shape,
        )

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``x @ W^T + bias``: x [..., K] bfloat16 -> [..., N] bfloat16."""
        return w12_gemm(x, self.record(layer), bias, esc_row_ptr=layer.w12_esc_row_ptr, counters=layer.w12_counters)


class W12Config(QuantizationConfig):
    """``--quantization w12``: lossless 12-bit BF16 weights (``w12/format.py``)."""

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]  # the GEMM's activations are BF16

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # BF16 tensor cores (Ampere); the Triton kernel also runs on Hopper

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # nothing to read: SGLang then builds W12Config() itself

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> W12Config:
        return cls()

    def get_quant_method(self, layer: nn.Module, prefix: str):
        from sglang.srt.layers.linear import LinearBase

        return W12LinearMethod() if isinstance(layer, LinearBase) else None

    def get_scaled_act_names(self) -> list[str]:
        return []
