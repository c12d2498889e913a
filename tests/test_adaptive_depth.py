"""Adaptive draft length (issue 18): the batch drafts the deepest depth any of its rows wants, from their
recent acceptance; greedy output equals AR and each request alone at every depth."""

import pytest
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.acceptance import ALPHA
from sglang_specpilot.engine.adaptive_depth import DepthEstimates, batch_depth, best_depth, wanted_depth
from sglang_specpilot.engine.estimates import SWITCH_MARGIN, most_per_ms, switch_margin
from sglang_specpilot.engine.round_kinds import kind_key
from sglang_specpilot.engine.step_curve import StepCurve
from sglang_specpilot.server.metrics import Metrics

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
    assert set(eng.policy.depth_choices) == {"rule"}  # no step curve: the headroom rule, as before


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


def test_depth_estimates_are_counterfactual():
    est = DepthEstimates(3, (3, 4, 6), alpha=1.0)
    est.observe(0, 3, 6)  # depth 6 accepted 2: every depth would have emitted 3
    assert est.est[0] == {3: 3.0, 4: 3.0, 6: 3.0}
    est.observe(0, 6, 6)  # accepted 5: depth 3 would have stopped at 3 accepted
    assert est.est[0] == {3: 4.0, 4: 5.0, 6: 6.0}
    est.observe(1, 5, 4)  # a round at depth 4 says nothing about depth 6
    assert est.est[1] == {3: 4.0, 4: 5.0}
    assert est.tau([0, 1], 4) == 5.0 and est.tau([0, 1], 6) == 6.0  # half the rows known: they decide
    assert est.tau([0, 1, 2], 6) is None  # fewer than half
    est.forget(0)
    assert est.tau([0], 3) is None
    ema = DepthEstimates(1, (3, 6))
    ema.observe(0, 3, 6)
    ema.observe(0, 6, 6)
    assert ema.est[0] == {3: pytest.approx(3 + ALPHA), 6: pytest.approx(3 + 3 * ALPHA)}


def test_best_depth_picks_most_tokens_per_ms():
    cands = [(3, 3), (6, None)]  # (depth, kind key): None is the engine's own round
    tau = {3: 3.0, 6: 4.0}.get
    assert best_depth(cands, tau, {3: 5.82, None: 6.56}.get) == 6  # 0.61 tokens/ms against 0.52
    assert best_depth(cands, tau, {3: 5.82, None: 9.0}.get) == 3  # the deep round costs much more
    assert best_depth(cands, tau, {3: 5.82}.get) is None  # a kind not measured
    assert best_depth(cands, {6: 4.0}.get, {3: 5.82, None: 6.56}.get) is None  # a depth not estimated


def _curve(b: int, ms: dict) -> StepCurve:
    c = StepCurve()
    for kind, v in ms.items():
        c.add(kind, b, v)
    return c


