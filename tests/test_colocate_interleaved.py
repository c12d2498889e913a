"""Interleaved kernels (grouped GEMM, RMSNorm, residual add) against their PyTorch references.

Kernel cases (``test_kernel_*``) run on the GPU, or on a CPU in the Triton interpreter in a child pytest
(see tests/test_tree_attention.py for why a child). Shapes are odd on purpose: K and N not multiples of
the blocks, members of unrelated shapes from "both models".

Tolerances: fp32 GEMM atol = rtol = 1e-4 (summation order only; split-K adds atomic partial sums); fp32
row ops exact for the add, 1e-6 for RMSNorm (the mean's summation order). bf16: 1e-2, about one bf16 ulp
of the output: the interpreter rounds fp32 -> bf16 ties differently from torch (a tie
-4.609375 became -4.59375, torch gives -4.625).
"""

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter

from sglang_specpilot.colocate.grouped_gemm import (
    D_MEMBER,
    INTERPRETED,
    GemmMember,
    build_descriptors,
    gemm_ref,
    grouped_gemm,
    interleave_order,
)
from sglang_specpilot.colocate.interleaved_rows import (
    AddMember,
    RMSNormMember,
    add_ref,
    interleaved_add,
    interleaved_rms_norm,
    rms_norm_ref,
)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_HERE = torch.cuda.is_available() or INTERPRETED
kernel_case = pytest.mark.skipif(not KERNEL_HERE, reason="on a CPU the kernel cases run in the interpreter child")


def _close(a, b, tol):
    err = (a.float() - b.float()).abs()
    bound = tol + tol * b.float().abs()
    assert (err <= bound).all(), f"max err {err.max():.3e} at {divmod(int(err.argmax()), a.shape[-1])}"


def _gemm_members(dtype, split_k=(1, 1, 1), seed=0):
    g = torch.Generator().manual_seed(seed)

    def t(*s):
        return torch.randn(*s, generator=g).to(dtype).to(DEVICE)

    # A target-like qkv (bias), a draft-like projection with K = 33, a long reduction split in slices.
    return [
        GemmMember(t(5, 70), t(45, 70), t(45), split_k[0]),
        GemmMember(t(17, 33), t(90, 33), None, split_k[1]),
        GemmMember(t(3, 200), t(20, 200), None, split_k[2]),
    ]


@kernel_case
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("split_k", [(1, 1, 1), (2, 1, 3)])
def test_kernel_grouped_gemm_matches_reference(dtype, tol, split_k):
    members = _gemm_members(dtype, split_k)
    for y, r in zip(grouped_gemm(members, block_n=32, block_k=32), gemm_ref(members), strict=True):
        assert y.shape == r.shape and y.dtype == dtype
        _close(y, r, tol)


@kernel_case
def test_kernel_grouped_gemm_members_do_not_touch_each_other():
    # A member with zero weights must give exactly its bias, whatever the other members hold.
    members = _gemm_members(torch.float32)
    members[0].w.zero_()
    y = grouped_gemm(members, block_n=32, block_k=32)
    assert torch.equal(y[0], members[0].bias.expand_as(y[0]))


@kernel_case
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_kernel_interleaved_rms_norm_matches_reference(dtype, tol):
    g = torch.Generator().manual_seed(1)
    members = [
        RMSNormMember(
            torch.randn(3, 70, generator=g).to(dtype).to(DEVICE),
            (1 + 0.1 * torch.randn(70, generator=g)).to(dtype).to(DEVICE),
            1e-5,
        ),
        RMSNormMember(
            torch.randn(7, 33, generator=g).to(dtype).to(DEVICE),
            torch.randn(33, generator=g).to(dtype).to(DEVICE),
            1e-6,
        ),
    ]
    for y, r in zip(interleaved_rms_norm(members), rms_norm_ref(members), strict=True):
        _close(y, r, tol)


@kernel_case
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_interleaved_add_matches_reference(dtype):
    g = torch.Generator().manual_seed(2)
    members = [
        AddMember(
            torch.randn(3, 70, generator=g).to(dtype).to(DEVICE), torch.randn(3, 70, generator=g).to(dtype).to(DEVICE)
        ),
        AddMember(
            torch.randn(1000, generator=g).to(dtype).to(DEVICE), torch.randn(1000, generator=g).to(dtype).to(DEVICE)
        ),
    ]
    for y, r in zip(interleaved_add(members, block=64), add_ref(members), strict=True):
        if dtype == torch.float32:
            assert torch.equal(y, r)
        else:
            _close(y, r, 1e-2)


def test_kernel_cases_in_interpreter():
    if KERNEL_HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel and not interpreter")


def test_interleave_order_tracks_proportions():
    order = interleave_order([6, 2])
    assert sorted(order) == [(0, i) for i in range(6)] + [(1, i) for i in range(2)]
    # Every prefix holds each member's units in proportion (within one unit).
    for p in range(1, len(order) + 1):
        ones = sum(1 for k, _ in order[:p] if k == 1)
        assert abs(ones - p * 2 / 8) <= 1


def test_descriptor_table_covers_every_tile_and_slice_once():
    members = _gemm_members(torch.float32, split_k=(2, 1, 3))
    members = [GemmMember(m.x.cpu(), m.w.cpu(), None if m.bias is None else m.bias.cpu(), m.split_k) for m in members]
    outs = [torch.empty(m.x.shape[0], m.w.shape[0]) for m in members]
    desc = build_descriptors(members, outs, 16, 32, 32)
    # member 0: 1 x 2 tiles x 2 slices (K 70 = 3 steps of 32); member 1: 2 x 3 tiles; member 2: 1 x 1 x 3.
    counts = torch.bincount(desc[:, D_MEMBER], minlength=3).tolist()
    assert counts == [4, 6, 3]
    assert len({tuple(r[:5]) for r in desc.tolist()}) == desc.shape[0]


def test_cpu_falls_back_to_reference_exactly():
    if KERNEL_HERE:
        pytest.skip("the kernel runs here")
    members = _gemm_members(torch.float32)
    for y, r in zip(grouped_gemm(members), gemm_ref(members), strict=True):
        assert torch.equal(y, r)
