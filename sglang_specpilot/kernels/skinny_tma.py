"""BF16 GEMM for verify-sized row counts through Hopper's TMA: ``y = x @ W^T (+ bias)`` for 2 to 64 rows of
x, and the launcher. Its reference is ``skinny_tma_ref`` (``skinny_gemm.skinny_gemm_ref``: the same product).

Why another kernel: ``skinny_gemm.py`` loads its tiles with per-thread pointer arithmetic (cp.async) and
lost to cuBLAS at every row count on the 8B's projections (geomean 0.92-0.97x at 4-16 rows, 0.62x at 33,
0.81x at 64; skinny_gemm_h200.json, 6e058fb), while the one-row GEMV reaches the weight-byte floor within
20%. A 33-row verify pass of the lifted 8B spent 4.14 ms in cuBLAS GEMMs against 3.64 ms for the same
weights read at one row (round_profile_h200.json), which is most of what keeps the 64-row verify at 1.35x
the one-row step (issue 12's goal: 1.08x).

What differs here:
- Tiles come through tensor descriptors (TMA bulk copies into shared memory, pipelined over ``num_stages``
  by the compiler with mbarriers): no address registers, no masks. The hardware fills rows and columns
  past the tensor's edge with zeros, so x's tile of ``BLOCK_M`` rows past M and the last K step cost no
  memory traffic and no branch (``skinny_gemm`` re-reads x's rows ``m % M`` instead).
- Wider weight tiles by default (``BLOCK_N`` 128, the MMA's M side, swap-AB as in ``skinny_gemm``): x's
  tile is re-read from L2 by every program, so a 64-row x tile beside a 64-row W tile doubled the bytes
  each SM moved; at 128 rows of W it is half as much.
- Split-K and the epilogue are ``skinny_gemm``'s (``_split_k_sum``: fp32 partials, a ticket per output tile,
  the last program sums in split order and resets its ticket; ``_finish``), the factor from a model
  of bytes moved over busy program slots (``wave_split``): at 48 tiles (the 8B's qkv in 128-row tiles) and
  one program an SM, skinny_gemm's rule gives 192 programs, two waves of which the second is 45% full.

Requirements of TMA, checked by ``takes``: K a multiple of 8 (16-byte row strides) and 16-byte aligned
bases; anything else goes to ``skinny_gemm`` or cuBLAS. Measured (H100, a02a30b, skinny_tma_h100.json, the
8B's four per-layer projections): ``pick_config``'s launch is 0.97 / 0.98 / 0.94 / 0.82 / 0.74x cuBLAS
(geomean at M = 4 / 8 / 16 / 33 / 64), the best of a short sweep 1.02 / 1.02 / 1.01 / 0.92 / 0.88x. Unsplit
launches fail the bench's one-ulp check at long K (down) and at gate_up, M = 64: outputs near zero, where the
relative rule is tighter than cuBLAS itself meets (the tensor cores' fp32 accumulation drifts over one long
chain; split-K's shorter chains do not; ``probes/tma_numerics_probe.py``, skinny_tma_h100.json's
attachments). It does not beat cuBLAS
where the verify pass needs it (33-64 rows), so ``tma_wins`` stays False unless SPECPILOT_TMA_GEMM=1. In the
Triton interpreter (CPU tests) the descriptors are emulated.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launch import interpreted
from .skinny_gemm import (
    MAX_ROWS,
    MAX_SKINNY_N,
    MIN_ROWS,
    SMALL_WEIGHT,
    SMEM_BYTES,
    SMS_H200,
    _finish,
    _split_k_sum,
    block_m,
    skinny_gemm_ref,
    split_k_workspace,
    verify_rows_operands,
)

SMS = SMS_H200  # the H100's and H200's SM count (132)

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton before 3.4 has no host-side tensor descriptors
    TensorDescriptor = None


class TmaConfig(NamedTuple):
    block_n: int  # weight rows per program (the MMA's M side)
    block_k: int  # reduction columns a step
    split_k: int  # programs per output tile along K (1: none)
    num_warps: int
    num_stages: int


def stage_bytes(block_n: int, block_k: int, M: int) -> int:
    """Shared memory one pipeline stage holds: a W tile and an x tile, bf16."""
    return (block_n + block_m(M)) * block_k * 2


def wave_split(M: int, N: int, K: int, block_n: int, block_k: int, ctas_per_sm: int, sms: int = SMS) -> int:
    """The split-K factor (1 to 8, at least 4 K steps a split) of least modelled cost: the bytes moved (the
    weights, plus each split's fp32 partials written and read back, plus a pipeline fill of two W tiles a
    program) over the fraction of the GPU's program slots (``sms`` x ``ctas_per_sm``) its waves keep busy.
    A model to start from, not a measurement: ``benchmarks/skinny_tma_bench.py`` sweeps the factor."""
    tiles, k_steps = triton.cdiv(N, block_n), triton.cdiv(K, block_k)
    slots = sms * max(1, ctas_per_sm)
    best, best_cost = 1, float("inf")
    for s in range(1, max(1, min(8, k_steps // 4)) + 1):
        programs = tiles * s
        busy = programs / (-(-programs // slots) * slots)
        moved = N * K * 2 + (2 * s * M * N * 4 if s > 1 else 0) + programs * 2 * block_n * block_k * 2
        cost = moved / busy
        if cost < best_cost * 0.98:  # the smaller split unless the larger saves 2%
            best, best_cost = s, cost
    return best


def pick_config(M: int, N: int, K: int, block_n: int = 128, block_k: int = 128, num_warps: int = 4) -> TmaConfig:
    """The launch shape from (M, N, K) only (graph- and compile-safe): as many stages as fit in the shared
    memory with one stage of headroom (at most 6), and ``wave_split``'s split."""
    stage = stage_bytes(block_n, block_k, M)
    stages = max(2, min(6, SMEM_BYTES // stage - 1))
    ctas = max(1, SMEM_BYTES // (stages * stage + 1024))
    split = wave_split(M, N, K, block_n, block_k, ctas)
    return TmaConfig(block_n, block_k, split, num_warps, stages)


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether TMA can read these operands: bf16/fp16, K-contiguous rows of 16-byte multiples, aligned bases."""
    if TensorDescriptor is None or x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    K = x.shape[-1]
    return (
        K % 8 == 0
        and weight.stride(-1) == 1
        and weight.stride(0) % 8 == 0
        and weight.data_ptr() % 16 == 0
        and x.data_ptr() % 16 == 0
    )


# A benchmarking hook for engine A/B runs in separate processes (the choice is baked into compiled blocks and
# captured graphs): SPECPILOT_TMA_GEMM=1 gives every verify-sized projection of a weight past skinny_gemm's
# SMALL_WEIGHT (the 8B's; no vocabulary head) to this kernel; unset or 0, none.
TMA_GEMM = os.environ.get("SPECPILOT_TMA_GEMM", "0")


def tma_wins(M: int, N: int, K: int) -> bool:
    """Whether the engine gives a verify-sized projection to this kernel: only under SPECPILOT_TMA_GEMM=1
    (it measured slower than cuBLAS at the verify pass's row counts, above)."""
    return TMA_GEMM == "1" and MIN_ROWS <= M <= MAX_ROWS and N <= MAX_SKINNY_N and N * K > SMALL_WEIGHT and K % 8 == 0


@triton.jit(do_not_specialize=["M", "split_k"])
def _tma_kernel(
    w_desc,
    x_desc,
    b_ptr,
    y_ptr,
    part_ptr,
    counter_ptr,
    M,
    N,
    K,
    stride_ym,
    split_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_steps, split_k)
    s0 = pid_k * per_split
    s1 = tl.minimum(s0 + per_split, k_steps)
    off_n = pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for s in range(s0, s1):
        w = w_desc.load([off_n, s * BLOCK_K])
        x = x_desc.load([0, s * BLOCK_K])
        if UPCAST:  # the interpreter's bf16 dot is not reliable: multiply in fp32 there (exact products)
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc)

    rows = off_n + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    n_ok = rows < N
    out_mask = n_ok[:, None] & (ms < M)[None, :]
    if split_k == 1:
        _finish(acc, acc, y_ptr, stride_ym, rows, ms, out_mask, b_ptr, b_ptr, 0, n_ok, N, HAS_BIAS, False, False)
    else:
        last, total = _split_k_sum(acc, part_ptr, counter_ptr, pid_n, pid_k, split_k, rows, ms, out_mask, M, N)
        if last:
            _finish(total, total, y_ptr, stride_ym, rows, ms, out_mask, b_ptr, b_ptr, 0, n_ok, N, HAS_BIAS, False,
                    False)  # fmt: skip


INTERPRETED = interpreted(_tma_kernel)


def skinny_tma(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    config: TmaConfig | None = None,
) -> torch.Tensor:
    """``x [..., K]`` (2 to 64 rows in all) times ``weight [N, K]``^T (+ ``bias [N]``) -> ``[..., N]`` in x's
    dtype. ``counters`` (``skinny_gemm.new_counters``) is needed when the config splits K. Raises
    ``ValueError`` for operands TMA cannot read (``takes``)."""
    x2, lead, M, N, K = verify_rows_operands("skinny_tma", x, weight, bias)
    if x2.stride(-1) != 1 or x2.stride(0) != K or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # TMA reads 16-byte aligned rows
    if not takes(x2, weight):
        raise ValueError("skinny_tma needs bf16/fp16 operands with K % 8 == 0, K-contiguous and 16-byte aligned")
    cfg = config or pick_config(M, N, K)
    bm = block_m(M)
    tiles = triton.cdiv(N, cfg.block_n)
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    part, counters = split_k_workspace(cfg.split_k, M, N, tiles, counters, x.device)
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    x_desc = TensorDescriptor.from_tensor(x2, [bm, cfg.block_k])
    _tma_kernel[(tiles, cfg.split_k)](
        w_desc,
        x_desc,
        bias if bias is not None else weight,  # unused without HAS_BIAS
        y,
        part,
        counters,
        M,
        N,
        K,
        y.stride(0),
        cfg.split_k,
        BLOCK_M=bm,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        HAS_BIAS=bias is not None,
        UPCAST=INTERPRETED,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y.reshape(*lead, N)


@torch.library.custom_op("specpilot::skinny_tma", mutates_args=())
def _tma_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, counters: torch.Tensor) -> torch.Tensor:
    # Opaque to torch.compile: the descriptors and the config are made here, in eager code, from static shapes.
    # ``counters`` is scratch the launch returns to zero (as in skinny_gemm's op).
    return skinny_tma(x, weight, bias, counters)


@_tma_op.register_fake
def _(x, weight, bias, counters):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def tma_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, counters: torch.Tensor):
    """``skinny_tma`` with ``pick_config``'s launch shape, as one op a compiled graph calls (``models/linear.py``)."""
    return _tma_op(x, weight, bias, counters)


def skinny_tma_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: fp32 products and sums, one rounding to x's dtype (``skinny_gemm``'s, the same product)."""
    return skinny_gemm_ref(x, weight, bias)
