"""The decode GEMV (kernels/gemv.py) against its fp32 reference, on odd shapes, in the Triton interpreter on
the CPU (on the GPU natively): rows 1 to MAX_ROWS, K not a multiple of the tile, N not a multiple of BLOCK_N,
with and without bias, strided x; deterministic; bad shapes refused in one line."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

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


def test_gemv_refuses_bad_shapes():
    x, w, _ = _inputs(5, 8, 64, False)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        G.gemv(x, w)
    with pytest.raises(ValueError, match="does not take"):
        G.gemv(x[:1], w[:, :32])
    with pytest.raises(ValueError, match="bias"):
        G.gemv(x[:1], w, torch.zeros(3))


def test_pick_config_fills_the_sms_and_keeps_the_tile():
    assert G.pick_config(4096, 4096) == G.GemvConfig(8, 512, 4)  # 512 programs of 8 rows
    assert G.pick_config(14336, 4096) == G.GemvConfig(32, 128, 4)  # 448 programs
    small = G.pick_config(576, 576)  # SmolLM2's o projection: 144 programs of 4 rows
    assert small.block_n == 4 and small.block_k == 512
    assert G.pick_config(960, 40).block_k == 64
    for n, k in ((128256, 4096), (1536, 576), (576, 1536)):
        c = G.pick_config(n, k)
        assert c.block_n * c.block_k <= G.TILE_ELEMS


def test_kernel_cases_in_interpreter():
    if HERE:
        pytest.skip("the kernel cases ran in this process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", __file__, "-k", "kernel_ and not interpreter"],
                       env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
