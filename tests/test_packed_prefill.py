"""Packed prefill (``engine/packed_prefill.py``): a prompt admitted beside running rows is prefilled alone,
with the same logits, K/V and drafter state as the padded batch prefill, and requests served that way get
exactly the tokens they get alone."""

import pytest
import torch
from helpers import WordTokenizer, cuda_tiny_engine, prompts, serve_one_at_a_time, tiny_drafter, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine import packed_prefill as pp


def _engine(kind, max_batch=4, **kw):
    target = tiny_model("tiny-llama", **({"vocab_size": 12} if kind == "eagle3" else {}))
    shape = {} if kind == "none" else {"tree_budget": 6, "tree_depth": 3, "tree_top_k": 2}
    opts = EngineOptions(max_seq_len=256, max_batch_size=max_batch, device="cpu", dtype="float32", **shape, **kw)
    return Engine(target, WordTokenizer(), opts, tiny_drafter(kind, target))


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = pp.packed_prefill

    def packed(engine, lens, slot0=0):
        calls.append(list(lens))
        return real(engine, lens, slot0)

    monkeypatch.setattr("sglang_specpilot.engine.engine.packed_prefill", packed)
    return calls


@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_staggered_admissions_pack_and_equal_each_request_alone(kind, spy):
    eng = _engine(kind)
    ps = prompts([9, 30, 4, 17, 22, 6], eng.target.cfg.vocab_size, seed=5)
    n_new = [14, 6, 11, 9, 16, 8]
    alone = [
        eng.generate([p], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids
        for p, n in zip(ps, n_new, strict=True)
    ]
    assert not spy  # generate admits every row at once: the padded prefill
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in n_new]
    assert serve_one_at_a_time(eng, ps, params) == alone
    assert spy and all(sum(n > 0 for n in lens) == 1 for lens in spy)


def _cache_rows(eng, rows, upto):
    out = []
    for runner in (eng.target_runner, eng.draft_runner):
        if runner is not None:
            out += [t[rows, :upto].clone() for layer in runner.kv.layers for t in layer]
    return out


@pytest.mark.parametrize("kind", ["layer", "eagle3"])
def test_between_sees_the_targets_logits_before_the_drafters_half(kind, monkeypatch):
    """``between`` gets the final logits of the new rows, and runs before the drafter writes anything."""
    eng = _engine(kind, max_batch=4)
    V = eng.target.cfg.vocab_size
    for i, p in enumerate(prompts([11, 6], V, seed=3)):
        eng.state.history[2 * i + 1, : len(p)] = torch.tensor(p)
    order, real = [], pp.draft_prefill
    monkeypatch.setattr(pp, "draft_prefill", lambda *a, **k: order.append("draft") or real(*a, **k))
    seen = []
    last = pp.packed_prefill(eng, [0, 11, 0, 6], between=lambda x: order.append("between") or seen.append(x.clone()))
    assert order == ["between", "draft"]
    torch.testing.assert_close(seen[0], last)


