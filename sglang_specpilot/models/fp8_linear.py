"""FP8 drafter projections (``EngineOptions.draft_weights="fp8"``): half the bytes a draft step reads.

Why: on the 8B stand-in every draft step is bound by reading the drafter's weights. At 16 rows on the H100
(round_profile_b16, 937d7ec) one EAGLE-3 step took ~330 us, ~270 of them in six bf16 GEMMs over ~700 MB
(fc, qkv, o, gate_up, down and the 32,000-row head), so a depth-6 tree paid ~2 ms of drafting in a 9.9 ms
round against stock's 1 ms in 7.8 ms. FP8 (e4m3) weights halve those bytes.

Only the drafter: the target's tokens stay the target's (the verify pass is untouched), so greedy output is
exactly AR's whatever the drafter proposes; FP8 changes only which tokens it proposes, and acceptance is
measured, not assumed. Weights get one scale per output row, activations one per row at run time (both
amax / 448, e4m3's largest finite value), and CUDA runs ``torch._scaled_mm`` (FP8 tensor cores, fp32
accumulation, bf16 out). ``fp8_linear_reference`` is the same arithmetic in fp32: the CPU path and the
tests' reference.

Measured once, as first built (d91641b, H100, lifted 8B, 16 rows; ``round_profile_b16_fp8_d91641b`` in
batched_h100.json): per draft step the FP8 GEMMs took qkv 27 / o 14 / gate_up 48 / down 38 us against bf16's
38 / 15 / 81 / 41, but the head (a ``FrozenHead``, not an ``nn.Linear``) stayed bf16 at ~100 us and fc's
eager input quantization cost ~27 us, so the narrowed (6, 8) tree's round took 9.92 ms against 9.94: no gain.
Since then the head converts and fc stays bf16 (``KEEP_BF16``); that version is not yet timed, so nothing
turns it on by default.

``fp8_drafter`` returns a converted copy that shares every tensor it does not convert (the target's
embedding, say) and leaves the given drafter as it was: engines of one process share one drafter object.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
_TINY = 1e-12  # an all-zero row (a lifted model's padding) gets this amax: its codes and output stay zero


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [.., K], scale fp32 [.., 1]) with ``codes * scale`` ~ t: one scale per row."""
    tf = t.float()
    scale = tf.abs().amax(-1, keepdim=True).clamp(min=_TINY) / E4M3_MAX
    return (tf / scale).to(torch.float8_e4m3fn), scale


def fp8_linear_reference(x8, x_scale, w8, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """x8 [M, K] e4m3 with x_scale [M, 1]; w8 [N, K] e4m3 with w_scale [1, N] -> [M, N] in ``out_dtype``:
    the dequantized product in fp32 (what ``_scaled_mm`` computes, up to its summation order)."""
    y = (x8.float() * x_scale) @ (w8.float() * w_scale.reshape(-1, 1)).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


class Fp8Linear(nn.Module):
    """``nn.Linear``'s forward over FP8 weights (see the module docstring). Not an ``nn.Linear`` subclass, so
    the bf16 kernels' fusions (``models.linear._path``) pass it by and it runs as one module call."""

    def __init__(self, lin: nn.Module):
        """``lin``: an ``nn.Linear``, or any module computing ``F.linear(x, lin.weight, lin.bias)`` (an EAGLE-3
        drafter's ``FrozenHead``, whose weight is a buffer and which has no bias)."""
        super().__init__()
        weight, bias = lin.weight.detach(), getattr(lin, "bias", None)
        self.out_features, self.in_features = weight.shape
        if weight.is_cuda and (self.in_features % 16 or self.out_features % 16):  # _scaled_mm's shape rule
            raise ValueError(f"fp8 drafter weights need both dimensions divisible by 16, got {tuple(weight.shape)}")
        w8, scale = quantize_rows(weight)
        self.register_buffer("weight8", w8)
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.out_dtype = weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        x8, xs = quantize_rows(x.reshape(-1, k))
        if x.is_cuda:
            y = torch._scaled_mm(
                x8, self.weight8.t(), scale_a=xs, scale_b=self.weight_scale, bias=self.bias, out_dtype=self.out_dtype
            )
        else:
            y = fp8_linear_reference(x8, xs, self.weight8, self.weight_scale, self.bias, self.out_dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 rowwise"


# Projections left in bf16, by name. ``fc`` (an EAGLE-3 drafter's feature projection) runs once a round, outside
# the compiled layer, so its input's quantization ran as ~27 us of separate small kernels against ~4 us saved
# on its GEMM (H100, 16 rows, round_profile_b16_fp8_d91641b in batched_h100.json).
KEEP_BF16 = ("fc",)


def fp8_drafter(draft: nn.Module, target: nn.Module, keep: tuple[str, ...] = KEEP_BF16) -> nn.Module:
    """A copy of ``draft`` whose own projections (``nn.Linear``, and an EAGLE-3 ``FrozenHead``) are
    ``Fp8Linear``, except those named in ``keep``. Modules, parameters and buffers it shares with ``target``
    (an EAGLE-3 drafter's embedding, a self-drafter's layers) stay shared and unconverted: the target's
    weights must stay exact. ``draft`` itself is left as it was."""
    from ..drafters.eagle3 import FrozenHead  # here: the drafters import this package's modules

    memo: dict[int, object] = {id(t): t for t in (*target.modules(), *target.parameters(), *target.buffers())}
    shared = set(memo)
    converted = 0
    for name, m in draft.named_modules():
        if isinstance(m, (nn.Linear, FrozenHead)) and id(m) not in shared and name not in keep:
            memo[id(m)] = Fp8Linear(m)
            converted += 1
    if not converted:
        raise ValueError("draft_weights='fp8': the drafter has no projections of its own to convert")
    return copy.deepcopy(draft, memo)