def test_policy_picks_the_cost_optimal_depth():
    target = tiny_model("tiny-llama")
    opts = dict(max_seq_len=320, max_batch_size=4, device="cpu", dtype="float32", num_speculative_tokens=6)
    opts |= dict(adaptive_depths=(3, 4), auto_off=True, auto_off_curve=((1, 1.0, 1.5),))
    eng = Engine(target, WordTokenizer(), EngineOptions(**opts), target.truncated(1))
    pol, b, rows = eng.policy, 2, [0, 1]
    # Step times as measured on the H200 at batch 1 (2bcb6d1): depth 6 (the engine's round), 4, 3, AR.
    h200 = {"spec": 6.56, 4: 6.08, 3: 5.82, "ar": 4.22}
    pol.auto_off.curve = _curve(b, h200)
    pol.observe(0, 5, None)  # accepted 4 at depth 6: estimates 4 / 5 / 5 at depths 3 / 4 / 6
    pol.observe(1, 3, None)  # accepted 2: 3 / 3 / 3
    # Mean tokens 3.5 / 4 / 4: per ms 0.601 at depth 3, 0.658 at 4, 0.610 at 6. Depth 4 promises 7.9% more
    # than the configured depth, inside two rows' margin (``estimates.switch_margin``, 10.6%): depth 6 stays.
    assert switch_margin(2) == pytest.approx(0.106, abs=1e-3)
    assert pol.choose(rows, b) is None
    cheap4 = h200 | {4: 5.5}  # 0.727 at depth 4: 19% more, past the margin
    pol.auto_off.curve = _curve(b, cheap4)
    assert pol.choose(rows, b) == 4
    assert pol.depth_choices == {"chosen": 2}
    pol.observe(0, 5, 4)  # capped at depth 4: depth 6 may accept more, so the batch goes one deeper
    assert pol.choose(rows, b) is None and pol.depth_choices["capped"] == 1
    pol.acc.capped[0] = False
    pol.auto_off.curve = _curve(b, h200 | {"spec": 6.0})  # 0.667 at depth 6
    assert pol.choose(rows, b) is None
    pol.auto_off.curve = _curve(b, h200 | {3: 4.0})  # 0.875 at depth 3
    assert pol.choose(rows, b) == 3
    assert pol.depth_choices == {"chosen": 4, "capped": 1}
    pol.auto_off.curve = _curve(b, {k: v for k, v in h200.items() if k != 4})  # depth 4 not measured
    assert pol.choose(rows, b) is None and pol.depth_choices["rule"] == 1  # the rule: 4 accepted + 2 -> 6
    pol.auto_off.curve = _curve(b, cheap4)
    pol.forget(1)  # one of two rows without estimates: the other decides (5 / 5.5 against 5 / 6.56)
    assert pol.choose(rows, b) == 4 and pol.depth_choices["rule"] == 1
    pol.forget(0)  # none estimated: the rule (which drafts deepest to measure them)
    assert pol.choose(rows, b) is None and pol.depth_choices["rule"] == 2


def test_a_non_default_choice_must_clear_a_margin_that_shrinks_with_rows():
    """``most_per_ms`` keeps its first candidate (the configured round) unless another promises more tokens per
    ms by more than the margin; the margin is ``SWITCH_MARGIN`` at one row and falls as 1 / sqrt(rows)."""
    cands = [(6, "deep"), (3, "shallow")]
    tau = {6: 3.0, 3: 2.7}.get
    ms = {"deep": 6.0, "shallow": 5.0}.get  # 0.54 against 0.50 tokens per ms: 8% more for the shallow round
    assert most_per_ms(cands, tau, ms) == 3
    assert most_per_ms(cands, tau, ms, switch_margin(1)) == 6  # one row: inside 15%
    assert most_per_ms(cands, tau, ms, switch_margin(16)) == 3  # 16 rows: past 3.75%
    assert switch_margin(1) == SWITCH_MARGIN and switch_margin(64) == pytest.approx(SWITCH_MARGIN / 8)
    assert most_per_ms(cands, {6: 3.0}.get, ms, 0.1) is None  # an estimate missing: the caller's default


