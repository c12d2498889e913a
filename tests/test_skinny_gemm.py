"""The verify-rows GEMM (kernels/skinny_gemm.py) against its fp32 reference, on odd shapes, in the Triton
interpreter on the CPU (on the GPU natively): 2 to 64 rows, K not a multiple of the tile, N not a multiple
of BLOCK_N, with and without bias, split-K (deterministic, counters left zero); bad shapes refused."""

from __future__ import annotations

import importlib

import pytest
import torch

S = importlib.import_module("sglang_specpilot.kernels.skinny_gemm")

HERE = S.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernel_case = pytest.mark.skipif(not HERE, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")


def _inputs(M, N, K, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(N, generator=g).to(torch.bfloat16).to(DEVICE) if bias else None
    return x, w, b


def _within_ulp(y, ref) -> bool:
    # One bf16 rounding of an fp32 sum taken in another order: within one bf16 ulp of the reference.
    return bool(((y.float() - ref.float()).abs() <= ref.float().abs().clamp_min(1e-3) * 2**-7).all())


@kernel_case
@pytest.mark.parametrize("M", [2, 7, 33])
@pytest.mark.parametrize("N,K", [(70, 200), (5, 384)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_skinny_matches_the_reference(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias)
    cfg = S.SkinnyConfig(64, 64, 1, 4, 2)
    y = S.skinny_gemm(x, w, b, config=cfg)
    assert y.shape == (M, N) and y.dtype == x.dtype
    assert _within_ulp(y, S.skinny_gemm_ref(x, w, b))


@kernel_case
@pytest.mark.parametrize("M,split", [(3, 3), (64, 2)])
def test_kernel_skinny_split_k_is_deterministic_and_resets_its_counters(M, split):
    x, w, b = _inputs(M, 67, 448, True, seed=1)  # 7 K steps of 64 over 3 splits: an uneven last split
    counters = S.new_counters(DEVICE)
    cfg = S.SkinnyConfig(64, 64, split, 4, 2)
    y = S.skinny_gemm(x, w, b, counters=counters, config=cfg)
    assert _within_ulp(y, S.skinny_gemm_ref(x, w, b))
    assert int(counters.abs().sum()) == 0
    assert torch.equal(S.skinny_gemm(x, w, b, counters=counters, config=cfg), y)
    # the split sum (in split order) equals the one-split result only up to rounding, never by chance
    one = S.skinny_gemm(x, w, b, config=cfg._replace(split_k=1))
    assert _within_ulp(one, S.skinny_gemm_ref(x, w, b))


@kernel_case
def test_kernel_skinny_takes_leading_dims_and_strided_x():
    x, w, _ = _inputs(6, 40, 128, False, seed=3)
    wide = torch.zeros(6, 256, dtype=x.dtype, device=x.device)
    wide[:, ::2] = x
    cfg = S.SkinnyConfig(64, 64, 1, 4, 2)
    y = S.skinny_gemm(x, w, config=cfg)
    assert torch.equal(S.skinny_gemm(wide[:, ::2], w, config=cfg), y)
    assert torch.equal(S.skinny_gemm(x.view(2, 3, 128), w, config=cfg).view(6, 40), y)


def test_skinny_refuses_bad_shapes_and_missing_counters():
    x, w, _ = _inputs(65, 8, 64, False)
    with pytest.raises(ValueError, match="2 to 64 rows"):
        S.skinny_gemm(x, w)
    with pytest.raises(ValueError, match="2 to 64 rows"):
        S.skinny_gemm(x[:1], w)
    with pytest.raises(ValueError, match="does not take"):
        S.skinny_gemm(x[:4], w[:, :32])
    with pytest.raises(ValueError, match="counters"):
        S.skinny_gemm(x[:4], w, config=S.SkinnyConfig(64, 32, 2, 4, 2))


def test_pick_config_fills_the_gpu_and_never_over_splits():
    # The 8B's o projection (4,096 outputs, 64 tiles of 64) splits to reach two programs an SM; the
    # gate_up (448 tiles) and the head do not split; a short K never gets more splits than 8-step parts.
    o = S.pick_config(33, 4096, 4096)
    assert o.split_k > 1 and 64 * o.split_k >= S.SMS_H200 and (4096 // o.block_k) // o.split_k >= 8
    assert S.pick_config(33, 28672, 4096).split_k == 1
    assert S.pick_config(64, 128256, 4096).split_k == 1
    assert S.pick_config(8, 576, 576).split_k == 1
    assert all(S.block_m(m) in (16, 32, 64) and S.block_m(m) >= m for m in range(2, 65))
