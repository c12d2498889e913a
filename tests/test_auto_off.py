"""Automatic off (issue 18): the batch speculates only where S = tau / c > 1, else runs an exact AR round
that keeps the drafter current; greedy output equals AR and each request alone either way."""

import pytest
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.acceptance import Acceptance
from sglang_specpilot.engine.auto_off import AR, PROBE, SPEC, UNMEASURED, AutoOff
from sglang_specpilot.engine.step_curve import StepCurve

# A planted step curve (ms): a speculative round costs 2.5 AR steps at every batch, so speculation wins
# only where a row emits more than 2.5 tokens a round.
CURVE = ((1, 1.0, 2.5), (8, 2.0, 5.0))
SHAPES = {"chain": {"num_speculative_tokens": 4}, "tree": {"tree_budget": 8, "tree_depth": 4, "tree_top_k": 2}}


def _engine(target, draft, shape="chain", **kw):
    opts = EngineOptions(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", **SHAPES[shape], **kw)
    return Engine(target, WordTokenizer(), opts, draft)


def _ids(eng, ps, n=24):
    return [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=n, ignore_eos=True))]


def test_curve_interpolates_and_holds_flat_past_the_ends():
    c = StepCurve.from_triples(((1, 1.0, 2.0), (4, 4.0, 5.0)))
    assert c.ms("ar", 2) == pytest.approx(2.0) and c.ms("spec", 2) == pytest.approx(3.0)
    assert c.ms("ar", 64) == 4.0 and c.ms(8, 1) == 2.0  # any speculative kind reads the spec points


def test_decision_rule_and_probes():
    off = AutoOff(StepCurve.from_triples(CURVE), probe_every=4)
    assert off.decide([3.0, 2.8], 2) == SPEC  # S = 2.9 / 2.5 > 1
    # AR must win by the switch margin (15% at one row, 15% / sqrt(2) at two): S = 0.9 keeps speculating.
    assert off.decide([2.25], 1) == SPEC and off.decide([2.0, 2.1], 2) == AR  # S = 0.9; 0.82 < 0.894
    assert off.decide([2.25], 1) == SPEC and off.decide([2.1], 1) == AR  # S = 0.84 < 0.85
    # Off since the round above: probes at off rounds 4, 12, 28, then every 32 (8 x probe_every).
    got = [off.decide([1.0], 1) for _ in range(2, 93)]
    assert [i + 2 for i, d in enumerate(got) if d == PROBE] == [4, 12, 28, 60, 92]
    assert off.decide([3.0], 1) == SPEC  # speculation wins again: the gaps start over
    assert [off.decide([1.0], 1) for _ in range(4)] == [AR, AR, AR, PROBE]
    fixed = AutoOff(StepCurve.from_triples(CURVE), probe_every=4, max_backoff=1)  # no doubling
    assert [fixed.decide([1.0], 1) for _ in range(8)] == [AR, AR, AR, PROBE] * 2
    # Rows not measured yet: the measured ones decide while they are at least half (a new row in a wide batch
    # no longer blocks the decision), else speculate to measure them.
    assert off.decide([1.0, None, None], 1) == UNMEASURED
    assert off.decide([3.0, None], 1) == SPEC and off.decide([1.0, 1.0, None], 1) == AR
    assert AutoOff(None, 4).decide([1.0], 1) == UNMEASURED  # no curve: today's behaviour


def test_one_bad_round_does_not_switch_off():
    """Off decides on the slow EMA (``acceptance.ALPHA_OFF``): one round that accepts nothing after many at
    3 tokens (S = 1.2) leaves speculation on, though the fast EMA alone would have switched off; a sustained
    low acceptance still switches it off."""
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), auto_off=True, auto_off_curve=CURVE)
    pol = eng.policy
    for _ in range(20):
        pol.observe(0, 3, None)
    pol.observe(0, 1, None)
    assert pol.acc.tokens[0] < 2.5 < pol.acc.slow[0]  # the fast EMA would have lost (2.4 tokens)
    assert pol.choose([0], 1) is None and pol.decisions == {SPEC: 1}
    for _ in range(6):
        pol.observe(0, 1, None)
    assert pol.choose([0], 1) == "ar"


