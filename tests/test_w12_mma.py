"""The CUDA C++ W12 GEMM (``w12/kernels/csrc/w12_mma.cu``) against decode-then-matmul in fp32.

On a CPU: the source builds for sm_90a with nvcc (when nvcc is installed) and the host-side choices (tiles,
splits, config checks). On the GPU (``-m gpu``): odd shapes (N not a multiple of the row block, M not a
multiple of 8, M > 64), escapes including inf / NaN, bias, split-K determinism and counter reset, every
launch shape, CUDA graphs and torch.compile, all at the tolerance stated in ``gemm.gemm_tolerance``.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import assert_within, bits16, check_nonfinite_escapes

from w12.codec import encode
from w12.kernels import gemm_tolerance, mma, w12_gemm, w12_gemm_ref, w12_view8_gemm, w12_view8_gemm_ref
from w12.kernels.mma import MmaConfig, nt_for, splits_for

# ---------------------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_source_builds_for_sm90(tmp_path):
    out = mma.build(["-gencode=arch=compute_90a,code=sm_90a"], tmp_path / "w12_mma.so")
    assert out.stat().st_size > 10_000


def test_build_error_is_clear(tmp_path):
    with pytest.raises(mma.BuildError, match="nvcc"):
        mma.build([], tmp_path / "x.so", nvcc=str(tmp_path / "no-nvcc"))


def test_tiles_and_splits():
    assert [nt_for(m) for m in (1, 8, 9, 16, 17, 33, 64, 65, 200)] == [1, 1, 2, 2, 4, 8, 8, 8, 8]
    cfg = MmaConfig(16, 8)
    # Llama-3.1-8B o_proj at M = 1: 256 row blocks of 8 warps fill 132 SMs at 16 warps each with 2 splits.
    assert splits_for(1, 4096, 4096, cfg, 132) == 2
    assert splits_for(1, 128256, 4096, cfg, 132) == 1  # the LM head fills the GPU on its own
    assert splits_for(1, 64, 128, cfg, 132) == 1  # K too short to split
    assert splits_for(1, 4096, 4096, MmaConfig(16, 8, splits=5), 132) == 5
    for bad in ({"rows_per_warp": 8}, {"warps": 0}, {"warps": 16}, {"splits": -1}):
        with pytest.raises(ValueError):
            MmaConfig(**bad)


def test_unavailable_off_the_gpu():
    assert not mma.available("cpu")
    assert mma.supports(4096) and not mma.supports(200)


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


def weight(N: int, K: int, seed: int, specials: bool = True) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(N, K, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    if specials:
        flat = w.view(-1)
        pick = torch.randint(0, N * K, (max(8, N * K // 2000),), generator=gen, device="cuda")
        flat[pick[0::2]] = 0.0
        flat[pick[1::2]] = 1e3
    return w


def check(x, w, *, view8=False, bias=None, **kw):
    fn, ref_fn = (w12_view8_gemm, w12_view8_gemm_ref) if view8 else (w12_gemm, w12_gemm_ref)
    y = fn(x, w, bias, backend="cuda", **kw)
    ref = ref_fn(x, w, bias, out_dtype=torch.float32)
    assert y.shape == ref.shape and y.dtype == torch.bfloat16
    assert_within(y, ref, gemm_tolerance(x, w, ref, view8=view8), f"M={x.shape[0]} {tuple(w.shape)} {kw}")
    return y


@gpu
@pytest.mark.parametrize(
    "M,N,K",
    [(1, 6144, 4096), (3, 1000, 576), (17, 333, 1536), (64, 4096, 1024), (100, 130, 128), (32, 2048, 14336 // 2)],
)
@pytest.mark.parametrize("cfg", [MmaConfig(16, 8), MmaConfig(32, 4), MmaConfig(16, 2, splits=3)])
def test_gpu_matches_reference(M, N, K, cfg):
    w = encode(weight(N, K, seed=N + K))
    assert w.esc_idx.numel() > 0
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    check(x, w, mma_config=cfg)
    check(x, w, view8=True, mma_config=cfg)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    check(x, w, bias=bias, mma_config=cfg)


@gpu
def test_gpu_one_hot_x_reproduces_weights():
    # x = e_k picks column k of W: every weight comes out exactly (a product by 1, one nonzero term).
    N, K = 48, 192
    w_bf16 = weight(N, K, seed=2)
    w = encode(w_bf16)
    x = torch.eye(K, device="cuda", dtype=torch.bfloat16)[:64]
    y = w12_gemm(x, w, backend="cuda")
    assert torch.equal(bits16(y), bits16(w_bf16[:, :64].T.contiguous()))


@gpu
def test_gpu_nonfinite_escapes_stay_in_their_rows():
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    cfg = MmaConfig(16, 4, splits=2)
    check_nonfinite_escapes(lambda x, w: w12_gemm(x, w, backend="cuda", mma_config=cfg), weight(70, 256, 3, False), x)


@gpu
def test_gpu_split_k_deterministic_counters_reset_strided_x():
    w = encode(weight(4096, 4096, seed=4))
    counters = torch.zeros(1024, dtype=torch.int32, device="cuda")
    big = torch.randn(3, 2 * 4096 + 8, device="cuda").to(torch.bfloat16)
    x = big[:, 8 : 8 + 4096]  # rows 16-byte aligned, stride not K
    cfg = MmaConfig(16, 8, splits=4)
    first = w12_gemm(x, w, counters=counters, backend="cuda", mma_config=cfg)
    assert int(counters.abs().sum()) == 0
    for _ in range(3):
        assert torch.equal(bits16(w12_gemm(x, w, counters=counters, backend="cuda", mma_config=cfg)), bits16(first))
    odd = big[:, 1 : 1 + 4096]  # misaligned: the op copies it
    check(odd, w, mma_config=cfg)


@gpu
def test_gpu_graph_and_compile():
    from w12.kernels import escape_row_ptr

    w = encode(weight(4096, 4096, seed=5))
    row_ptr = escape_row_ptr(w)
    counters = torch.zeros(1024, dtype=torch.int32, device="cuda")
    x = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)

    def f(a):
        return w12_gemm(a, w, esc_row_ptr=row_ptr, counters=counters, backend="cuda")

    eager = f(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x)
    for _ in range(3):
        graph.replay()
        assert torch.equal(bits16(out), bits16(eager))
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(bits16(compiled(x)), bits16(eager))


@gpu
def test_gpu_w12linear_cuda_backend():
    from w12.linear import W12Linear

    lin = torch.nn.Linear(1024, 3000, bias=True, device="cuda", dtype=torch.bfloat16)
    w12 = W12Linear.from_linear(lin)
    x = torch.randn(7, 1024, device="cuda").to(torch.bfloat16)
    auto = w12(x)
    w12.backend = "cuda"
    ref = x.float() @ lin.weight.float().T + lin.bias.float()
    for y in (auto, w12(x)):
        assert (y.float() - ref).abs().max() < 0.05
