"""A forward's inputs in one launch (kernels/embed_rope.py) against the models' eager ops, in the Triton
interpreter on the CPU (natively on a GPU): with and without an EAGLE-3 drafter's features, strided
(broadcast) positions, float32 and bf16."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases

from sglang_specpilot.models.rope import rope_table

K = importlib.import_module("sglang_specpilot.kernels.embed_rope")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, K, "_embed_rope_kernel")


@kernel_case
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("features", [0, 3 * 40])
def test_kernel_embed_rope_equals_the_eager_ops(dtype, features):
    g = torch.Generator().manual_seed(features)
    V, H, B, N = 97, 40, 3, 5
    embed = torch.randn(V, H, generator=g).to(dtype).to(DEVICE)
    rope = rope_table(300, 32, 10000.0).to(DEVICE)
    tokens = torch.randint(0, V, (B, N), generator=g).to(DEVICE)
    positions = (torch.randint(0, 290, (B, 1), generator=g) + torch.arange(N)).to(DEVICE)
    feats = torch.randn(B, N, features, generator=g).to(dtype).to(DEVICE) if features else None
    x, cs = K.embed_rope(tokens, positions, embed, rope, feats, dtype)
    rx, rcs = K.embed_rope_ref(tokens, positions, embed, rope, feats, dtype)
    assert x.shape == rx.shape and cs.shape == rcs.shape == (B, N, 2, 32) and x.dtype == cs.dtype == dtype
    assert torch.equal(x, rx)  # copies
    if dtype == torch.bfloat16 and INTERP:  # the interpreter truncates fp32 -> bf16: one ulp
        assert bool(((cs.float() - rcs.float()).abs() <= rcs.float().abs() * 2**-7 + 1e-7).all())
    else:
        assert torch.equal(cs, rcs)
    # Broadcast positions (a depth's [B, k] expand) and a transposed token view read through their strides.
    pos = (torch.arange(B, device=DEVICE)[:, None] * 7 + 11).expand(B, N)
    tok_t = tokens.t().contiguous().t()
    x2, cs2 = K.embed_rope(tok_t, pos, embed, rope, feats, dtype)
    assert torch.equal(x2, rx) and torch.equal(cs2[:, 1], cs2[:, 0]) and not torch.equal(cs2, cs)
