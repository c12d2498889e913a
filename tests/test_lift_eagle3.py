"""The EAGLE-3 drafter lift (models/lift_eagle3.py): on the lifted target it drafts what it drafts small.

CPU, fp32. The small pair is a random tiny Llama (vocabulary 12, so an untrained drafter still gets drafts
accepted) with a perturbed EAGLE-3 drafter (a reduced draft vocabulary); the lift is the "tiny" shape
(Llama-3.1-8B's heads: 32 query / 8 K/V heads of 128, so the sqrt(2) scale, the rope pairs and the 3-in-4
style GQA copies are the real ones) cut to 8 layers (the small target's 4 and 4 near-identity ones).
The Llama-3.1-8B drafter shapes themselves are checked on the lifted tensors alone.
"""

from __future__ import annotations

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters.eagle3 import init_eagle3, load_eagle3, save_eagle3
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import ModelRunner
from sglang_specpilot.models.lift import SHAPES, lift_model
from sglang_specpilot.models.lift_eagle3 import eagle3_plan, lift_eagle3, lifted_eagle3_tensors

V = 12
VOCAB = [0, 2, 3, 5, 7, 8, 11]  # the draft vocabulary (d2t)
SHAPE = {**SHAPES["tiny"], "num_layers": 8}
KINDS = {"chain": {"num_speculative_tokens": 4}, "tree": {"tree_budget": 10, "tree_depth": 4, "tree_top_k": 3}}


def _small_pair(head="target", intermediate_size=None):
    target = tiny_model("tiny-llama", vocab_size=V, rope_scaling=None)  # the lift keeps rope unscaled
    torch.manual_seed(0)
    draft = init_eagle3(target, d2t=torch.tensor(VOCAB), head=head, intermediate_size=intermediate_size)
    with torch.no_grad():  # off the warm start, so the features and every weight matter
        for name, p in draft.named_parameters():
            if not name.startswith("embed."):
                p.add_(torch.randn_like(p) * 0.2)
    return target, draft


@pytest.fixture(scope="module")
def pairs():
    target, draft = _small_pair()
    big = lift_model(target, SHAPE, seed=0)
    return (target, draft), (big, lift_eagle3(draft, big, SHAPE, seed=1))


def _engine(target, draft, kind):
    opts = EngineOptions(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4, **KINDS.get(kind, {}))
    return Engine(target, WordTokenizer(), opts, draft)


def _features_and_hidden(target, draft, seq):
    """One teacher-forced pass over ``seq``: the drafter's g (fc of the target features one position
    earlier), its hidden states h, then h fed back as the next g (the tree's deeper nodes), with logits."""
    S = len(seq)
    toks = torch.tensor([seq])
    zero = torch.zeros(1, dtype=torch.long)
    anc, depth = causal_tree(S)
    tgt = ModelRunner(target, 1, 128, cuda_graphs=False, scratch_slots=64)
    _, feats = tgt.step(toks, zero, anc, depth, eager=True, feature_layers=draft.feature_layers)
    g = draft.project(torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1))
    out = {"g": g}
    for name, gin in (("h", g), ("h2", None)):
        runner = ModelRunner(draft, 1, 128, cuda_graphs=False, scratch_slots=64)
        h = runner.step(toks, zero, anc, depth, eager=True, g=out["h"] if gin is None else gin)
        out[name], out[name + "_logits"] = h, draft.logits(h)
    return out


