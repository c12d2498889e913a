"""W12Linear: conversion from nn.Linear, the CPU reference path, the state dict, and the kernel path.

On a plain CPU ``forward`` is ``F.linear`` on the exactly decoded weight, so it must equal the BF16
``nn.Linear`` bit for bit. The kernel path (CUDA, or the interpreter's child process like
``test_w12_kernels.py``) is held to the GEMM's stated tolerance (``w12.kernels.gemm_tolerance``).
"""

from __future__ import annotations

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter
from torch import nn

from w12.codec import encode
from w12.format import decode_reference, decode_view8_reference
from w12.kernels import INTERPRETED, escape_row_ptr, gemm_tolerance, w12_gemm_ref, w12_view8_gemm_ref
from w12.linear import W12Linear, pad_escapes_alike

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_HERE = torch.cuda.is_available() or INTERPRETED
kernel_case = pytest.mark.skipif(
    not KERNEL_HERE, reason="on a CPU the kernel cases run in test_kernel_cases_in_interpreter's child"
)


def bf16_linear(K: int, N: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(K, N, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight[0, :3] = 0.0  # escapes: zeros and an outlier
        lin.weight[1, 5] = 300.0
    return lin


def test_from_linear_is_exact_on_cpu():
    if INTERPRETED:
        pytest.skip("under the interpreter CPU tensors go to the kernel")
    lin = bf16_linear(96, 40)
    mod = W12Linear.from_linear(lin)
    assert mod.esc_idx.numel() >= 4
    assert (mod.in_features, mod.out_features) == (96, 40)
    assert torch.equal(decode_reference(mod.weight_w12).view(torch.int16), lin.weight.view(torch.int16))
    x = torch.randn(2, 3, 96).to(torch.bfloat16)
    assert torch.equal(mod(x), lin(x))
    y8 = mod.forward_view8(x)
    assert y8.shape == (2, 3, 40)
    assert torch.equal(y8, nn.functional.linear(x, decode_view8_reference(mod.weight_w12), lin.bias))


def test_from_linear_refuses_other_dtypes():
    with pytest.raises(TypeError, match="bfloat16"):
        W12Linear.from_linear(nn.Linear(8, 4))


def test_state_dict_roundtrip_with_another_escape_count():
    a = W12Linear.from_linear(bf16_linear(64, 24, seed=1))
    other = bf16_linear(64, 24, seed=2)
    with torch.no_grad():
        other.weight[3, :10] = 0.0  # more escapes than a has
    b = W12Linear.from_linear(other)
    assert a.esc_idx.numel() != b.esc_idx.numel()
    assert set(a.state_dict()) == {"hi", "lo", "base", "esc_idx", "esc_val", "bias"}
    a.load_state_dict(b.state_dict())
    assert torch.equal(a.esc_idx, b.esc_idx) and torch.equal(a.esc_row_ptr, b.esc_row_ptr)
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(a(x), b(x))


def test_no_bias():
    mod = W12Linear.from_linear(bf16_linear(32, 8, bias=False))
    assert mod.bias is None and "bias" not in mod.state_dict()
    assert mod(torch.randn(1, 32).to(torch.bfloat16)).shape == (1, 8)


@kernel_case
@pytest.mark.parametrize("M", [1, 3, 24])
def test_kernel_forward_matches_reference(M):
    lin = bf16_linear(200, 70).to(DEVICE)
    mod = W12Linear.from_linear(lin)
    x = torch.randn(M, 200).to(torch.bfloat16).to(DEVICE)
    w = mod.weight_w12
    for y, ref_fn, view8 in ((mod(x), w12_gemm_ref, False), (mod.forward_view8(x), w12_view8_gemm_ref, True)):
        ref = ref_fn(x, w, lin.bias, out_dtype=torch.float32)
        err = (y.float() - ref).abs()
        assert (err <= gemm_tolerance(x, w, ref, view8=view8)).all(), f"view8={view8}: max err {err.max()}"
    assert int(mod.counters.abs().sum()) == 0  # split-K (M = 1 on a small grid) left its counters at 0


def _layers_with_escapes(extra=(0, 7, 30), K=64, N=24) -> list[W12Linear]:
    """The same projection of three layers, with different escape counts."""
    mods = []
    for i, n_zero in enumerate(extra):
        lin = bf16_linear(K, N, seed=10 + i)
        with torch.no_grad():
            lin.weight[2, :n_zero] = 0.0  # zeros are escapes
        mods.append(W12Linear.from_linear(lin.to(DEVICE)))
    return mods


def test_padded_escapes_keep_the_record_and_the_rows_ranges():
    mods = _layers_with_escapes()
    counts = [int(m.esc_idx.numel()) for m in mods]
    assert len(set(counts)) == 3
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in mods]
    ptrs = [m.esc_row_ptr.clone() for m in mods]
    n = pad_escapes_alike(mods)
    assert n % 16 == 0 and n >= max(counts)
    for m, sd, ptr, c in zip(mods, before, ptrs, counts, strict=True):
        assert m.kernel_esc_idx.numel() == m.kernel_esc_val.numel() == n
        assert torch.equal(m.kernel_esc_idx[:c], m.esc_idx) and torch.equal(m.kernel_esc_val[:c], m.esc_val)
        assert bool((m.kernel_esc_idx[c:] == m.out_features * m.in_features).all())
        assert bool((m.kernel_esc_val[c:] == 0).all())
        assert set(m.state_dict()) == set(sd) and all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
        assert torch.equal(m.esc_row_ptr, ptr)
        assert torch.equal(escape_row_ptr(m.kernel_weight), ptr)  # the pads lie past every row's range
    # Padding again to the same length keeps the very tensors (a captured graph may read them by address).
    kept = [m.kernel_esc_idx.data_ptr() for m in mods]
    assert pad_escapes_alike(mods) == n and [m.kernel_esc_idx.data_ptr() for m in mods] == kept
    with pytest.raises(ValueError, match="escapes"):
        mods[-1].pad_escapes(counts[-1] - 1)
    mods[0].load_state_dict(mods[1].state_dict())  # a loaded record drops the padding
    assert torch.equal(mods[0].kernel_esc_idx, mods[1].esc_idx)
    assert pad_escapes_alike([]) == 0


def test_view8_reads_the_kernel_escapes_padded_or_not():
    # The 8-bit view (TLV's Q pass) builds its kernel record from the exact module's buffers: made before or
    # after the padding, and padded again on its own model (align_w12_escapes on the view twin).
    from w12.view8_linear import W12View8Linear

    mods = _layers_with_escapes()
    fresh = W12View8Linear(mods[0])
    assert torch.equal(fresh.kernel_weight.esc_idx, mods[0].esc_idx)
    n = pad_escapes_alike(mods)
    view = W12View8Linear(mods[0])
    assert view.kernel_weight.esc_idx.numel() == n and view.kernel_weight.hi is mods[0].hi
    fresh.pad_escapes(n)
    assert torch.equal(fresh.kernel_weight.esc_idx, view.kernel_weight.esc_idx)
    assert torch.equal(fresh.forward_view8(torch.ones(2, 64)), view.forward_view8(torch.ones(2, 64)))


@kernel_case
def test_kernel_padded_escapes_give_the_same_output_and_compile_once():
    from torch._dynamo.utils import counters

    mods = _layers_with_escapes()
    x = torch.randn(3, 64).to(torch.bfloat16).to(DEVICE)
    eager = [m(x) for m in mods]

    def graphs_over(mods) -> tuple[int, list]:
        torch._dynamo.reset()
        counters.clear()
        f = torch.compile(lambda m, x: m(x), fullgraph=True, dynamic=False, backend="eager")
        outs = [f(m, x) for m in mods]
        return int(counters["stats"]["unique_graphs"]), outs

    unpadded, _ = graphs_over(mods)
    pad_escapes_alike(mods)
    padded, outs = graphs_over(mods)
    assert unpadded == 3 and padded == 1  # one graph per escape count, then one for all
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(outs, eager, strict=True))


def test_kernel_cases_in_interpreter():
    if KERNEL_HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "test_kernel_ and not interpreter")


@pytest.mark.gpu
def test_gpu_graph_and_compile():
    lin = bf16_linear(4096, 4096).cuda()
    mod = W12Linear.from_linear(lin)
    x = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    eager = mod(x)
    ref = w12_gemm_ref(x, mod.weight_w12, lin.bias, out_dtype=torch.float32)
    assert ((eager.float() - ref).abs() <= gemm_tolerance(x, mod.weight_w12, ref)).all()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod(x)
    graph.replay()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    compiled = torch.compile(mod, fullgraph=True)
    assert torch.equal(compiled(x).view(torch.int16), eager.view(torch.int16))
    assert torch.equal(torch.compile(mod.forward_view8, fullgraph=True)(x), mod.forward_view8(x))


def test_encode_matches_from_linear():
    lin = bf16_linear(16, 4)
    w = encode(lin.weight.detach())
    assert torch.equal(W12Linear(w, lin.bias.detach()).hi, w.hi)
