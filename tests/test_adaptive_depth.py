"""Adaptive draft length (issue 18): the batch drafts the deepest depth any of its rows wants, from their
recent acceptance; greedy output equals AR and each request alone at every depth."""

import pytest
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.adaptive_depth import batch_depth, wanted_depth

DEPTHS = (8, 12, 16)
SHAPES = {"chain": {"num_speculative_tokens": 16}, "tree": {"tree_budget": 24, "tree_depth": 16, "tree_top_k": 2}}


def _engine(target, draft, shape, **kw):
    opts = EngineOptions(max_seq_len=320, max_batch_size=4, device="cpu", dtype="float32", **SHAPES[shape], **kw)
    return Engine(target, WordTokenizer(), opts, draft)


def _ids(eng, ps, n=40):
    return [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=n, ignore_eos=True))]


def test_wanted_depth_rule():
    assert wanted_depth(None, False, DEPTHS, None) == 16  # unknown: deepest, which measures it
    assert wanted_depth(1.5, False, DEPTHS, 16) == 8  # ~0.5 accepted: the shortest
    assert wanted_depth(9.0, False, DEPTHS, 12) == 12  # 8 accepted + 2 headroom
    assert wanted_depth(8.0, True, DEPTHS, 8) == 12  # capped at 8: try deeper
    assert batch_depth([(1.0, False), (13.0, False)], DEPTHS, 16) == 16  # the deepest any row wants
    with pytest.raises(ValueError, match="adaptive_depths"):
        EngineOptions(num_speculative_tokens=8, adaptive_depths=(8, 12), device="cpu")


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_low_acceptance_drafts_short_and_output_is_exact(shape):
    target = tiny_model("tiny-llama")
    random_drafter = tiny_model("tiny-llama", seed=7, num_layers=1)
    ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=1)
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(max_seq_len=320, device="cpu", dtype="float32")), ps)
    eng = _engine(target, random_drafter, shape, adaptive_depths=(8, 12))
    alone = [_ids(eng, [p])[0] for p in ps]
    assert _ids(eng, ps) == ar == alone
    rounds = eng.policy.depth_rounds
    assert rounds.get(8, 0) > 3 * rounds.get(16, 0)


def test_high_acceptance_drafts_deep():
    target = tiny_model("tiny-llama")
    ps = prompts([5, 9], target.cfg.vocab_size, seed=2)
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(max_seq_len=320, device="cpu", dtype="float32")), ps)
    eng = _engine(target, target.truncated(target.num_layers), "chain", adaptive_depths=(8, 12))
    assert _ids(eng, ps) == ar
    assert set(eng.policy.depth_rounds) == {16}


def test_eagle3_and_auto_off_together_equal_ar():
    import torch

    from sglang_specpilot.drafters.eagle3 import init_eagle3

    V = 12
    target = tiny_model("tiny-llama", vocab_size=V)
    torch.manual_seed(0)
    draft = init_eagle3(target)
    ps = prompts([5, 11, 3], V, seed=4)
    base = dict(max_seq_len=320, max_batch_size=4, device="cpu", dtype="float32")
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(**base)), ps)
    adaptive = dict(num_speculative_tokens=8, adaptive_depths=(4, 6))
    eng = Engine(target, WordTokenizer(), EngineOptions(**base, **adaptive), draft)
    assert _ids(eng, ps) == ar
    assert min(eng.policy.depth_rounds) < 8  # shorter EAGLE-3 rounds ran (a narrower feature window)
    both = EngineOptions(**base, **adaptive, auto_off=True, auto_off_curve=((1, 1.0, 2.0),), auto_off_probe_every=3)
    eng = Engine(target, WordTokenizer(), both, draft)
    assert _ids(eng, ps) == ar
    assert eng.policy.decisions.get("ar", 0) > 0