@torch.inference_mode()
def test_live_dims_and_logits_match(pairs):
    (small, draft), (big, bdraft) = pairs
    seq = prompts([20], V, seed=3)[0]
    a, b = _features_and_hidden(small, draft, seq), _features_and_hidden(big, bdraft, seq)
    h, plan = small.cfg.hidden_size, eagle3_plan(draft, SHAPE)
    for name in ("g", "h", "h2"):  # live dims: the small drafter's; dead dims: the lift's constants
        scale = a[name].abs().max()
        assert (b[name][..., :h] - a[name]).abs().max() <= 2e-5 * scale, name
        dead_sq = b[name][0, 1:, h:].double().square().sum(-1)  # position 0 reads the zero feature
        torch.testing.assert_close(dead_sq, torch.full_like(dead_sq, plan.dead_sq), rtol=1e-5, atol=0)
    for name in ("h_logits", "h2_logits"):
        x, y = a[name], b[name]
        assert (x - y).abs().max() <= 2e-5 * x.abs().max(), float((x - y).abs().max())
        assert torch.equal(x.topk(3).indices, y.topk(3).indices)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_lifted_pair_drafts_like_the_small_pair(pairs, kind):
    (small, draft), (big, bdraft) = pairs
    ps = prompts([5, 9, 3], V, seed=1)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ref = _engine(small, draft, kind).generate(ps, params)
    eng = _engine(big, bdraft, kind)
    got = eng.generate(ps, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [r.rounds for r in got] == [r.rounds for r in ref]  # the same drafts accepted, round for round
    assert eng.batch.round_tokens > eng.batch.rounds  # drafts were accepted
    ar = _engine(big, None, "ar").generate(ps, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in ar]


def test_trained_head_lifts_too():
    small, draft = _small_pair(head="trained")
    big = lift_model(small, SHAPE, seed=0)
    bdraft = lift_eagle3(draft, big, SHAPE)
    ps = prompts([6, 4], V, seed=5)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    ref = _engine(small, draft, "tree").generate(ps, params)
    got = _engine(big, bdraft, "tree").generate(ps, params)
    assert [(r.token_ids, r.rounds) for r in got] == [(r.token_ids, r.rounds) for r in ref]


def test_llama31_8b_drafter_shapes_nothing_zero():
    """At Llama-3.1-8B's shapes every tensor of the lifted drafter has EAGLE-3's 8B shape and no zeros."""
    _, draft = _small_pair()
    t = lifted_eagle3_tensors(draft, eagle3_plan(draft, "llama-3.1-8b"))
    H, n = 4096, len(draft.feature_layers)
    want = {
        "fc.weight": (H, n * H),
        "layers.0.attn.wqkv.weight": (4096 + 2 * 1024, 2 * H),
        "layers.0.attn.wo.weight": (H, 4096),
        "layers.0.mlp.w13.weight": (2 * 14336, H),
        "layers.0.mlp.w2.weight": (H, 14336),
        "lm_head.weight": (len(VOCAB), H),
    }
    for name, shape in want.items():
        assert tuple(t[name].shape) == shape, name
    for name, x in t.items():
        assert not (x == 0).any(), name


def test_save_load_round_trip(pairs, tmp_path):
    # Every norm keeps the lifted config's eps, so the folder loads onto the lifted target as it is.
    (_, _), (big, bdraft) = pairs
    loaded = load_eagle3(save_eagle3(bdraft, tmp_path / "d"), big)
    x = torch.randn(2, 3, big.cfg.hidden_size)
    want = bdraft.logits(x)
    assert (loaded.logits(x) - want).abs().max() <= 2e-2 * want.abs().max()  # bf16 storage
    assert loaded.feature_layers == bdraft.feature_layers and torch.equal(loaded.d2t, bdraft.d2t)


def test_refuses_a_target_lifted_otherwise(pairs):
    (_, draft), (big, _) = pairs
    with pytest.raises(ValueError, match="num_layers"):
        lift_eagle3(draft, big, {**SHAPE, "num_layers": 10})
    other = lift_model(tiny_model("tiny-llama", vocab_size=V, rope_scaling=None, std=0.6), SHAPE)
    with pytest.raises(ValueError, match="eps"):
        lift_eagle3(draft, other, SHAPE)
    with pytest.raises(ValueError, match="unknown lift shape"):
        lift_eagle3(draft, big, "no-such-shape")


def test_a_wider_mlp_lifts_into_the_same_drafter_shapes():
    # The lifted drafter's MLP has the big shape's units whatever the small one's: a wider small MLP fills
    # more of them with live units, at the same lifted cost.
    target, draft = _small_pair(intermediate_size=3 * 160)
    big = lift_model(target, SHAPE, seed=0)
    bdraft = lift_eagle3(draft, big, SHAPE, seed=1)
    assert bdraft.layers[0].mlp.w2.weight.shape == (SHAPE["hidden_size"], SHAPE["intermediate_size"])
    ps = prompts([5, 9, 3], V, seed=1)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ref = _engine(target, draft, "tree").generate(ps, params)
    got = _engine(big, bdraft, "tree").generate(ps, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [r.rounds for r in got] == [r.rounds for r in ref]  # the same drafts accepted, round for round
