"""Chain kinds (``EngineOptions.chain_depths``, ``engine.chain_kinds``): a tree batch may run a greedy chain
instead where the step curve and the counterfactual estimates promise more tokens per ms; the tree round's
top-1 run predicts what the chain accepts, and greedy output still equals AR."""

import pytest
from helpers import WordTokenizer, captured_case, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.chain_kinds import ChainEstimates, chain_depth, chain_key, greedy_run
from sglang_specpilot.engine.round_kinds import kinds_at
from sglang_specpilot.engine.sampling import BatchSampling
from sglang_specpilot.engine.step_curve import StepCurve
from sglang_specpilot.server.metrics import Metrics

TREE = dict(tree_budget=8, tree_depth=4, tree_top_k=3)


def _engine(target, draft, dtype="float32", **kw):
    opts = EngineOptions(max_seq_len=256, max_batch_size=8, device="cpu", dtype=dtype, **kw)
    return Engine(target, WordTokenizer(), opts, draft)


def test_keys_runs_and_estimates():
    assert chain_key(3) == "chain3" and chain_depth("chain3") == 3
    assert chain_depth("ar") is None and chain_depth((4, 8)) is None and chain_depth(3) is None
    assert greedy_run([0, 0, 2, 0], 4) == 2 and greedy_run([0, 0, 0], 2) == 2 and greedy_run([1, 0], 2) == 0
    est = ChainEstimates(3, (2, 4), alpha=0.5)
    est.observe_tree(0, 3, 3, 4)  # a depth-4 tree's three accepted, all top-1: a chain of 2 emits 3, one of 4 >= 4
    assert est.tau([0], 2) == 3 and est.tau([0], 4) == 4 and est.tau([0, 1, 2], 2) is None
    est.observe_tree(1, 2, 2, 2)  # a depth-2 tree showed nothing past depth 2: no estimate for a chain of 4
    assert est.tau([1], 2) == 3 and est.tau([1], 4) is None
    est.observe_tree(1, 1, 2, 2)  # left the top-1 line after one node: every chain accepts exactly one
    assert est.tau([1], 2) == 2.5 and est.tau([1], 4) == 2
    est.observe_chain(0, 1, 2)  # a chain of 2 accepted 1: says nothing about depth 4
    assert est.tau([0], 2) == 2.5 and est.tau([0], 4) == 4
    est.observe_chain(0, 4, 4)
    assert est.tau([0], 2) == 2.75 and est.tau([0], 4) == 4.5


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(chain_depths=(2,), auto_off=True), "tree"),
        (dict(chain_depths=(2,), **TREE), "auto_off"),
        (dict(chain_depths=(5,), auto_off=True, **TREE), "1..4"),
        (dict(chain_depths=(0,), auto_off=True, **TREE), "1..4"),
    ],
)
def test_options_refuse_what_cannot_run(kw, needle):
    with pytest.raises(ValueError, match=needle):
        EngineOptions(device="cpu", **kw)


def test_chain_kinds_need_a_draft_model():
    target = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="draft model"):
        _engine(target, None, ngram_size=3, **TREE, auto_off=True, chain_depths=(2,))


def test_chain_kinds_run_at_every_bucket_and_trees_write_the_top1_run():
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(2), **TREE, auto_off=True, chain_depths=(2, 3), shared_budget=12)
    assert {"chain2", "chain3"} <= set(eng.kinds) and eng.kinds["chain3"].shape.chain
    for b in (1, 2, 4, 8):
        assert {"chain2", "chain3"} <= set(kinds_at(eng, b))
    D = eng.round.shape.depth
    assert eng.state.out.shape[1] == D + 4 and eng.round.greedy_col == D + 1
    assert eng.kinds["chain3"].greedy_col is None and eng.kinds["ar"].greedy_col is None
    assert all(r.greedy_col == D + 1 for k, r in eng.kinds.items() if isinstance(k, tuple))
    assert not _engine(target, target.truncated(2), **TREE, auto_off=True).state.out.shape[1] == D + 4


def _snapshot(st, b):
    return [t[:b].clone() for t in (*st.row_tensors(), st.history)]


