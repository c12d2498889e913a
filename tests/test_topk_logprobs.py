"""The draft tree's top-k log-prob kernel (kernels/topk_logprobs.py) against its reference, on odd shapes, in
the Triton interpreter on the CPU (natively on the GPU): vocabularies that are not a multiple of the chunk,
ties (bf16 logits repeat values), -inf entries, one and several rows; bad arguments refused in one line."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter

T = importlib.import_module("sglang_specpilot.kernels.topk_logprobs")

HERE = T.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernel_case = pytest.mark.skipif(not HERE, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")


@kernel_case
@pytest.mark.parametrize("rows,V", [(1, 100), (3, 4096), (2, 9000)])
@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_topk_logprobs_matches_the_reference(rows, V, k, dtype):
    g = torch.Generator().manual_seed(V + k)
    logits = (torch.randn(rows, V, generator=g) * 4).to(dtype)
    logits[0, :: max(1, V // 7)] = float("-inf")  # masked entries never win
    logits[-1, V // 3] = logits[-1, V // 2] = logits[-1].max() + 1  # an exact tie for first place
    logits = logits.to(DEVICE)
    lp, idx = T.topk_logprobs(logits, k)
    lp_ref, idx_ref = T.topk_logprobs_ref(logits, k)
    assert lp.shape == (rows, k) and idx.dtype == torch.int64 and lp.dtype == torch.float32
    assert torch.equal(idx, idx_ref)  # the same entries in the same order, ties to the smaller index
    assert (lp - lp_ref).abs().max().item() <= 1e-5 * max(1.0, lp_ref.abs().max().item())
    assert idx[-1, 0].item() == V // 3  # the tie went to the smaller index
    if k > 1:
        assert idx[-1, 1].item() == V // 2
    assert torch.equal(T.topk_logprobs(logits, k)[1], idx)  # deterministic


@kernel_case
def test_kernel_topk_logprobs_takes_leading_dims_and_a_row_of_few_finite_entries():
    logits = torch.full((2, 3, 300), float("-inf"))
    logits[..., 5] = 1.0
    logits[..., 7] = 2.0
    logits = logits.to(DEVICE)
    lp, idx = T.topk_logprobs(logits, 4)
    assert idx.shape == (2, 3, 4) and bool((idx[..., :2] == torch.tensor([7, 5], device=DEVICE)).all())
    assert bool((idx >= 0).all() and (idx < 300).all())  # the -inf picks stay in range
    lp_ref, _ = T.topk_logprobs_ref(logits, 4)
    assert torch.allclose(lp[..., :2], lp_ref[..., :2], atol=1e-6)
    assert bool(torch.isneginf(lp[..., 2:]).all())


def test_topk_logprobs_refuses_bad_arguments():
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        T.topk_logprobs(torch.zeros(1, 10, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="k <= min"):
        T.topk_logprobs(torch.zeros(1, 10), 11)


def test_kernel_cases_in_interpreter():
    if HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel_ and not interpreter")
