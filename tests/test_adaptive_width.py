"""Adaptive verify width (``engine/adaptive_width.py``): a narrower width's tokens, computed from where a
round's accepted nodes ranked, are exactly what that width's round emits; the policy picks the width with
the most estimated tokens per ms, probes the widest, keeps the default without estimates; greedy output
is unchanged."""

import pytest
import torch
from helpers import WordTokenizer, prompts, serve_one_at_a_time, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.adaptive_width import WidthEstimates, best_width, counterfactual
from sglang_specpilot.engine.round_kinds import kinds_at, width_keys
from sglang_specpilot.engine.sampling import BatchSampling
from sglang_specpilot.engine.step_curve import StepCurve
from sglang_specpilot.server.metrics import Metrics

TREE = dict(tree_budget=16, tree_depth=4, tree_top_k=4)


def _engine(**kw):
    target = tiny_model("tiny-llama")
    torch.manual_seed(0)
    draft = target.truncated(1)
    opts = dict(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", **TREE, shared_budget=64)
    opts |= dict(auto_off=True, adaptive_width=True) | kw
    return Engine(target, WordTokenizer(), EngineOptions(**opts), draft)


def test_counterfactual():
    assert counterfactual([1, 3, 9], 3, 16) == 4
    assert counterfactual([1, 3, 9], 3, 8) == 3
    assert counterfactual([1, 3, 9], 3, 2) == 2
    assert counterfactual([1, 3, 9], 1, 16) == 2  # entries past n are the path's padding
    assert counterfactual([], 0, 4) == 1


def test_options():
    with pytest.raises(ValueError, match="adaptive_width"):
        EngineOptions(device="cpu", **TREE, auto_off=True, adaptive_width=True)
    with pytest.raises(ValueError, match="adaptive_width"):
        EngineOptions(device="cpu", **TREE, shared_budget=32, adaptive_width=True)


def test_narrower_rounds_emit_exactly_the_counterfactual():
    """From the same state, the round at width 16 and the narrower kinds (4, 8) and (4, 4): each narrower
    round emits the tokens the wider round's ranks predict for it, row by row."""
    eng = _engine()
    st, V = eng.state, eng.target.cfg.vocab_size
    reqs = [eng.new_request(p, SamplingParams(max_new_tokens=200, ignore_eos=True))
            for p in prompts([6, 11, 4, 9], V, seed=2)]  # fmt: skip
    eng.batch.admit(reqs)
    bs = BatchSampling.from_params([SamplingParams()] * 4, eng.device)
    D, col = eng.round.shape.depth, eng.round.rank_col
    assert col == D + 1 and st.out.shape[1] == 2 * D + 3
    nontrivial = 0
    for _ in range(12):
        saved = [t.clone() for t in st.row_tensors()]
        eng.run_round(4, bs, None, None)  # the main round: 16 nodes a row
        wide = st.out.clone()
        for w in (8, 4):
            for t, v in zip(st.row_tensors(), saved, strict=True):
                t.copy_(v)
            eng.run_round(4, bs, None, (D, w))
            for r in range(4):
                n = int(wide[r, -1])
                ranks = wide[r, col : col + D].tolist()
                assert int(st.out[r, -1]) + 1 == counterfactual(ranks, n, w), (r, w, ranks, n)
                # the same tokens, as far as the narrower round went
                k = int(st.out[r, -1])
                assert st.out[r, :k].tolist() == wide[r, :k].tolist()
                nontrivial += any(x > i + 1 for i, x in enumerate(ranks[:n]))
        for t, v in zip(st.row_tensors(), saved, strict=True):  # go on from the wide round
            t.copy_(v)
        eng.run_round(4, bs, None, None)
    assert nontrivial  # some accepted path went through a sibling: the ranks were not just 1, 2, 3


def _curve(spec_ms: dict, b: int) -> StepCurve:
    c = StepCurve()
    c.add("ar", b, 10.0)
    for k, ms in spec_ms.items():
        c.add(k, b, ms)
    return c


def test_policy_picks_most_tokens_per_ms_and_probes_the_widest():
    eng = _engine()
    pol = eng.policy
    b, D = 4, eng.round.shape.depth
    keys = width_keys(eng, D, b)
    assert keys == [(16, None), (8, (D, 8)), (4, (D, 4))]
    assert {(D, 8), (D, 4)} <= set(kinds_at(eng, b))
    pol.auto_off.curve = _curve({"spec": 3.0, (D, 8): 2.0, (D, 4): 1.5}, b)
    rows = [0, 1, 2, 3]
    assert pol.choose(rows, b) is None  # no estimates yet: the widest
    assert pol.width_choices == {"widest": 1}
    for r in rows:  # tokens at 16 / 8 / 4 nodes: 3.0 / 2.8 / 2.0 -> per ms 1.0 / 1.4 / 1.33
        pol.widths.est[r] = {(D, 16): 3.0, (D, 8): 2.8, (D, 4): 2.0}
    assert pol.choose(rows, b) == (D, 8)
    pol.auto_off.curve = _curve({"spec": 3.0, (D, 8): 2.0, (D, 4): 1.0}, b)
    assert pol.choose(rows, b) == (D, 4)
    for _ in range(pol.probe_every - 2):
        assert pol.choose(rows, b) == (D, 4)
    assert pol.choose(rows, b) is None  # the probe: the widest refreshes the wider estimates
    assert pol.width_choices["probe"] == 1
    pol.widths.forget(2)  # three of four rows estimated: they decide
    assert pol.choose(rows, b) == (D, 4)
    for r in (0, 1, 3):
        pol.widths.forget(r)
    assert pol.choose(rows, b) is None  # fewer than half estimated: the widest measures them


def test_observe_updates_the_run_width_and_narrower():
    est = WidthEstimates(3, alpha=1.0)
    est.observe(0, 4, [8, 4], [1, 5, 6, 0], 4)  # 3 accepted at ranks 0, 4, 5
    assert est.est[0] == {(4, 8): 4.0, (4, 4): 2.0}
    assert est.tau([0], 4, 8) == 4.0 and est.tau([0, 1], 4, 8) == 4.0 and est.tau([0, 1, 2], 4, 8) is None
    assert best_width([(8, "a"), (4, "b")], lambda w: est.tau([0], 4, w), {"a": 2.0, "b": 1.0}.get) == 8
    assert best_width([(8, "a"), (4, "b")], lambda w: est.tau([0], 4, w), {"a": 2.0}.get) is None


def test_greedy_output_unchanged_when_widths_change():
    """Staggered requests under adaptive width (a curve that makes narrow widths pay) emit what each
    emits alone under plain AR."""
    eng = _engine()
    ar = Engine(eng.target, WordTokenizer(), EngineOptions(max_seq_len=256, max_batch_size=4, device="cpu",
                                                           dtype="float32"))  # fmt: skip
    D = eng.round.shape.depth
    curve = StepCurve()
    for b in (1, 2, 4):
        for k, ms in {"ar": 10.0, "spec": 3.0, (D, 8): 1.2, (D, 4): 1.0}.items():
            curve.add(k, b, ms)
    eng.policy.auto_off.curve = curve
    ps = prompts([9, 30, 4, 17, 22, 6], eng.target.cfg.vocab_size, seed=5)
    n_new = [20, 12, 18, 9, 16, 14]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in n_new]
    want = [ar.generate([p], sp)[0].token_ids for p, sp in zip(ps, params, strict=True)]
    assert serve_one_at_a_time(eng, ps, params) == want
    assert eng.policy.width_choices.get("chosen", 0) > 0
    assert set(eng.policy.width_rounds) & {4, 8}  # narrower widths ran
    m = Metrics()
    m.round(eng.batch)
    text = m.render()
    assert f'specpilot_adaptive_width_choices_total{{how="chosen"}} {eng.policy.width_choices["chosen"]}' in text


def test_a_width_probe_runs_its_tree_even_where_a_chain_wins():
    # Chain kinds must not swallow adaptive width's probe of the widest tree, or the wider widths' estimates
    # would never be refreshed while chains win.
    eng = _engine(chain_depths=(2,))
    pol, b, D = eng.policy, 4, eng.round.shape.depth
    pol.auto_off.curve = _curve({"spec": 3.0, (D, 8): 2.0, (D, 4): 1.0, "chain2": 0.5}, b)
    rows = [0, 1, 2, 3]
    for r in rows:
        pol.widths.est[r] = {(D, 16): 3.0, (D, 8): 2.8, (D, 4): 2.0}
        pol.acc.observe(r, 3, D)
        pol.chains.est[r] = {2: 2.5}
    pol._narrow.n = pol.probe_every - 1  # the width probe is due after one more narrow round
    keys = [pol.choose(rows, b) for _ in range(3)]
    assert keys == ["chain2", None, "chain2"]  # the probe ran the widest tree, then the chain again
    assert pol.width_choices["probe"] == 1 and pol.chain_rounds == {2: 2}