def test_off_tau_switches_off_slowly_and_back_on_quickly():
    """Off needs the slow EMA to lose; back on needs only the fast one to win: after a long off stretch one
    probe that accepts everything turns speculation back on."""
    acc, off = Acceptance(1), AutoOff(StepCurve.from_triples(CURVE), probe_every=4)
    for _ in range(30):
        acc.observe(0, 1, 8)
    assert off.decide([acc.off_tau(0)], 1) == AR
    acc.observe(0, 9, 8)  # the probe: 8 accepted
    assert acc.slow[0] < 2.5 < acc.tokens[0] and acc.off_tau(0) == acc.tokens[0]
    assert off.decide([acc.off_tau(0)], 1) == SPEC
    acc.forget(0)
    assert acc.off_tau(0) is None and acc.slow[0] is None


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_low_acceptance_turns_speculation_off_and_output_is_exact(shape):
    target = tiny_model("tiny-llama")
    random_drafter = tiny_model("tiny-llama", seed=7, num_layers=1)  # unrelated weights: accepts ~nothing
    ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=1)
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(max_seq_len=256, device="cpu", dtype="float32")), ps)
    alone = [_ids(_engine(target, random_drafter, shape), [p])[0] for p in ps]
    eng = _engine(target, random_drafter, shape, auto_off=True, auto_off_curve=CURVE, auto_off_probe_every=8)
    assert _ids(eng, ps) == ar == alone
    d = eng.policy.decisions
    assert d.get(AR, 0) > 3 * d.get(SPEC, 0) and d.get(PROBE, 0) >= 1  # off, re-tested now and then


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_high_acceptance_keeps_speculation_on(shape):
    target = tiny_model("tiny-llama")
    ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=2)
    ref = _ids(_engine(target, target.truncated(target.num_layers), shape), ps)
    eng = _engine(target, target.truncated(target.num_layers), shape, auto_off=True, auto_off_curve=CURVE)
    assert _ids(eng, ps) == ref
    assert eng.policy.decisions.get(AR, 0) == 0 and eng.policy.decisions.get(SPEC, 0) > 0


def test_keepup_round_keeps_the_drafter_current():
    """After an off stretch the drafter drafts as well as if it had never been off: the target as its
    own drafter accepts every drafted token at each probe. Without the keep-up (a plain AR round) the
    drafter would attend to stale slots and the probes would accept less."""
    target = tiny_model("tiny-llama")
    (p,) = prompts([6], target.cfg.vocab_size, seed=3)
    # Planted so that even full acceptance (5 tokens a round) loses: every round is AR, except probes.
    eng = _engine(target, target.truncated(target.num_layers), auto_off=True, auto_off_curve=((1, 1.0, 9.0),))
    eng.policy.auto_off.probe_every = 3
    eng.policy.auto_off.max_backoff = 1  # a probe every third round: this test is about the keep-up
    eng.policy.auto_off._restart()
    seen, observe = [], eng.policy.observe
    eng.policy.observe = lambda row, k, kind, *out: (seen.append((k, kind)), observe(row, k, kind, *out))
    _ids(eng, [p], n=40)
    spec = [k for k, kind in seen if kind != "ar"]
    assert eng.policy.decisions.get(PROBE, 0) >= 3 and len(spec) >= 4
    assert spec[:-1] == [5] * (len(spec) - 1)  # the last may be cut by max_new_tokens
    assert sum(kind == "ar" for _, kind in seen) >= len(spec)  # two AR rounds per probe, less the first round


@pytest.mark.parametrize("drafter", ["eagle3", "ngram"])
def test_other_drafters_equal_ar(drafter):
    import torch

    from sglang_specpilot.drafters.eagle3 import init_eagle3

    V = 12
    target = tiny_model("tiny-llama", vocab_size=V)
    ps = prompts([5, 11, 3], V, seed=4)
    base = dict(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32")
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(**base)), ps)
    if drafter == "eagle3":
        torch.manual_seed(0)
        draft, extra = init_eagle3(target), {}
    else:
        draft, extra = None, {"ngram_size": 2}
    for curve in (CURVE, ((1, 1.0, 1.1),)):  # off most of the time, then on most of the time
        opts = EngineOptions(**base, **SHAPES["tree" if drafter == "eagle3" else "chain"], **extra,
                             auto_off=True, auto_off_curve=curve, auto_off_probe_every=3)  # fmt: skip
        eng = Engine(target, WordTokenizer(), opts, draft)
        assert _ids(eng, ps) == ar