def test_a_shallow_stretch_probes_the_main_depth():
    """After ``probe_every`` rounds in a row chosen below the main depth, the main depth runs once, so its
    estimates (which shallower rounds never refresh) are measured again; a chain kind does not take the
    probe's place."""
    target = tiny_model("tiny-llama")
    opts = dict(max_seq_len=320, max_batch_size=4, device="cpu", dtype="float32", tree_budget=8, tree_depth=6)
    opts |= dict(tree_top_k=2, adaptive_depths=(3,), auto_off=True, auto_off_curve=((1, 1.0, 1.5),))
    eng = Engine(target, WordTokenizer(), EngineOptions(**opts, chain_depths=(2,)), target.truncated(1))
    pol, b, rows = eng.policy, 2, [0, 1]
    pol.auto_off.curve = _curve(b, {"spec": 9.0, 3: 4.0, "chain2": 4.5, "ar": 2.0})
    for r in rows:  # accepted 2 at depth 6: 3 tokens at either depth, so depth 3 (the cheaper) wins
        pol.observe(r, 3, None)
        pol.chains.update(r, 2, 1.0)  # a chain of 2 that would lose to the tree of 3
    every = pol.probe_every
    assert [pol.choose(rows, b) for _ in range(every)] == [3] * every
    assert pol.choose(rows, b) is None  # the probe: the main depth, not a chain
    assert pol.depth_choices == {"chosen": every, "probe": 1}
    assert pol.depth_rounds == {3: every, 6: 1}
    for r in rows:
        pol.chains.est[r][2] = 5.0  # now the chain wins: it runs where no probe is due
    assert pol.choose(rows, b) == "chain2"


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_cost_chosen_depths_keep_output_exact(shape):
    """With a step curve that measures every depth, the batch runs the depth with the most tokens per ms
    (here 12, planted cheapest, where the headroom rule would pick 8 for a drafter that accepts little), and
    greedy output is AR's."""
    target = tiny_model("tiny-llama")
    ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=3)
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(max_seq_len=320, device="cpu", dtype="float32")), ps)
    eng = _engine(target, target.truncated(1), shape, adaptive_depths=(8, 12), auto_off=True,
                  auto_off_curve=((1, 1.0, 1.5),))  # fmt: skip
    curve = StepCurve()
    for b in range(1, 5):
        for kind, ms in {"ar": 3.0, "spec": 3.0, 12: 1.0, 8: 1.5}.items():  # speculation always wins
            curve.add(kind, b, ms)
    eng.policy.auto_off.curve = curve
    assert _ids(eng, ps) == ar
    rounds, choices = eng.policy.depth_rounds, eng.policy.depth_choices
    assert rounds.get(12, 0) > 3 * (rounds.get(8, 0) + rounds.get(16, 0)) and choices["chosen"] > 3 * choices["rule"]
    m = Metrics()
    m.round(eng.batch)
    assert f'specpilot_adaptive_depth_choices_total{{how="chosen"}} {choices["chosen"]}' in m.render()


def test_a_narrowed_main_tree_still_gives_the_main_depth_an_estimate():
    """Under a shared budget the main tree runs narrowed at larger buckets, and its width may cap its depth
    (here (6, 4) drafts 4 levels at bucket 4). Its rounds must still estimate the main depth the policy asks
    about: keyed by the capped depth, adaptive depth fell back to its rule and the chain-or-tree choice stayed
    unmeasured in every round at 32 and 64 clients on the H100 (937d7ec)."""
    target = tiny_model("tiny-llama")
    opts = dict(max_seq_len=320, max_batch_size=8, device="cpu", dtype="float32", tree_budget=16, tree_depth=6)
    opts |= dict(tree_top_k=4, adaptive_depths=(3, 4), auto_off=True, auto_off_curve=((1, 1.0, 1.5),))
    eng = Engine(
        target, WordTokenizer(), EngineOptions(**opts, shared_budget=16, chain_depths=(3,)), target.truncated(1)
    )
    pol, b, rows = eng.policy, 4, [0, 1, 2, 3]
    main = kind_key(eng, 6, b)
    assert main == (6, 4) and eng.kinds[main].shape.depth == 4  # the width caps the main tree's depth
    # The H100's step times at 32 rows (937d7ec): the narrowed trees, stock's chain of 3, AR.
    pol.auto_off.curve = _curve(b, {main: 9.03, (4, 4): 9.03, (3, 4): 8.63, "chain3": 7.99, "ar": 6.38})
    for r in rows:
        pol.observe(r, 3, main)  # accepted 2 of the 4 levels drafted
        pol.chains.update(r, 3, 3.0)  # a chain of 3 would have emitted as many
    key = pol.choose(rows, b)
    assert "rule" not in pol.depth_choices and "unmeasured" not in pol.chain_choices
    assert key == "chain3"  # as many tokens in 7.99 ms as the tree's in 8.63-9.03: the chain
    assert pol.depth_est.tau(rows, 6) == 3 and pol.depth_est.tau(rows, 3) == 3
