"""The verify-rows GEMM (kernels/skinny_gemm.py) against its fp32 reference, on odd shapes, in the Triton
interpreter on the CPU (on the GPU natively): 2 to 64 rows, K not a multiple of the tile, N not a multiple
of BLOCK_N, with and without bias, split-K (deterministic, counters left zero), the verify layer's fused
epilogues (silu_mul of a gate_up projection, the residual add); bad shapes refused."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import check_split_k, gemm_inputs, run_kernel_cases_in_interpreter, within_bf16_ulp

S = importlib.import_module("sglang_specpilot.kernels.skinny_gemm")

HERE = S.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernel_case = pytest.mark.skipif(not HERE, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")


def _inputs(M, N, K, bias, seed=0):
    return gemm_inputs(M, N, K, bias, seed, DEVICE)


@kernel_case
@pytest.mark.parametrize("M", [2, 7, 33])
@pytest.mark.parametrize("N,K", [(70, 200), (5, 384)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_skinny_matches_the_reference(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias)
    cfg = S.SkinnyConfig(64, 64, 1, 4, 2)
    y = S.skinny_gemm(x, w, b, config=cfg)
    assert y.shape == (M, N) and y.dtype == x.dtype
    assert within_bf16_ulp(y, S.skinny_gemm_ref(x, w, b))


@kernel_case
@pytest.mark.parametrize("M,split", [(3, 3), (64, 2)])
def test_kernel_skinny_split_k_is_deterministic_and_resets_its_counters(M, split):
    x, w, b = _inputs(M, 67, 448, True, seed=1)  # 7 K steps of 64 over 3 splits: an uneven last split
    cfg = S.SkinnyConfig(64, 64, split, 4, 2)
    run = lambda counters: S.skinny_gemm(x, w, b, counters=counters, config=cfg)  # noqa: E731
    check_split_k(run, S.skinny_gemm_ref(x, w, b), S.new_counters(DEVICE))
    # the split sum (in split order) equals the one-split result only up to rounding, never by chance
    one = S.skinny_gemm(x, w, b, config=cfg._replace(split_k=1))
    assert within_bf16_ulp(one, S.skinny_gemm_ref(x, w, b))


@kernel_case
def test_kernel_skinny_takes_leading_dims_and_strided_x():
    x, w, _ = _inputs(6, 40, 128, False, seed=3)
    wide = torch.zeros(6, 256, dtype=x.dtype, device=x.device)
    wide[:, ::2] = x
    cfg = S.SkinnyConfig(64, 64, 1, 4, 2)
    y = S.skinny_gemm(x, w, config=cfg)
    assert torch.equal(S.skinny_gemm(wide[:, ::2], w, config=cfg), y)
    assert torch.equal(S.skinny_gemm(x.view(2, 3, 128), w, config=cfg).view(6, 40), y)


@kernel_case
@pytest.mark.parametrize("M,N,K,split", [(7, 70, 200, 1), (33, 96, 576, 1), (5, 67, 448, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_skinny_residual_epilogue_is_the_unfused_add(M, N, K, split, bias):
    x, w, b = _inputs(M, N, K, bias, seed=4)
    res = torch.randn(M, N, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(DEVICE)
    cfg = S.SkinnyConfig(64, 64, split, 4, 2)
    counters = S.new_counters(DEVICE)
    # The epilogue rounds y, then adds: the unfused add of the plain output, bit for bit on the GPU.
    fused = S.skinny_gemm(x, w, b, counters, cfg, residual=res)
    unfused = res + S.skinny_gemm(x, w, b, counters, cfg)
    if S.INTERPRETED:  # the interpreter truncates fp32 -> bf16 casts: one ulp of the sum
        assert bool(((fused.float() - unfused.float()).abs() <= unfused.float().abs() * 2**-7 + 1e-6).all())
    else:
        assert torch.equal(fused, unfused)
    assert not torch.equal(fused, S.skinny_gemm(x, w, b, counters, cfg))
    assert int(counters.abs().sum()) == 0


def _act(gate_up):
    g, u = gate_up.float().chunk(2, dim=-1)
    return (g * torch.sigmoid(g) * u).to(gate_up.dtype)


@kernel_case
@pytest.mark.parametrize("M,half,K", [(7, 40, 160), (33, 67, 384), (2, 130, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_skinny_swiglu_epilogue_is_silu_mul_of_the_product(M, half, K, bias):
    x, w, b = _inputs(M, 2 * half, K, bias, seed=6)
    cfg = S.SkinnyConfig(32, 64, 3, 4, 2)  # a split config: the SwiGLU launch never splits
    y = S.skinny_gemm(x, w, b, S.new_counters(DEVICE), cfg, swiglu=True)
    assert y.shape == (M, half)
    gate_up = S.skinny_gemm(x, w, b, config=cfg._replace(split_k=1))
    # The gate and up halves rounded as the projection's output, then silu(g) * u in fp32 rounded once
    # (compiled silu_mul; eager torch rounds silu's output too): within the one rounding, whatever the fp32
    # sigmoid's last bit.
    assert within_bf16_ulp(y, _act(gate_up))
    # Against the fp32 reference: three roundings (gate, up, the product), truncations in the interpreter.
    assert within_bf16_ulp(y, S.skinny_gemm_ref(x, w, b, swiglu=True), 3 if S.INTERPRETED else 2)
    swapped = torch.cat([w[half:], w[:half]])  # gate and up the wrong way round: a different activation
    assert not torch.equal(S.skinny_gemm(x, swapped, None, config=cfg, swiglu=True), y)
    assert torch.equal(S.skinny_gemm(x, w, b, config=cfg, swiglu=True), y)  # deterministic


@kernel_case
def test_kernel_verify_layer_fuses_silu_mul_and_residuals_for_verify_rows(monkeypatch):
    # models/linear.py: a projection whose row count takes the verify GEMM (verify_rows) runs silu_mul and
    # the residual add in its epilogues; other row counts keep the modules; the A/B hook turns it off.
    from sglang_specpilot.models import linear as L
    from sglang_specpilot.models.llama import RMSNorm

    torch.manual_seed(7)
    lin = L.Linear(200, 48, bias=True).to(DEVICE, torch.bfloat16)
    w13 = L.Linear(200, 192, bias=False).to(DEVICE, torch.bfloat16)
    norm = RMSNorm(200, 1e-6).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, 7, 200, device=DEVICE, dtype=torch.bfloat16) * 2
    res = torch.randn(1, 7, 48, device=DEVICE, dtype=torch.bfloat16)
    assert L.swiglu_linear(w13, x) is None and torch.equal(L.residual_linear(lin, x, res), res + lin(x))
    for m in (lin, w13):
        m.verify_rows, m.counters = frozenset({7}), S.new_counters(DEVICE)
    assert not L.fuses_norm(lin, norm, x)  # no norm prologue on the verify GEMM
    assert L.swiglu_linear(w13, x[:, :6]) is None
    act = L.swiglu_linear(w13, x)
    assert act.shape == (1, 7, 96) and within_bf16_ulp(act[0], _act(w13(x))[0])
    assert within_bf16_ulp(L.residual_linear(lin, x, res)[0], (res + lin(x))[0])
    assert L.fused_down_projection(lin, x, res) is None  # silu in down's prologue is the one-row GEMV's
    monkeypatch.setattr(L, "FUSED_DECODE", False)
    assert L.swiglu_linear(w13, x) is None


def test_skinny_wins_on_small_weights_only_and_its_hook(monkeypatch):
    assert S.skinny_wins(33, 960, 576) and S.skinny_wins(7, 576, 1536)  # SmolLM2's projections
    assert not S.skinny_wins(33, 6144, 4096) and not S.skinny_wins(33, 49152, 576)  # the 8B's; a head
    assert not S.skinny_wins(1, 960, 576) and not S.skinny_wins(65, 960, 576)
    monkeypatch.setattr(S, "VERIFY_GEMM", "1")
    assert S.skinny_wins(33, 6144, 4096) and not S.skinny_wins(33, 49152, 576)
    monkeypatch.setattr(S, "VERIFY_GEMM", "0")
    assert not S.skinny_wins(33, 960, 576)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PDL launches on an sm_90+ GPU only")
def test_skinny_pdl_launch_equals_the_plain_launch(monkeypatch):
    # The PDL launch loads its first W tile before the wait: bit for bit the plain launch, with every
    # prologue and epilogue and a split K, and in a CUDA graph.
    from sglang_specpilot.kernels import pdl

    if not pdl.uses_pdl(torch.zeros(1, device="cuda")):
        pytest.skip("this GPU has no PDL (sm_90+)")
    x, w, b = _inputs(33, 300, 576, True, seed=8)
    res = torch.randn(33, 300, device=DEVICE).to(x.dtype)
    counters = S.new_counters(DEVICE)
    split = S.SkinnyConfig(32, 64, 3, 4, 2)
    cases = [
        lambda: S.skinny_gemm(x, w, b, counters),
        lambda: S.skinny_gemm(x[:7], w, b, counters, swiglu=True),
        lambda: S.skinny_gemm(x, w, None, counters, residual=res),
        lambda: S.skinny_gemm(x, w, b, counters, split, residual=res),
    ]
    with_pdl = [f() for f in cases]
    monkeypatch.setattr(pdl, "PDL", False)
    assert all(torch.equal(a, f()) for a, f in zip(with_pdl, cases, strict=True))
    monkeypatch.setattr(pdl, "PDL", True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = [f() for f in cases]
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, o) for a, o in zip(with_pdl, out, strict=True))


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
    with pytest.raises(ValueError, match="swiglu"):
        S.skinny_gemm(x[:4], w[:7], swiglu=True)
    with pytest.raises(ValueError, match="residual"):
        S.skinny_gemm(x[:4], w, residual=torch.zeros(3, 8, dtype=x.dtype))


def test_pick_config_fills_the_gpu_and_never_over_splits():
    # The 8B's o projection (4,096 outputs, 64 tiles of 64) splits to reach two programs an SM; the
    # gate_up (448 tiles) and the head do not split; a short K never gets more splits than 8-step parts.
    o = S.pick_config(33, 4096, 4096)
    assert o.split_k > 1 and 64 * o.split_k >= S.SMS_H200 and (4096 // o.block_k) // o.split_k >= 8
    assert S.pick_config(33, 28672, 4096).split_k == 1
    assert S.pick_config(64, 128256, 4096).split_k == 1
    assert S.pick_config(8, 576, 576).split_k == 1
    assert all(S.block_m(m) in (16, 32, 64) and S.block_m(m) >= m for m in range(2, 65))


def test_every_default_config_fits_in_shared_memory():
    # The kernel holds num_stages + 1 copies of a step's tiles; the SwiGLU launch's two W tiles at 17 to 32
    # rows with pick_config's 5 stages did not fit (245,760 bytes asked, 232,448 on the H200).
    for M in range(S.MIN_ROWS, S.MAX_ROWS + 1):
        for N, K in [(576, 576), (1536, 576), (4096, 4096), (14336, 4096)]:
            for swiglu in (False, True):
                cfg = S.fit_stages(S.pick_config(M, N, K), M, swiglu)
                assert 2 <= cfg.num_stages and (cfg.num_stages + 1) * S.stage_bytes(cfg, M, swiglu) <= S.SMEM_BYTES
    wide = S.SkinnyConfig(64, 128, 1, 4, 5)
    assert S.fit_stages(wide, 33, swiglu=True).num_stages == 3 and S.fit_stages(wide, 20, swiglu=True).num_stages == 4
    assert S.fit_stages(wide, 7, swiglu=True) == wide


# SmolLM2-135M's projections (hidden 576, 9 + 2 * 3 heads of 64, intermediate 1536): every row count a verify
# pass may use, with the epilogues the verify layer runs, at the default configs (natively only: the
# interpreter takes minutes and has no shared-memory limit).
SMOL = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the default tiles launch on a GPU only")
@pytest.mark.parametrize("proj", list(SMOL))
def test_skinny_default_configs_launch_at_every_verify_row_count(proj):
    N, K = SMOL[proj]
    counters = S.new_counters("cuda")
    for M in range(S.MIN_ROWS, S.MAX_ROWS + 1):
        x, w, _ = _inputs(M, N, K, False, seed=M)
        plain = S.skinny_gemm(x, w, None, counters)
        assert within_bf16_ulp(plain, S.skinny_gemm_ref(x, w)), M
        if proj == "gate_up":  # silu_mul of the plain product, rounded once
            assert within_bf16_ulp(S.skinny_gemm(x, w, None, counters, swiglu=True), _act(plain)), M
        elif proj in ("o", "down"):  # the unfused add, bit for bit
            r = torch.randn(M, N, device="cuda").to(torch.bfloat16)
            assert torch.equal(S.skinny_gemm(x, w, None, counters, residual=r), r + plain), M
        assert int(counters.abs().sum()) == 0


def test_kernel_cases_in_interpreter():
    # The kernel cases above, in a child process with TRITON_INTERPRET=1 (set before triton's import).
    if S.INTERPRETED or torch.cuda.is_available():
        pytest.skip("the kernel cases run in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel_ and not interpreter")
