"""The TMA verify-rows GEMM (kernels/skinny_tma.py) against skinny_gemm's fp32 reference, on odd shapes, in the
Triton interpreter on the CPU (natively on a GPU): 2 to 64 rows (x's tile past M read as zeros), K and N not
multiples of the tile (the descriptors' zero fill), with and without bias, split-K (deterministic, counters
left zero), the default config; operands TMA cannot read refused in one line."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import check_split_k, gemm_inputs, kernel_cases, within_bf16_ulp

T = importlib.import_module("sglang_specpilot.kernels.skinny_tma")
S = importlib.import_module("sglang_specpilot.kernels.skinny_gemm")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, T, "_tma_kernel")


def _inputs(M, N, K, bias, seed=0):
    return gemm_inputs(M, N, K, bias, seed, DEVICE)


@kernel_case
@pytest.mark.parametrize("M", [2, 7, 33, 64])
@pytest.mark.parametrize("N,K", [(70, 200), (5, 384), (130, 136)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_tma_matches_the_reference(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias)
    y = T.skinny_tma(x, w, b, config=T.TmaConfig(64, 64, 1, 4, 2))
    assert y.shape == (M, N) and y.dtype == x.dtype
    assert within_bf16_ulp(y, T.skinny_tma_ref(x, w, b))


@kernel_case
@pytest.mark.parametrize("M,split", [(3, 3), (64, 2)])
def test_kernel_tma_split_k_is_deterministic_and_resets_its_counters(M, split):
    x, w, b = _inputs(M, 67, 448, True, seed=1)  # 7 K steps of 64 over 3 splits: an uneven last split
    cfg = T.TmaConfig(64, 64, split, 4, 2)
    run = lambda counters: T.skinny_tma(x, w, b, counters=counters, config=cfg)  # noqa: E731
    check_split_k(run, T.skinny_tma_ref(x, w, b), S.new_counters(DEVICE))


@kernel_case
def test_kernel_tma_default_config_and_leading_dims():
    x, w, _ = _inputs(12, 300, 256, False, seed=2)
    cfg = T.pick_config(12, 300, 256)
    assert cfg.block_n == 128 and cfg.split_k >= 1 and T.stage_bytes(128, 128, 12) * cfg.num_stages < S.SMEM_BYTES
    y = T.skinny_tma(x.view(3, 4, 256), w, counters=S.new_counters(DEVICE))
    assert y.shape == (3, 4, 300) and within_bf16_ulp(y.reshape(12, 300), T.skinny_tma_ref(x, w))


@kernel_case
def test_kernel_linear_takes_the_tma_rows_and_misaligned_x():
    # models/linear.Linear runs the kernel (through its custom op) for the row counts in tma_rows; an x that
    # starts off a 16-byte boundary (a slice) is copied, not refused.
    from sglang_specpilot.models.linear import Linear

    lin = Linear(256, 300, bias=True).to(DEVICE, torch.bfloat16)
    lin.tma_rows, lin.counters = frozenset({5}), S.new_counters(DEVICE)
    x = torch.randn(6 * 256 + 1, device=DEVICE).to(torch.bfloat16)[1:].view(6, 256)[:5]
    assert x.data_ptr() % 16
    ref = T.skinny_tma_ref(x, lin.weight.detach(), lin.bias.detach())
    assert within_bf16_ulp(lin(x), ref)
    assert int(lin.counters.abs().sum()) == 0


def test_tma_wins_only_under_the_ab_switch(monkeypatch):
    assert not T.tma_wins(33, 6144, 4096)  # not chosen: slower than cuBLAS at verify rows (skinny_tma_h100.json)
    monkeypatch.setattr(T, "TMA_GEMM", "1")
    assert T.tma_wins(33, 6144, 4096) and T.tma_wins(2, 4096, 14336)
    assert not T.tma_wins(1, 6144, 4096) and not T.tma_wins(65, 6144, 4096)  # the GEMV's and cuBLAS's rows
    assert not T.tma_wins(33, 960, 576)  # SmolLM2's weights stay with skinny_gemm (launch-bound)
    assert not T.tma_wins(33, 128256, 4096)  # no vocabulary head


def test_operands_tma_cannot_read_are_refused():
    x, w, _ = _inputs(4, 16, 100, False)  # 200-byte rows: not a multiple of 16
    assert not T.takes(x, w)
    with pytest.raises(ValueError, match="K % 8"):
        T.skinny_tma(x, w)
    x, w, _ = _inputs(1, 16, 64, False)
    with pytest.raises(ValueError, match="2 to 64 rows"):
        T.skinny_tma(x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the default launch shapes run on a GPU only")
@pytest.mark.parametrize("proj,N,K", [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                      ("down", 4096, 14336)])  # fmt: skip
def test_tma_default_configs_launch_at_every_verify_row_count(proj, N, K):
    # Llama-3.1-8B's projections at pick_config's launch shape, every row count a verify pass may use.
    counters = S.new_counters("cuda")
    for M in range(S.MIN_ROWS, S.MAX_ROWS + 1):
        x, w, _ = _inputs(M, N, K, False, seed=M)
        y = T.skinny_tma(x, w, None, counters)
        assert within_bf16_ulp(y, T.skinny_tma_ref(x, w)), (proj, M)
        assert torch.equal(T.skinny_tma(x, w, None, counters), y) and int(counters.abs().sum()) == 0, (proj, M)
