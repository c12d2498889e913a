"""The decode GEMV (kernels/gemv.py) against its fp32 reference, on odd shapes, in the Triton interpreter on
the CPU (on the GPU natively): rows 1 to MAX_ROWS, K not a multiple of the tile, N not a multiple of BLOCK_N,
with and without bias, strided x; deterministic; bad shapes refused in one line."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter

G = importlib.import_module("sglang_specpilot.kernels.gemv")  # the module (the package exports the function)

HERE = G.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernel_case = pytest.mark.skipif(not HERE, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")


def _inputs(M, N, K, bias, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


@kernel_case
@pytest.mark.parametrize("M", [1, 3, 4])
@pytest.mark.parametrize("N,K", [(37, 100), (96, 576), (5, 1030)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_gemv_matches_the_reference(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias)
    y = G.gemv(x, w, b)
    ref = G.gemv_ref(x, w, b)
    assert y.shape == (M, N) and y.dtype == x.dtype
    # One bf16 rounding of an fp32 sum taken in another order: within one bf16 ulp of the reference.
    ulp = ref.float().abs().clamp_min(1e-3) * 2**-7
    assert bool(((y.float() - ref.float()).abs() <= ulp).all())
    assert torch.equal(G.gemv(x, w, b), y)  # deterministic


@kernel_case
def test_kernel_gemv_takes_leading_dims_strided_x_and_every_tile():
    x, w, _ = _inputs(2, 40, 300, False, seed=3)
    wide = torch.zeros(2, 600, dtype=x.dtype, device=x.device)
    wide[:, ::2] = x  # a strided view: copied to contiguous rows
    ref = G.gemv_ref(x, w)
    assert torch.equal(G.gemv(wide[:, ::2], w), G.gemv(x, w))
    assert torch.equal(G.gemv(x.view(1, 2, 300), w).view(2, 40), G.gemv(x, w))
    for cfg in (G.GemvConfig(4, 64, 4), G.GemvConfig(32, 128, 4), G.GemvConfig(8, 512, 2)):
        y = G.gemv(x, w, config=cfg)
        assert bool(((y.float() - ref.float()).abs() <= ref.float().abs().clamp_min(1e-3) * 2**-7).all()), cfg


def _close(y, ref, ulps=1):
    # Within ``ulps`` bf16 ulps of the reference (relative, clamped near zero), as the plain GEMV's test.
    return bool(((y.float() - ref.float()).abs() <= ref.float().abs().clamp_min(1e-3) * ulps * 2**-7).all())


def _close_dot(y, ref, w, xin, ulps=2):
    # A dot product's rounding bound: each of the ``ulps`` roundings of an input (the prologue rounds its
    # values where the unfused ops do) moves a term by at most one bf16 ulp (2**-7 relative, the
    # interpreter's truncating casts included), so the sum moves by at most ulps * 2**-7 * sum_k |w||x|,
    # plus one rounding of the output.
    bound = (w.float().abs() @ xin.float().abs().reshape(-1)) * ulps * 2**-7 + ref.float().abs() * 2**-7
    return bool(((y.float() - ref.float()).abs().reshape(-1) <= bound + 1e-6).all())


@kernel_case
@pytest.mark.parametrize("N,K", [(37, 100), (96, 576), (5, 1030)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_gemv_fused_silu_and_residual_match_the_reference(N, K, bias):
    from sglang_specpilot.models.llama import silu_mul

    x, w, b = _inputs(1, N, K, bias, seed=5)
    g = torch.Generator().manual_seed(7)
    res = torch.randn(1, N, generator=g).to(x.dtype).to(DEVICE)
    gu = torch.randn(1, 2 * K, generator=g).to(x.dtype).to(DEVICE)
    # The residual epilogue rounds y, then adds: bit for bit the unfused add of the plain GEMV's output on
    # the GPU. The interpreter (Triton 3.6) truncates fp32 -> bf16 casts instead of rounding to nearest
    # (2.8418 -> 2.8281, not 2.8438), so there its sum is within one ulp.
    fused_add, unfused_add = G.gemv(x, w, b, residual=res), res + G.gemv(x, w, b)
    assert torch.equal(fused_add, unfused_add) if not G.INTERPRETED else _close(fused_add, unfused_add, 1)
    # silu_mul in the prologue (x holds gate | up), with the residual.
    xs = silu_mul(gu)
    y = G.gemv(gu, w, b, silu=True, residual=res)
    assert _close_dot(y, G.gemv_ref(gu, w, b, silu=True, residual=res), w, xs)
    assert _close_dot(y, res + G.gemv(xs, w, b), w, xs)
    assert not _close_dot(y, res + G.gemv(gu[:, :K], w, b), w, xs)
    assert torch.equal(G.gemv(gu, w, b, silu=True, residual=res), y)  # deterministic


@kernel_case
def test_kernel_down_projection_fuses_silu_and_residual_only_for_one_row():
    from sglang_specpilot.models.linear import Linear, fused_down_projection
    from sglang_specpilot.models.llama import silu_mul

    torch.manual_seed(1)
    w2 = Linear(160, 96, bias=False).to(DEVICE, torch.bfloat16)
    w2.decode_gemv = True
    gu2 = torch.randn(1, 2, 320, device=DEVICE, dtype=torch.bfloat16)
    h2 = torch.randn(1, 2, 96, device=DEVICE, dtype=torch.bfloat16)
    # Two rows: not fused (None), so the block runs the unfused ops.
    assert fused_down_projection(w2, gu2, h2) is None
    # One row: the fused GEMV, within rounding of the unfused chain.
    gu, h = gu2[:, :1], h2[:, :1]
    y = fused_down_projection(w2, gu, h)
    xs = silu_mul(gu)
    assert y.shape == h.shape and _close_dot(y, h + w2(xs), w2.weight, xs, 3)
    assert not _close_dot(y, h + w2(gu[..., :160]), w2.weight, xs, 3)  # silu_mul did something
    w2.decode_gemv = False  # off: not fused
    assert fused_down_projection(w2, gu, h) is None


@kernel_case
@pytest.mark.parametrize("N,K", [(37, 100), (96, 576), (5, 1024)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_gemv_norm_prologue_matches_the_reference(N, K, bias):
    from sglang_specpilot.models.llama import rms_norm

    x, w, b = _inputs(1, N, K, bias, seed=11)
    x = x * 3  # a row whose rms is not 1, so a missing norm shows
    nw = (1 + torch.randn(K, generator=torch.Generator().manual_seed(12)) / 4).to(x.dtype).to(DEVICE)
    y = G.gemv(x, w, b, norm=nw, eps=1e-5)
    xn = rms_norm(x, nw, 1e-5)
    # Two roundings in the prologue (x * rstd, then the weight), as the unfused ops round, and rstd from an
    # fp32 sum in another order: within the dot bound of the unfused chain and of the reference.
    assert _close_dot(y, G.gemv_ref(x, w, b, norm=nw, eps=1e-5), w, xn, 3)
    assert _close_dot(y, G.gemv(xn, w, b), w, xn, 3)
    # Negative controls, against the fused result's own distance from the unfused chain (the dot bound is a
    # worst case, too loose at K = 1024 to tell a missing weight): no norm, or the norm without its weight.
    err = (y.float() - G.gemv(xn, w, b).float()).abs().max().clamp_min(1e-3)
    for wrong in (G.gemv(x, w, b), G.gemv(rms_norm(x, torch.ones_like(nw), 1e-5), w, b)):
        assert (y.float() - wrong.float()).abs().max() > 8 * err
    assert torch.equal(G.gemv(x, w, b, norm=nw, eps=1e-5), y)  # deterministic


@kernel_case
def test_kernel_block_fuses_norms_and_the_o_residual_only_where_the_row_fits_one_tile(monkeypatch):
    from sglang_specpilot.models import linear as L
    from sglang_specpilot.models.llama import RMSNorm

    torch.manual_seed(2)
    lin = L.Linear(200, 48, bias=True).to(DEVICE, torch.bfloat16)
    norm = RMSNorm(200, 1e-6).to(DEVICE, torch.bfloat16)
    norm.weight.data = (1 + torch.randn(200) / 4).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, 1, 200, device=DEVICE, dtype=torch.bfloat16) * 2
    assert not L.fuses_norm(lin, norm, x)  # decode_gemv off
    lin.decode_gemv = True
    assert L.fuses_norm(lin, norm, x) and not L.fuses_norm(lin, norm, x.expand(1, 2, 200))  # one row only
    y = L.normed_linear(lin, norm, x)
    assert y.shape == (1, 1, 48) and _close_dot(y, lin(norm(x)), lin.weight, norm(x), 3)
    res = torch.randn(1, 1, 48, device=DEVICE, dtype=torch.bfloat16)
    fused_add = L.residual_linear(lin, norm(x), res)
    assert torch.equal(fused_add, res + lin(norm(x))) if not G.INTERPRETED else _close(fused_add, res + lin(norm(x)))
    wide = L.Linear(1100, 48, bias=False).to(DEVICE, torch.bfloat16)
    wide.decode_gemv = True
    assert not L.fuses_norm(wide, RMSNorm(1100, 1e-6).to(DEVICE, torch.bfloat16), torch.zeros(1, 1100))
    monkeypatch.setattr(L, "FUSED_NORM", False)  # the A/B hook: the two modules
    assert not L.fuses_norm(lin, norm, x) and torch.equal(L.normed_linear(lin, norm, x), lin(norm(x)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PDL launches on an sm_90+ GPU only")
def test_pdl_launch_equals_the_plain_launch(monkeypatch):
    # The PDL launch (kernels/pdl.py) runs the same kernel with its first W tile loaded before the wait:
    # bit for bit the plain launch, with every prologue and epilogue, and in a CUDA graph.
    from sglang_specpilot.kernels import pdl

    if not pdl.uses_pdl(torch.zeros(1, device="cuda")):
        pytest.skip("this GPU has no PDL (sm_90+)")
    x, w, b = _inputs(1, 300, 1030, True, seed=4)
    gu = torch.randn(1, 2 * 1030, device=DEVICE).to(x.dtype)
    res = torch.randn(1, 300, device=DEVICE).to(x.dtype)
    nw = torch.rand(576, device=DEVICE).to(x.dtype) + 0.5
    cases = [
        lambda: G.gemv(x, w, b),
        lambda: G.gemv(gu, w, b, silu=True, residual=res),
        lambda: G.gemv(x[:, :576], w[:, :576].contiguous(), norm=nw, eps=1e-5),
        lambda: G.gemv(torch.cat([x, x * 2, x * 3]), w, b),
    ]
    with_pdl = [f() for f in cases]
    monkeypatch.setattr(pdl, "PDL", False)
    assert all(torch.equal(a, f()) for a, f in zip(with_pdl, cases, strict=True))
    monkeypatch.setattr(pdl, "PDL", True)
    graph, out = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        out = [f() for f in cases]
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, o) for a, o in zip(with_pdl, out, strict=True))


def test_gemv_refuses_bad_shapes():
    x, w, _ = _inputs(5, 8, 64, False)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        G.gemv(x, w)
    with pytest.raises(ValueError, match="does not take"):
        G.gemv(x[:1], w[:, :32])
    with pytest.raises(ValueError, match="bias"):
        G.gemv(x[:1], w, torch.zeros(3))
    with pytest.raises(ValueError, match="take one row"):
        G.gemv(x[:2], w, residual=torch.zeros(2, 8, dtype=x.dtype))
    with pytest.raises(ValueError, match="residual"):
        G.gemv(x[:1], w, residual=torch.zeros(7, dtype=x.dtype))
    with pytest.raises(ValueError, match="silu=True"):
        G.gemv(torch.zeros(1, 129, dtype=x.dtype), w, silu=True)  # gate | up needs 2 x 64 features
    with pytest.raises(ValueError, match="one prologue"):
        G.gemv(torch.zeros(1, 128, dtype=x.dtype), w, silu=True, norm=torch.ones(64, dtype=x.dtype))
    with pytest.raises(ValueError, match="norm weight"):
        G.gemv(x[:1], w, norm=torch.ones(63, dtype=x.dtype))
    wide = torch.zeros(8, 1100, dtype=x.dtype)
    with pytest.raises(ValueError, match="one tile"):
        G.gemv(torch.zeros(1, 1100, dtype=x.dtype), wide, norm=torch.ones(1100, dtype=x.dtype))


def test_pick_config_and_where_the_engine_uses_the_gemv():
    assert G.pick_config(1) == G.ONE_ROW and G.pick_config(3) == G.MORE_ROWS
    assert G.gemv_wins(1, 6144, 4096) and G.gemv_wins(1, 28672, 4096)  # the 8B's qkv and gate_up
    assert not G.gemv_wins(1, 128256, 4096) and not G.gemv_wins(1, 151936, 4096)  # heads: cuBLAS is faster
    assert G.gemv_wins(1, 960, 576) and G.gemv_wins(1, 576, 1536)  # SmolLM2's qkv and down
    assert not G.gemv_wins(1, 49152, 576)  # SmolLM2's head: cuBLAS is faster there
    assert not G.gemv_wins(2, 6144, 4096)  # more rows stay with cuBLAS


@kernel_case
def test_kernel_linear_takes_the_gemv_for_one_row_only():
    from sglang_specpilot.models.linear import Linear

    torch.manual_seed(0)
    lin = Linear(300, 70, bias=True).to(DEVICE, torch.bfloat16)
    one = torch.randn(1, 1, 300, device=DEVICE, dtype=torch.bfloat16)
    two = torch.randn(1, 2, 300, device=DEVICE, dtype=torch.bfloat16)
    assert torch.equal(lin(one), torch.nn.functional.linear(one, lin.weight, lin.bias))  # off: F.linear
    lin.decode_gemv = True
    assert torch.equal(lin(one), G.gemv(one, lin.weight, lin.bias))
    assert torch.equal(lin(two), torch.nn.functional.linear(two, lin.weight, lin.bias))  # two rows: cuBLAS


def test_set_decode_gemv_marks_only_cuda_bf16_layers_where_the_gemv_wins():
    from sglang_specpilot.models.config import ModelConfig
    from sglang_specpilot.models.linear import Linear, set_decode_gemv
    from sglang_specpilot.models.llama import Transformer

    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8)  # fmt: skip
    model = Transformer(cfg)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(linears) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the head
    assert set_decode_gemv(model, True) == 0  # CPU fp32 weights: nothing takes it
    assert not any(m.decode_gemv for m in linears)
    if torch.cuda.is_available():
        model = model.to("cuda", torch.bfloat16)
        assert set_decode_gemv(model, True) == len(linears)
        assert set_decode_gemv(model, False) == 0 and not any(m.decode_gemv for m in linears)


def test_set_decode_gemv_keeps_a_layers_counters_across_runners(monkeypatch):
    # A model shared by several engines (the tuner, the e2e suite) is set up once per runner. The split-K
    # counters an earlier runner's CUDA graphs captured must stay the same buffer, alive, whatever a later
    # runner asks for: replacing them freed them under those graphs (the SmolLM2 tune anomaly, H100).
    from sglang_specpilot.models import linear as linear_module
    from sglang_specpilot.models.config import ModelConfig
    from sglang_specpilot.models.linear import Linear, set_decode_gemv
    from sglang_specpilot.models.llama import Transformer

    made = []

    def fake_counters(device):
        made.append(torch.zeros(8, dtype=torch.int32))
        return made[-1]

    monkeypatch.setattr(linear_module, "_takes_kernels", lambda w: True)
    monkeypatch.setattr(linear_module, "new_counters", fake_counters)
    monkeypatch.setattr(linear_module, "skinny_wins", lambda M, N, K: M == 8)
    monkeypatch.setattr(linear_module, "tma_wins", lambda M, N, K: False)
    monkeypatch.setattr(linear_module, "gemv_wins", lambda M, N, K: True)
    monkeypatch.setattr(linear_module, "MIN_ROWS", 2)
    monkeypatch.setattr(linear_module, "MAX_ROWS", 64)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8)  # fmt: skip
    model = Transformer(cfg)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    set_decode_gemv(model, True, verify=True)
    first = [m.counters for m in linears]
    assert all(c is not None for c in first) and len(made) == len(linears)
    assert all(m.verify_rows == frozenset({8}) for m in linears)
    set_decode_gemv(model, True, verify=True)  # a second engine over the same model
    set_decode_gemv(model, True, verify=False)  # and one without the verify GEMM
    assert all(m.counters is c for m, c in zip(linears, first, strict=True)) and len(made) == len(linears)
    assert not any(m.verify_rows for m in linears)


def test_kernel_cases_in_interpreter():
    if HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel_ and not interpreter")


def test_pdl_is_off_where_it_cannot_run(monkeypatch):
    # Never in the interpreter or on the CPU, and not when turned off (SPECPILOT_PDL=0) or when Triton lacks it.
    from sglang_specpilot.kernels import pdl

    cpu = torch.zeros(1)
    assert not pdl.uses_pdl(cpu) and not pdl.uses_pdl(cpu, interpreted=True)
    if torch.cuda.is_available():
        gpu = torch.zeros(1, device="cuda")
        assert not pdl.uses_pdl(gpu, interpreted=True)
        monkeypatch.setattr(pdl, "TRITON_HAS_PDL", False)
        assert not pdl.uses_pdl(gpu)
        monkeypatch.setattr(pdl, "TRITON_HAS_PDL", True)
        monkeypatch.setattr(pdl, "PDL", False)
        assert not pdl.uses_pdl(gpu)
