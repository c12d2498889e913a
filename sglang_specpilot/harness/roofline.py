"""Roofline floors and the measured peaks they are computed from.

A kernel cannot run faster than the larger of its FLOP time (FLOPs over the peak FLOP rate) and its
byte time (the fewest bytes it must move over peak bandwidth). Peaks are measured on the machine, not
read from a datasheet: a large GEMV for bandwidth, a large GEMM for the FLOP rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .jsonable import JsonMixin
from .timing import paired_timing


@dataclass(frozen=True)
class Peaks(JsonMixin):
    """Measured peak rates; ``device`` labels where (``"cpu"`` on a CPU), ``dtype`` the GEMM's type."""

    hbm_TBps: float
    bf16_TFLOPs: float
    device: str = "cuda"
    dtype: str = "bfloat16"

    @property
    def bytes_per_s(self) -> float:
        return self.hbm_TBps * 1e12

    @property
    def flops_per_s(self) -> float:
        return self.bf16_TFLOPs * 1e12


@dataclass(frozen=True)
class Floor(JsonMixin):
    """Lower bound on a kernel's time: ``time_s = max(flop_time_s, byte_time_s)``."""

    flops: float
    bytes: float
    flop_time_s: float
    byte_time_s: float
    time_s: float
    bound: str  # "flops" or "bytes", whichever term is larger


def floor_time(flops: float, nbytes: float, peaks: Peaks) -> Floor:
    """Floor of work doing ``flops`` floating-point operations and moving ``nbytes`` bytes."""
    flop_t = flops / peaks.flops_per_s
    byte_t = nbytes / peaks.bytes_per_s
    return Floor(
        flops=float(flops),
        bytes=float(nbytes),
        flop_time_s=flop_t,
        byte_time_s=byte_t,
        time_s=max(flop_t, byte_t),
        bound="flops" if flop_t >= byte_t else "bytes",
    )


def gemm_floor(M: int, N: int, K: int, peaks: Peaks, *, weight_bytes: float = 2.0, act_bytes: float = 2.0) -> Floor:
    """Floor of ``Y[M, N] = X[M, K] @ W[N, K]^T``.

    FLOPs ``2 M N K``; bytes ``N K weight_bytes`` (weights read once) ``+ (M K + M N) act_bytes``
    (activations read, output written). ``weight_bytes=1.5`` models W12.
    """
    return floor_time(2.0 * M * N * K, N * K * weight_bytes + (M * K + M * N) * act_bytes, peaks)


def attention_floor(
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    peaks: Peaks,
    *,
    kv_heads: int | None = None,
    kv_bytes: float = 2.0,
    act_bytes: float = 2.0,
) -> Floor:
    """Floor of one attention call over a KV cache.

    FLOPs ``4 batch heads q_len kv_len head_dim`` (QK^T and PV, no credit for masked-out entries, so
    the floor is an upper bound for causal or tree masks); bytes: K and V read once
    (``2 batch kv_heads kv_len head_dim kv_bytes``) plus Q read and O written
    (``2 batch heads q_len head_dim act_bytes``). ``kv_heads`` defaults to ``heads`` (no GQA).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    flops = 4.0 * batch * heads * q_len * kv_len * head_dim
    kv = 2.0 * batch * kv_heads * kv_len * head_dim * kv_bytes
    q_and_o = 2.0 * batch * heads * q_len * head_dim * act_bytes
    nbytes = kv + q_and_o
    return floor_time(flops, nbytes, peaks)


def decode_step_floor(param_bytes: float, kv_bytes: float, flops: float, peaks: Peaks) -> Floor:
    """Floor of a whole decode (or verify) step: every parameter and the KV cache read once."""
    return floor_time(flops, param_bytes + kv_bytes, peaks)


def measure_peaks(
    device: str | torch.device = "cuda",
    *,
    gemv_shape: tuple[int, int] | None = None,
    gemm_size: int | None = None,
    copies: int = 3,
    blocks: int = 10,
) -> Peaks:
    """Measure peak memory bandwidth (large GEMV) and matrix FLOP rate (large GEMM) on ``device``.

    Parameters
    ----------
    device : str or torch.device
        ``"cuda"`` (CUDA events, bf16) or ``"cpu"`` (wall clock, float32 since CPUs often lack fast
        bf16 GEMMs; labelled in ``Peaks.dtype``).
    gemv_shape : (K, N), optional
        GEMV ``y[1, N] = x[1, K] @ W[N, K]^T``; default (4096, 128256) on GPU, a Llama-3 LM head: 1.05 GB
        of bf16 weights per copy, far beyond L2. Default (1024, 16384) on CPU.
    gemm_size : int, optional
        Square GEMM side; default 8192 on GPU (1.1 TFLOP per call), 512 on CPU.
    copies : int
        Weight copies the GEMV rotates through, so no call finds its weights in cache.
    blocks : int
        Timing blocks; the median time is used.

    Returns
    -------
    Peaks
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    K, N = gemv_shape or ((4096, 128256) if on_gpu else (1024, 16384))
    side = gemm_size or (8192 if on_gpu else 512)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        # Random data, never zeros: a GEMM on zeros runs faster than on real values.
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    x = randn(1, K)
    weights = [randn(N, K) for _ in range(copies)]
    gemv = [lambda w=w: torch.mm(x, w.t()) for w in weights]
    a, b = randn(side, side), randn(side, side)
    times = paired_timing(
        {"gemv": gemv, "gemm": lambda: torch.mm(a, b)},
        blocks=blocks,
        warmup=2,
        inner=2,
        device=device,
        clock=time.perf_counter,
    )
    elt = torch.finfo(dtype).bits // 8
    gemv_bytes = (N * K + K + N) * elt
    return Peaks(
        hbm_TBps=gemv_bytes / times.median("gemv") / 1e12,
        bf16_TFLOPs=2.0 * side**3 / times.median("gemm") / 1e12,
        device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        dtype=str(dtype).removeprefix("torch."),
    )
