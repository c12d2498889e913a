"""RMSNorm in one launch (kernels/rms_norm.py) against models.llama.rms_norm, in the Triton interpreter on the
CPU (natively on a GPU): odd widths, leading dims, a strided x, bf16 / fp16 / fp32; float64 stays eager."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases

R = importlib.import_module("sglang_specpilot.kernels.rms_norm")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, R, "_rms_norm_kernel")


@kernel_case
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 576), (2, 5, 100), (1, 1, 4097)])
def test_kernel_rms_norm_matches_the_reference(dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(DEVICE)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype).to(DEVICE)
    y, ref = R.rms_norm(x, w, 1e-5), R.rms_norm_ref(x, w, 1e-5)
    assert y.shape == x.shape and y.dtype == dtype
    # The same two roundings; the mean's sum in another order moves the fp32 scale by an ulp or two, which
    # can tip the first rounding, and the second rounds a product that moved with it: within two ulps of x's
    # dtype (the interpreter truncates its casts, two ulps again). float32 has no rounding to tip: a few of
    # its ulps (2^-23).
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-21}[dtype]
    err = (y.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-6)
    assert float(err.max()) <= 2 * ulp
    assert not torch.equal(R.rms_norm(x, w * 2, 1e-5), y)


@kernel_case
def test_kernel_rms_norm_takes_a_strided_x_and_keeps_float64_eager():
    x = torch.randn(4, 64, device=DEVICE)[:, :48]
    w = torch.ones(48, device=DEVICE)
    assert torch.allclose(R.rms_norm(x, w, 1e-6), R.rms_norm_ref(x, w, 1e-6), rtol=1e-6, atol=0)
    x64 = x.double()
    assert torch.equal(R.rms_norm(x64, w.double(), 1e-6), R.rms_norm_ref(x64, w.double(), 1e-6))
