"""A lattice depth's selection in one launch (kernels/lattice_step.py) against its PyTorch reference, in the
Triton interpreter on the CPU (natively on a GPU): every output and every in-place table equal, on odd
top-k, a batch of rows at different lengths, tied and -inf scores, float32 and float64; and the whole
expansion through the kernel equals the reference expansion."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases, tiny_model

L = importlib.import_module("sglang_specpilot.kernels.lattice_step")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, L, "_select_kernel")


def _lattice(B: int, depth: int, k: int, dtype, seed: int, upto: int):
    """A ``depth``-deep lattice's tables as expand_lattice holds them before depth ``upto``'s selection (the
    reference selected the depths before it), over random scores with ties and -inf planted."""
    g = torch.Generator().manual_seed(seed)
    E = 1 + (depth - 1) * k
    C = E * k
    scores = (torch.randn(B, C, generator=g) * 2).round(decimals=1).to(dtype)  # coarse: many exact ties
    scores[:, 1::7] = float("-inf")
    tokens = torch.randint(0, 50_000, (B, C), generator=g)
    parents = torch.full((B, E), -1, dtype=torch.long)
    vis = torch.zeros(B, E, E, dtype=torch.bool)
    vis[:, 0, 0] = True
    expanded_by = torch.full((B, C), -1, dtype=torch.long)
    seq_len = torch.randint(3, 500, (B,), generator=g)
    tabs = [t.to(DEVICE) for t in (scores, tokens, parents, vis, expanded_by, seq_len)]
    for d in range(1, upto):
        L.lattice_select_ref(*tabs, d, k)
    return tabs


@kernel_case
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_select_equals_the_reference(k, dtype):
    depth = 5
    for d in range(1, depth):
        tabs = _lattice(3, depth, k, dtype, seed=10 * k + d, upto=d)
        ref_tabs = [t.clone() for t in tabs]
        assert L.kernel_takes(tabs[0], d, k)
        got = L.lattice_select(*tabs, d, k)
        want = L.lattice_select_ref(*ref_tabs, d, k)
        for name, a, b in zip(L.Selection._fields, got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), (name, d, k)
        for name, a, b in zip(("parents", "vis", "expanded_by"), tabs[2:5], ref_tabs[2:5], strict=True):
            assert torch.equal(a, b), (name, d, k)
        assert not torch.equal(tabs[4], _lattice(3, depth, k, dtype, seed=10 * k + d, upto=d)[4])  # it wrote


@kernel_case
def test_kernel_select_keeps_candidate_order_on_ties():
    # All scores equal: the stable sort takes the first k candidates of the previous depth, in order.
    k, depth = 4, 3
    tabs = _lattice(2, depth, k, torch.float32, seed=1, upto=1)
    tabs[0].fill_(-1.5)
    L.lattice_select_ref(*tabs, 1, k)
    sel = L.lattice_select(*tabs, 2, k)
    first = (1 + 0 * k) * k  # depth 1's expansions start at 1: their candidates at k ..
    assert sel.cand.tolist() == [list(range(first, first + k))] * 2


@kernel_case
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,k,mapped", [(1, 5, False), (3, 3, True), (8, 8, True)])
def test_kernel_children_equal_the_reference(dtype, n, k, mapped):
    g = torch.Generator().manual_seed(n * k)
    B, C, lo = 3, 2 * n * k + 7, n * k + 2
    lp = -torch.rand(B, n, k, generator=g).to(dtype)
    lp[0, 0, 0] = float("-inf")
    base = -torch.rand(B, n, generator=g).to(dtype) * 3
    tok = torch.randint(0, 100, (B, n, k), generator=g)
    d2t = torch.randint(0, 50_000, (100,), generator=g) if mapped else None
    tabs = [torch.full((B, C), -7, dtype=t, device=DEVICE) for t in (dtype, dtype, torch.long)]
    ref = [t.clone() for t in tabs]
    args = [t.to(DEVICE) if t is not None else None for t in (base, lp, tok, d2t)]
    L.lattice_children(*tabs, *args, lo)
    L.lattice_children_ref(*ref, *args, lo)
    for a, b in zip(tabs, ref, strict=True):
        assert torch.equal(a, b)
    assert bool((tabs[0][:, :lo] == -7).all() and (tabs[0][:, lo + n * k :] == -7).all())  # nothing else


@kernel_case
def test_kernel_expansion_equals_the_reference_expansion(monkeypatch):
    from sglang_specpilot.engine import draft_tree
    from sglang_specpilot.engine.runner import ModelRunner
    from sglang_specpilot.kernels import launch, rms_norm

    model = tiny_model("tiny-qwen3", dtype=torch.float32)
    runner = ModelRunner(model, 2, 128, cuda_graphs=False)
    history = torch.randint(0, model.cfg.vocab_size, (2, 128), generator=torch.Generator().manual_seed(3))
    seq_len, next_tok = torch.tensor([9, 14]), torch.tensor([5, 7])
    # The target's final norm in one launch rounds its own way (tests/test_rms_norm_kernel.py): the tables must
    # match exactly, so it stays eager here.
    monkeypatch.setattr(rms_norm, "rms_norm", rms_norm.rms_norm_ref)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(launch, "ROUND_KERNELS", on)
        out[on] = draft_tree.expand_lattice(runner, history, seq_len, next_tok, 4, 3)
    (ref, ref_exp, _), (got, got_exp, _) = out[False], out[True]
    assert torch.equal(got_exp, ref_exp)
    for name in ("parents", "tokens", "logprobs", "scores", "depths"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def test_kernel_takes_only_what_fits_in_registers():
    s = torch.zeros(1, 8)
    assert not L.kernel_takes(s, 2, 12)  # 144 candidates a depth > MAX_CANDIDATES
    if not INTERP:
        assert not L.kernel_takes(s, 2, 8)  # CPU tensors without the interpreter keep the reference
