"""The verify tree and its masks in one launch each (kernels/tree_build.py) against tree_verify's best_first
and ancestor_mask, in the Triton interpreter on the CPU (natively on a GPU): field for field on lattices
with exact ties (parent and child, siblings, -inf), several rows, budgets from 1 to every candidate, a
lattice bigger than one rank tile; and a tree round through the kernels equals the PyTorch round."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases

from tree_verify import Lattice, best_first

T = importlib.import_module("sglang_specpilot.kernels.tree_build")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, T, "_masks_kernel")


def _lattice(B: int, depth: int, k: int, seed: int, dtype=torch.float32) -> Lattice:
    """A random lattice grown as expand_lattice grows one (each depth expands its k best candidates), with
    coarse log-probs (many exact ties, some edges 0 so a child ties its parent) and a few -inf edges."""
    g = torch.Generator().manual_seed(seed)
    E = 1 + (depth - 1) * k
    lp = -(torch.rand(B, E, k, generator=g) * 4).round()
    lp[torch.rand(B, E, k, generator=g) < 0.05] = float("-inf")
    lp = lp.to(dtype)
    tokens = torch.randint(0, 49_152, (B, E, k), generator=g)
    parents = torch.full((B, E), -1, dtype=torch.long)
    for d in range(1, depth):
        first, n = (0, 1) if d == 1 else (1 + (d - 2) * k, k)
        for b in range(B):
            # Any k distinct candidates of the previous depth: the tree need not follow the scores.
            parents[b, 1 + (d - 1) * k : 1 + d * k] = first * k + torch.randperm(n * k, generator=g)[:k]
    plain = Lattice(parents, tokens, lp)
    scores, depths = plain.candidate_scores()
    return Lattice(
        *(t.to(DEVICE) for t in (parents, tokens, lp)),
        check=False,
        scores=scores.to(DEVICE),
        depths=depths.to(DEVICE),
    )


@kernel_case
@pytest.mark.parametrize("depth,k,budgets", [(6, 8, (1, 32, 64)), (3, 3, (1, 5, 21)), (4, 5, (60, 80)), (1, 4, (4,))])
def test_kernel_best_first_tree_equals_best_first(depth, k, budgets):
    for seed in range(3):
        lat = _lattice(3, depth, k, seed=100 * depth + seed)
        for n in budgets:
            want = best_first(lat, n)
            got = T.best_first_tree(lat, n)
            for name in ("tokens", "parents", "depths", "scores", "candidates"):
                a, b = getattr(got, name), getattr(want, name)
                assert a.dtype == b.dtype and torch.equal(a, b), (name, depth, k, n, seed)


@kernel_case
def test_kernel_best_first_tree_float64_and_refuses_bad_budgets():
    lat = _lattice(2, 3, 4, seed=5, dtype=torch.float64)
    assert torch.equal(T.best_first_tree(lat, 9).scores, best_first(lat, 9).scores)
    for bad in (0, 9 * 4 + 1):
        with pytest.raises(ValueError, match="num_nodes"):
            T.best_first_tree(lat, bad)


@kernel_case
@pytest.mark.parametrize("depth,k,n", [(6, 8, 32), (3, 3, 7), (5, 2, 9), (2, 1, 1)])
def test_kernel_tree_masks_equal_the_reference(depth, k, n):
    lat = _lattice(4, depth, k, seed=depth * k)
    parents = best_first(lat, n).parents
    anc, dep = T.tree_masks(parents, depth)
    ref_anc, ref_dep = T.tree_masks_ref(parents, depth)
    assert anc.dtype == torch.bool and torch.equal(anc, ref_anc)
    assert torch.equal(dep, ref_dep)
    # Too few steps for the deepest node: both sides miss the same ancestors (the bound is the caller's).
    if depth > 2:
        short = T.tree_masks(parents, 1)[0]
        assert torch.equal(short, T.tree_masks_ref(parents, 1)[0]) and not torch.equal(short, ref_anc)


@kernel_case
@pytest.mark.parametrize("shape", [(32, 6, 8), (7, 3, 3)])
def test_kernel_tree_round_equals_the_pytorch_round(monkeypatch, shape):
    # Greedy output of a tree engine (tiny model, its truncation as drafter) with the bookkeeping kernels on
    # equals the PyTorch bookkeeping's, token for token, at mixed prompt lengths.
    from helpers import WordTokenizer, prompts, tiny_model

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams
    from sglang_specpilot.kernels import launch, rms_norm

    target = tiny_model("tiny-llama")
    ps = prompts([5, 13, 9], target.cfg.vocab_size, seed=2)
    budget, depth, top_k = shape
    monkeypatch.setattr(rms_norm, "rms_norm", rms_norm.rms_norm_ref)  # rounds its own way: its own tests
    out = {}
    for on in (False, True):
        monkeypatch.setattr(launch, "ROUND_KERNELS", on)
        tree = dict(tree_budget=budget, tree_depth=depth, tree_top_k=top_k)
        o = EngineOptions(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", **tree)
        eng = Engine(target, WordTokenizer(), o, target.truncated(2))
        res = eng.generate(ps, SamplingParams(max_new_tokens=12, ignore_eos=True))
        out[on] = [r.token_ids for r in res], eng.batch.round_tokens
    assert out[True] == out[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a captured, compiled round runs on a GPU only")
def test_captured_tree_round_with_the_kernels_equals_the_pytorch_round(monkeypatch):
    # The default GPU path (CUDA graphs, compiled blocks) with SPECPILOT_ROUND_KERNELS on and off, greedy, at
    # mixed prompt lengths and batch 3: the same tokens and the same accepted nodes.
    from helpers import WordTokenizer, prompts, tiny_model

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams
    from sglang_specpilot.kernels import launch, rms_norm

    target = tiny_model("tiny-llama").cuda()
    ps = prompts([5, 17, 9], target.cfg.vocab_size, seed=1)
    monkeypatch.setattr(rms_norm, "rms_norm", rms_norm.rms_norm_ref)  # rounds its own way: its own tests
    out = {}
    for on in (False, True):
        monkeypatch.setattr(launch, "ROUND_KERNELS", on)
        tree = dict(tree_budget=32, tree_depth=6, tree_top_k=8)
        o = EngineOptions(max_seq_len=256, max_batch_size=4, graph_batch_sizes=(1, 2, 4), device="cuda",
                          dtype="float32", compile=True, cuda_graphs=True, **tree)  # fmt: skip
        eng = Engine(target, WordTokenizer(), o, target.truncated(2))
        res = eng.generate(ps, SamplingParams(max_new_tokens=24, ignore_eos=True))
        out[on] = [r.token_ids for r in res], eng.batch.round_tokens
    assert out[True] == out[False]