@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_packed_equals_padded_prefill(kind):
    """The same logits for the new rows, the same K/V in their slots (target and drafter), the same EAGLE-3
    state, and nothing written into the other rows."""
    eng = _engine(kind, max_batch=5)
    V = eng.target.cfg.vocab_size
    st = eng.state
    for i, p in enumerate(prompts([7, 19, 12, 5, 9], V, seed=8)):
        st.history[i, : len(p)] = torch.tensor(p)
    lens = [0, 19, 0, 5, 0]
    new = [1, 3]
    eng.prefill_rows(st.history[:5], [7, 0, 12, 0, 9])  # the running rows' own K/V
    before = _cache_rows(eng, [0, 2, 4], 64)
    packed = pp.packed_prefill(eng, lens)
    got = _cache_rows(eng, new, 19)
    feats = (st.feats[new].clone(), st.n_prev[new].clone()) if eng.feature_layers else None
    for a, b in zip(before, _cache_rows(eng, [0, 2, 4], 64), strict=True):
        assert torch.equal(a, b)
    pp.PACKED, saved = False, pp.PACKED
    try:
        padded = eng.prefill_rows(st.history[:5], lens)
    finally:
        pp.PACKED = saved
    for a, b in zip(got, _cache_rows(eng, new, 19), strict=True):
        # Only the real prompt slots: the pads past a prompt hold different junk (nothing reads them).
        torch.testing.assert_close(a[0, :19], b[0, :19], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a[1, :5], b[1, :5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[new], padded[new], rtol=1e-5, atol=1e-5)
    if feats is not None:
        torch.testing.assert_close(feats[0], st.feats[new], rtol=1e-5, atol=1e-5)
        assert torch.equal(feats[1], st.n_prev[new])


def test_when_it_packs(monkeypatch):
    eng = _engine("layer", max_batch=8)
    chunk = eng.options.prefill_chunk
    assert pp.worth_packing(eng, [0, 5, 0, 0])  # one new of four
    assert pp.worth_packing(eng, [3, 5, 0, 0])  # half
    assert not pp.worth_packing(eng, [3, 5, 2, 0])  # padding would not double the rows
    assert not pp.worth_packing(eng, [4, 6])  # every row new (generate, a wave)
    assert not pp.worth_packing(eng, [0, 0])
    assert not pp.worth_packing(eng, [0, chunk + 1, 0, 0])  # more than one chunk
    monkeypatch.setattr(eng.target_runner, "use_graphs", True)  # as on CUDA: up to 4 rows replay a graph
    assert not pp.worth_packing(eng, [0, 5, 0, 0])
    assert pp.worth_packing(eng, [0, 5, 0, 0, 0])
    monkeypatch.setattr(pp, "PACKED", False)
    assert not pp.worth_packing(eng, [0, 5, 0, 0, 0])


def test_cost_probe_writes_scratch_only():
    eng = _engine("eagle3", max_batch=4)
    st = eng.state
    p = prompts([11], eng.target.cfg.vocab_size, seed=1)[0]
    st.history[0, :11] = torch.tensor(p)
    eng.prefill_rows(st.history[:1], [11])
    S = eng.options.max_seq_len
    before = _cache_rows(eng, [0, 1, 2, 3], S) + [st.feats.clone(), st.n_prev.clone()]
    pp.packed_prefill(eng, [64, 0, 0, 0], slot0=S)
    after = _cache_rows(eng, [0, 1, 2, 3], S) + [st.feats.clone(), st.n_prev.clone()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_unused_slots_and_a_wider_batch_change_nothing(kind):
    """The captured form's inputs (``PackedRows`` with unused slots, the batch padded to its bucket, the
    width rounded up) give the new row the eager form's logits, K/V and EAGLE-3 state, and write nothing a
    running row or a free row reads: unused slots prefill row 0's scratch slots and keep nothing."""
    eng = _engine(kind, max_batch=8)
    V, st, S = eng.target.cfg.vocab_size, eng.state, eng.options.max_seq_len
    ps = prompts([7, 70, 12, 5], V, seed=3)
    for i, p in enumerate(ps):
        st.history[i, : len(p)] = torch.tensor(p)
    eng.prefill_rows(st.history[:3], [7, 0, 12])  # running rows 0 and 2
    eager = pp.packed_prefill(eng, [0, 70, 0])
    new_kv = _cache_rows(eng, [1], 70)
    state = (st.feats[1].clone(), st.n_prev[1].clone()) if eng.feature_layers else None
    keep = [0, 2, 3, 4, 5, 6, 7]
    before = _cache_rows(eng, keep, S) + ([st.feats[keep].clone(), st.n_prev[keep].clone()] if state else [])
    dev = eng.device
    ins = pp.PackedRows.unused(4, S, dev)
    ins.fill([1], [70], 0, S)
    assert ins.rows.tolist() == [1, 0, 0, 0] and ins.base.tolist() == [0, S, S, S]
    W = pp.graph_width(70, eng.options.prefill_chunk)
    assert W == 128
    with torch.inference_mode():
        wide = pp._core(eng, 8, ins, W)
    after = _cache_rows(eng, keep, S) + ([st.feats[keep].clone(), st.n_prev[keep].clone()] if state else [])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    torch.testing.assert_close(wide[1], eager[1], rtol=1e-5, atol=1e-5)
    assert not wide[[0, 2, 3, 4, 5, 6, 7]].any()
    for a, b in zip(new_kv, _cache_rows(eng, [1], 70), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if state:
        torch.testing.assert_close(state[0], st.feats[1], rtol=1e-5, atol=1e-5)
        assert torch.equal(state[1], st.n_prev[1])


def test_graph_keys():
    eng = _engine("layer", max_batch=16, graph_batch_sizes=(4, 8, 16))
    g = pp.PackedGraphs(eng)  # keys need no GPU; capture does
    chunk = eng.options.prefill_chunk
    assert eng.target_runner.ladder == (4, 8, 16)
    assert g.key(5, 1, 70) == (8, 1, 128)
    assert g.key(12, 3, 64) == (16, 4, 64)
    assert g.key(16, 2, chunk) == (16, 2, chunk)
    assert g.key(16, 9, 64) is None  # more new rows than a slot bucket holds: eager
    assert g.keys_at(4) == []  # the padded prefill replays its own graphs there
    widths = sorted({pp.graph_width(n, chunk) for n in range(1, chunk + 1)})
    assert widths[0] == 64 and widths[-1] == chunk
    assert all(b == 2 * a for a, b in zip(widths[:-2], widths[1:-1], strict=True))
    assert g.keys_at(8) == [(8, s, w) for s in (1, 2, 4) for w in widths]
    assert {k[1] for k in g.keys_at(16)} == {1, 2, 4, 8}
    # A captured key packs where the padded prefill's own graphs would otherwise run; others as before.
    eng.packed_graphs = g
    eng.target_runner.use_graphs = True
    g._graphs[(8, 1, 64)] = None
    assert pp.worth_packing(eng, [0, 5, 0, 0, 0])
    assert not pp.worth_packing(eng, [0, 5, 0, 0])  # bucket 4: the padded graph
    assert not pp.worth_packing(eng, [0, 5, 3, 0, 0, 6, 7, 8])  # five new of eight: padding would not double


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_captured_packed_prefill_equals_each_request_alone_gpu(kind, monkeypatch):
    """On CUDA, prompts admitted one at a time beside running rows replay the packed prefill's graphs
    (captured at warm-up for buckets above PREFILL_GRAPH_MAX_BATCH) and get the tokens they get alone."""
    eng = cuda_tiny_engine(kind, max_seq_len=256)
    assert eng.packed_graphs is not None and not eng.packed_graphs.refused
    assert (8, 1, 64) in eng.packed_graphs
    replays = []
    real = pp.PackedGraphs.replay_target
    monkeypatch.setattr(pp.PackedGraphs, "replay_target", lambda self, *a: (replays.append(a[0]), real(self, *a))[1])
    ps = prompts([9, 30, 4, 17, 22, 6, 70, 12], eng.target.cfg.vocab_size, seed=5)
    n_new = [14, 6, 11, 9, 16, 8, 12, 10]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in n_new]
    alone = [eng.generate([p], sp)[0].token_ids for p, sp in zip(ps, params, strict=True)]
    assert serve_one_at_a_time(eng, ps, params) == alone
    assert replays  # at least one admission replayed a packed graph


def test_warm_up_skips_prefill_counts_past_the_batch():
    """Warm-up's prefill shapes stop at the cache's rows: a count past ``max_batch_size`` (the batched suite
    asks for 1 and 2 prompts whatever its concurrency) is no shape the engine meets, and ran off the cache
    (an index error here, a device assert on the GPU at --concurrency 1)."""
    eng = Engine(
        tiny_model("tiny-llama"),
        WordTokenizer(),
        EngineOptions(max_seq_len=64, max_batch_size=1, device="cpu", dtype="float32"),
    )
    seen = []
    real = eng._prefill_probe
    eng._prefill_probe = lambda b, w, runners=None: (seen.append(b), real(b, w, runners))
    eng._warm_prefill((1,), (1, 2))
    assert seen and set(seen) == {1}


def test_a_wave_of_mixed_lengths_packs_by_width_tier(monkeypatch):
    """A wave whose padded prefill would run at least twice the slots of its width tiers packs them in one
    pass (``worth_tiering``), one tier per power-of-two width; a wave of like lengths, a lone prompt, or a
    small batch that replays its padded graph on CUDA does not."""
    eng = _engine("layer", max_batch=8)
    chunk = eng.options.prefill_chunk
    assert pp.width_tiers([0, 70, 5, 200, 64, 0], chunk) == [[2, 4], [1], [3]]
    assert pp.worth_tiering(eng, [200, 5, 6, 7])  # 4 x 200 slots padded, 3 x 16 + 200 tiered
    assert not pp.worth_tiering(eng, [30, 40, 50])  # one tier: padding is already small
    assert not pp.worth_tiering(eng, [200, 0, 0, 0])  # one new row (worth_packing's case)
    assert not pp.worth_tiering(eng, [chunk + 1, 5])  # more than one chunk
    monkeypatch.setattr(eng.target_runner, "use_graphs", True)  # as on CUDA: up to 4 rows replay a graph
    assert not pp.worth_tiering(eng, [200, 5, 6, 7])
    assert pp.worth_tiering(eng, [200, 5, 6, 7, 8])


@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_tiered_wave_equals_padded_prefill_and_generation(kind, spy):
    """A mixed-length wave packed by width tier gives the padded prefill's logits, K/V and EAGLE-3 state, and
    ``generate`` over the wave equals each request alone."""
    eng = _engine(kind, max_batch=6)
    V, st = eng.target.cfg.vocab_size, eng.state
    lens = [5, 200, 9, 7, 3, 66]
    ps = prompts(lens, V, seed=4)
    for i, p in enumerate(ps):
        st.history[i, : len(p)] = torch.tensor(p)
    assert pp.worth_tiering(eng, lens)
    tiered = eng.prefill_rows(st.history[:6], lens)
    assert spy == [lens]
    got = [_cache_rows(eng, [i], n) for i, n in enumerate(lens)]
    feats = (st.feats[:6].clone(), st.n_prev[:6].clone()) if eng.feature_layers else None
    pp.PACKED, saved = False, pp.PACKED
    try:
        padded = eng.prefill_rows(st.history[:6], lens)
    finally:
        pp.PACKED = saved
    torch.testing.assert_close(tiered, padded, rtol=1e-5, atol=1e-5)
    for i, n in enumerate(lens):
        for a, b in zip(got[i], _cache_rows(eng, [i], n), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if feats is not None:
        torch.testing.assert_close(feats[0], st.feats[:6], rtol=1e-5, atol=1e-5)
        assert torch.equal(feats[1], st.n_prev[:6])
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone = [eng.generate([p], params)[0].token_ids for p in ps]
    assert [r.token_ids for r in eng.generate(ps, params)] == alone