def _restore(st, b, saved):
    for t, v in zip((*st.row_tensors(), st.history), saved, strict=True):
        t[:b].copy_(v)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_top1_run_is_what_the_chain_accepts(seed):
    # The tree's rank-0 children are the chain's argmaxes (up to float32 near-ties). From one state, a tree
    # round's top-1 run g is exactly what a chain of the tree's depth accepts where the tree's path left the
    # top-1 line (g < n), and a lower bound where it did not.
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(2), **TREE, auto_off=True, chain_depths=(4,))
    ps = prompts([5, 9, 3, 12], target.cfg.vocab_size, seed=seed)
    batch = eng.batch
    params = SamplingParams(max_new_tokens=150, ignore_eos=True)
    batch.admit([eng._make_request(i, p, params) for i, p in enumerate(ps)])
    b, st = 4, eng.state
    bs = BatchSampling.from_params([params] * b, eng.device)
    D, col = eng.round.shape.depth, eng.round.greedy_col
    left = capped = 0
    for _ in range(12):
        saved = _snapshot(st, b)
        eng.run_round(b, bs, int(st.seq_len[:b].max()) + 1, None)
        n, g = st.out[:b, -1].tolist(), st.out[:b, col].tolist()
        tree_state = _snapshot(st, b)
        _restore(st, b, saved)
        eng.run_round(b, bs, int(st.seq_len[:b].max()) + 1, chain_key(D))
        chain_n = st.out[:b, -1].tolist()
        for r in range(b):
            assert g[r] <= n[r]
            if g[r] < n[r]:
                assert chain_n[r] == g[r], (r, n[r], g[r], chain_n[r])
                left += 1
            else:
                assert chain_n[r] >= g[r]
                capped += g[r] > 0
        _restore(st, b, tree_state)  # go on from the tree round
    assert left > 0 and capped > 0  # both cases were seen


def _planted(eng, ms: dict):
    # The step curve's ms per kind at every bucket: AR 2, the tree and the chains as given.
    curve = eng.policy.auto_off.curve
    for b in (1, 2, 4, 8):
        curve.add("ar", b, 2.0)
        for key, v in ms.items():
            curve.add("spec" if key is None else key, b, v)


def test_the_policy_picks_the_most_tokens_per_ms_and_probes_the_tree():
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(2), **TREE, auto_off=True, chain_depths=(2,))
    eng.policy.auto_off.curve = StepCurve()
    _planted(eng, {None: 4.0, "chain2": 2.0})
    p, rows = eng.policy, [0, 1]
    for r in rows:  # tree: 3 tokens a round in 4 ms; chain of 2: 2.5 tokens in 2 ms
        p.acc.observe(r, 3, 4)
        p.acc.observe(r, 3, 4)
        p.chains.update(r, 2, 2.5)
    assert p.choose(rows, 2) == "chain2"
    for _ in range(p.probe_every - 1):
        assert p.choose(rows, 2) == "chain2"
    assert p.choose(rows, 2) is None  # the tree's probe after probe_every chain rounds in a row
    assert p.chain_choices == {"chain": p.probe_every, "probe": 1}
    assert p.chain_rounds == {2: p.probe_every}
    _planted(eng, {None: 4.0, "chain2": 4.0})  # now the chain costs as much as the tree: the tree runs
    assert p.choose(rows, 2) is None and p.chain_choices["tree"] == 1
    p.forget(0)
    p.forget(1)  # new rows: no estimates yet, so the tree runs (and measures them)
    assert p.choose(rows, 2) is None and p.chain_choices["unmeasured"] == 1