def test_scheduler_serves_under_auto_off_and_reports_decisions():
    import threading

    from sglang_specpilot.server.scheduler import Scheduler

    target = tiny_model("tiny-llama")
    random_drafter = tiny_model("tiny-llama", seed=7, num_layers=1)
    eng = _engine(target, random_drafter, auto_off=True, auto_off_curve=CURVE)
    ps = prompts([4, 11, 6], target.cfg.vocab_size, seed=8)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone = [eng.generate([p], params)[0].token_ids for p in ps]
    sched = Scheduler(eng, idle_wait_s=0.05)
    got = {i: [] for i in range(len(ps))}
    done = [threading.Event() for _ in ps]

    def sink(i):
        return lambda ev: (got[i].extend(ev.token_ids), ev.finished and done[i].set())

    sched.start()
    try:
        for i, p in enumerate(ps):
            sched.submit(eng.new_request(p, params), sink(i))
        assert all(d.wait(60) for d in done)
    finally:
        sched.stop()
    assert [got[i] for i in range(len(ps))] == alone
    text = sched.metrics.render()
    assert 'specpilot_speculation_decisions_total{decision="ar"}' in text
    assert "specpilot_predicted_speculation_speedup" in text
    assert "speculation_decisions_total" not in Scheduler(_engine(target, random_drafter)).metrics.render()


def _eagle3_pair(V=12):
    import torch

    from sglang_specpilot.drafters.eagle3 import init_eagle3

    target = tiny_model("tiny-llama", vocab_size=V)
    torch.manual_seed(0)
    draft = init_eagle3(target)
    with torch.no_grad():  # off the warm start, so every weight the K/V depend on matters
        for n, p in draft.named_parameters():
            if not n.startswith("embed."):
                p.add_(torch.randn_like(p) * 0.2)
    return target, draft


def test_eagle3_write_kv_writes_what_the_forward_writes():
    import torch

    from sglang_specpilot.engine.attn_meta import causal_tree
    from sglang_specpilot.engine.runner import ModelRunner

    target, draft = _eagle3_pair()
    B, N = 2, 5
    toks = torch.randint(0, 12, (B, N), generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([[3, 4, 5, 6, 7], [10, 11, 12, 13, 14]])
    g = torch.randn(B, N, target.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    full, kv_only = (ModelRunner(draft, B, 64, cuda_graphs=False, scratch_slots=16) for _ in range(2))
    anc = causal_tree(N)[0]
    with torch.inference_mode():  # as the engine runs them
        full.forward(toks, slots, slots, slots[:, 0], anc, None, g=g)
        draft.write_kv(toks, slots, slots, kv_only.kv.layers, g=g)
    (k1, v1), (k2, v2) = full.kv.layers[0], kv_only.kv.layers[0]
    rows = torch.arange(B)[:, None]
    assert torch.allclose(k1[rows, slots], k2[rows, slots], atol=1e-6) and k2[rows, slots].abs().sum() > 0
    assert torch.allclose(v1[rows, slots], v2[rows, slots], atol=1e-6)


def test_eagle3_keepup_drafts_as_the_full_keepup_did(monkeypatch):
    # The AR rounds of automatic off write only the drafter's K/V now; the probes after them must draft
    # (and get accepted) exactly as with the whole drafter forward the keep-up used to run.
    import torch

    from sglang_specpilot.engine import draft_tree, keepup_round

    target, draft = _eagle3_pair()
    ps = prompts([5, 11, 3], 12, seed=4)

    def run():
        eng = _engine(target, draft, "tree", auto_off=True, auto_off_curve=((1, 1.0, 2.2),), auto_off_probe_every=2)
        seen, observe = [], eng.policy.observe
        eng.policy.observe = lambda row, k, kind, *out: (seen.append((row, k, kind)), observe(row, k, kind, *out))
        ids = _ids(eng, ps, n=40)
        return ids, seen, eng.policy.decisions, [t.clone() for t in eng.draft_runner.kv.layers[0]]

    ids, seen, decisions, cache = run()
    assert decisions.get(AR, 0) > 0 and decisions.get(PROBE, 0) > 0  # both kinds of round ran

    def full_keepup(runner, history, seq_len, next_tok, feats, n_prev):
        draft_tree._eagle_root(runner, history, seq_len, next_tok, feats, n_prev, None)

    monkeypatch.setattr(keepup_round, "eagle_root_kv", full_keepup)
    ids2, seen2, _, cache2 = run()
    assert (ids2, seen2) == (ids, seen)
    # The drafter's cache after the run: every slot the keep-up wrote holds the same K/V.
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(cache, cache2, strict=True))