def test_a_chains_fast_dip_does_not_switch_off_while_the_trees_slow_estimate_wins():
    """Automatic off with a chain chosen: the chain's fast estimate alone would lose to AR, but switching off
    also needs the tree's slow estimate (``Acceptance.off_tau``) to lose. Without the tree as an alternative
    this round would be AR."""
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(2), **TREE, auto_off=True, chain_depths=(2,))
    eng.policy.auto_off.curve = StepCurve()
    _planted(eng, {None: 4.0, "chain2": 2.0})  # AR 2 ms: the tree needs > 2 tokens, the chain > 1
    p, rows = eng.policy, [0, 1]
    for r in rows:
        for _ in range(20):
            p.acc.observe(r, 4, 4)  # long at 4 tokens a tree round
        p.acc.observe(r, 1, 4)  # then one bad round: the fast EMA drops, the slow one hardly
        p.chains.update(r, 2, 0.85)  # the chain's fast estimate: 0.85 tokens, a loss against AR past the margin
    assert p.acc.off_tau(0) > 2.0
    # The chain still wins tokens per ms against the tree's fast depth estimate (none: acc.tokens decides).
    for r in rows:
        p.acc.tokens[r] = 1.5
    assert p.choose(rows, 2) == "chain2" and p.decisions == {"spec": 1}
    for r in rows:  # the slow estimate loses too: now the batch switches off
        p.acc.slow[r] = 1.5
    assert p.choose(rows, 2) == "ar"


@pytest.mark.parametrize("chain_ms", [0.5, 50.0])
def test_greedy_with_chain_kinds_equals_ar(chain_ms):
    target = tiny_model("tiny-llama")
    draft = target.truncated(2)
    ps = prompts([5, 17, 9, 3, 12, 30], target.cfg.vocab_size, seed=4)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    ar = [r.token_ids for r in _engine(target, None).generate(ps, params)]
    curve = tuple((b, 1.0, 1.1) for b in (1, 2, 4, 8))  # speculation pays over AR here
    eng = _engine(target, draft, **TREE, auto_off=True, auto_off_curve=curve, chain_depths=(3,), shared_budget=16)
    for key in set(eng.kinds) - {"ar"}:  # every kind at every bucket, as warm-up measures them on CUDA
        for b in (1, 2, 4, 8):
            eng.policy.auto_off.curve.add(key, b, chain_ms if chain_depth(key) else 1.1)
    assert [r.token_ids for r in eng.generate(ps, params)] == ar
    p = eng.policy
    if chain_ms < 1:  # cheap chains: most rounds after the first estimates are chains, the tree probes
        assert p.chain_rounds.get(3, 0) > p.chain_choices.get("tree", 0) and p.chain_choices.get("probe", 0) > 0
        m = Metrics()
        m.round(eng.batch)
        assert f'specpilot_chain_kind_rounds_total{{depth="3"}} {p.chain_rounds[3]}' in m.render()
        assert f'specpilot_chain_kind_choices_total{{how="probe"}} {p.chain_choices["probe"]}' in m.render()
    else:  # dear chains: never
        assert not p.chain_rounds and p.chain_choices.get("tree", 0) > 0
    assert eng.batch.round_tokens > eng.batch.rounds


@pytest.mark.gpu
def test_captured_chain_kinds_with_every_mechanism_equal_ar_gpu():
    # Chain kinds captured beside the tree kinds, timed in the step curve, carrying prompts where the policy
    # picks them: greedy output still equals AR.
    from test_prompt_admission import _serve

    target, draft, ps, kw, alone = captured_case()
    mech = dict(TREE, shared_budget=12, auto_off=True, adaptive_depths=(2,), chain_depths=(2, 3), prompt_admission=64)
    eng = Engine(target, WordTokenizer(), EngineOptions(**kw, compile=False, **mech), draft)
    eng.warmup()
    assert all(b in eng.kinds_captured["chain3"] for b in (1, 2, 4, 8))
    assert eng.policy.auto_off.curve.points.get("chain3")  # timed at warm-up
    assert any(key[0] == "chain3" for key in eng.carrying._graphs)  # and captured carrying prompts
    for b in (1, 2, 4, 8):  # planted: the chains are cheap, so the policy runs them
        eng.policy.auto_off.curve.add("chain3", b, 1e-3)
    got, _, _ = _serve(eng, [[ps[0]], [], [ps[1], ps[2]], [ps[3]], [], [ps[4], ps[5]]], 20, lookahead=True)
    assert got == alone
    assert eng.policy.chain_rounds.get(3, 0) > 0
