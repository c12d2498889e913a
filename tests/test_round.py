"""The one round loop: shapes, reservation, recompiles, and captured rounds against eager ones."""

import functools

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.round import RoundShape

SHAPES = {
    "ar": {},
    "chain": {"num_speculative_tokens": 4},
    "tree": {"tree_budget": 12, "tree_depth": 4, "tree_top_k": 3},
}


def _engine(target, draft, kind, device="cpu", **kw):
    opts = EngineOptions(
        device=device,
        dtype=kw.pop("dtype", "float32"),
        max_seq_len=kw.pop("max_seq_len", 256),
        max_batch_size=kw.pop("max_batch_size", 8),
        graph_batch_sizes=(1, 2, 4, 8),
        **SHAPES[kind],
        **kw,
    )
    return Engine(target, WordTokenizer(), opts, draft if kind != "ar" else None)


def test_round_shapes():
    assert RoundShape(0, 0, 1).reach == 1 and RoundShape(0, 0, 1).max_emitted == 1
    chain = RoundShape(4, 4, 1)
    assert chain.chain and chain.expansions == 4 and chain.reach == 5
    tree = RoundShape(32, 6, 8)
    assert not tree.chain and tree.expansions == 41 and tree.reach == 42 and tree.max_emitted == 7


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_reservation_is_one_rule(kind):
    # The engine refuses exactly what its max_new_tokens_for allows one past; the server sizes default
    # max_tokens with the same method (server/prompts.py), so tree options never refuse a chat request.
    target = tiny_model()
    eng = _engine(target, target.truncated(1), kind)
    n_prompt = 20
    left = eng.max_new_tokens_for(n_prompt)
    assert left == eng.options.max_seq_len - n_prompt - eng.shape.reach
    eng.new_request(list(range(1, n_prompt + 1)), SamplingParams(max_new_tokens=left))
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.new_request(list(range(1, n_prompt + 1)), SamplingParams(max_new_tokens=left + 1))


def test_generate_runs_the_engine_loop_and_frees_rows():
    target = tiny_model()
    eng = _engine(target, target.truncated(1), "tree")
    ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=3)
    out = eng.generate(ps, SamplingParams(max_new_tokens=7, ignore_eos=True))
    assert [len(r.token_ids) for r in out] == [7, 7, 7]
    assert not eng.batch.busy and eng.batch.free_rows == list(range(8))
    # An abandoned stream frees its rows too.
    it = eng.stream(ps, SamplingParams(max_new_tokens=20, ignore_eos=True))
    next(it)
    it.close()
    assert eng.batch.active == 0


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_no_recompiles_across_prompt_lengths(kind, monkeypatch):
    # Compiled blocks must see fixed shapes after the first rounds: new prompt lengths, batch
    # compositions and sampling parameters change no shape. dynamo's "eager" backend keeps the test
    # fast (it traces and guards like inductor, without generating code).
    import torch._dynamo.utils as dutils

    real = torch.compile
    monkeypatch.setattr(torch, "compile", functools.partial(real, backend="eager"))
    torch._dynamo.reset()
    target = tiny_model()
    eng = _engine(target, target.truncated(1), kind, compile=True, max_batch_size=4)
    assert eng.target_runner._layer_fn is not None
    V = target.cfg.vocab_size
    greedy = SamplingParams(max_new_tokens=6, ignore_eos=True)
    for n in (1, 2, 4):  # every bucket of the ladder once (what Engine.warmup captures on CUDA)
        eng.generate(prompts([7] * n, V, seed=0), greedy)
    before = dict(dutils.counters["stats"])
    lengths = [3, 11, 17, 25, 33, 41, 58, 64, 77, 90]
    for i, n in enumerate(lengths):
        eng.generate(prompts([n], V, seed=i), greedy)
    mixed = [greedy, SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=1), greedy]
    eng.generate(prompts([13, 29, 6], V, seed=5), mixed)
    after = dict(dutils.counters["stats"])
    assert after.get("unique_graphs", 0) == before.get("unique_graphs", 0), (before, after)


# ---- GPU: captured rounds ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_captured_round_equals_eager_round_bitwise(kind):
    # The same Round.run, once replayed from a CUDA graph and once launched eagerly (same compiled
    # blocks, same kernels): every token and every row length equal, bit for bit.
    target = tiny_model("tiny-llama", dtype=torch.bfloat16).cuda()
    draft = target.truncated(2)
    ps = prompts([5, 17, 9], target.cfg.vocab_size, seed=1)
    p = SamplingParams(max_new_tokens=40, ignore_eos=True)
    captured = _engine(target, draft, kind, device="cuda", dtype="bfloat16", compile=True)
    eager = _engine(target, draft, kind, device="cuda", dtype="bfloat16", compile=True, cuda_graphs=False)
    assert captured.captured is not None and eager.captured is None
    captured.warmup()
    for batch in ([ps[0]], ps):
        a = captured.generate(batch, p)
        b = eager.generate(batch, p)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.rounds for r in a] == [r.rounds for r in b]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_captured_spec_equals_ar_fp32(kind):
    target = tiny_model("tiny-llama").cuda()
    ps = prompts([5, 17, 9, 30, 3, 12, 8, 21], target.cfg.vocab_size, seed=2)
    p = SamplingParams(max_new_tokens=32, ignore_eos=True)
    ar = _engine(target, None, "ar", device="cuda")
    spec = _engine(target, target.truncated(2), kind, device="cuda")
    spec.warmup()
    for batch in (ps[:1], ps[:3], ps):
        assert [r.token_ids for r in spec.generate(batch, p)] == [r.token_ids for r in ar.generate(batch, p)]


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_server_sizes_requests_with_the_engine_rule(kind):
    # A chat request without max_tokens gets the whole context left; with tree options the server used
    # to reserve gamma + 1 slots while the engine reserved the tree's reach, so every such request failed.
    from sglang_specpilot.server.prompts import build_request
    from sglang_specpilot.server.protocol import ChatCompletionRequest

    target = tiny_model()
    eng = _engine(target, target.truncated(1), kind, max_seq_len=96)
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    )
    prompt = list(range(1, 21))
    req = build_request(eng, body, prompt, None)
    assert req.params.max_new_tokens == eng.max_new_tokens_for(len(prompt)) > 0
    (res,) = eng.generate([prompt], req.params)  # runs to the end of the context without a refusal
    assert len(res.token_ids) == req.params.max_new_tokens or res.finish_reason == "stop"


@pytest.mark.parametrize("sizes", [[9], [5, 17, 3], [4, 11, 7, 2, 15, 6, 9, 13]])
def test_colocated_strategy_of_the_loop_equals_ar(sizes):
    # Co-located rounds are a strategy of the same loop: generate (and so the server) runs them through
    # RowBatch.step; each step emits only the verified half's tokens, and the output is AR's.
    target = tiny_model()
    draft = target.truncated(1)
    ps = prompts(sizes, target.cfg.vocab_size, seed=7)
    p = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ar = _engine(target, None, "ar")
    colo = _engine(target, draft, "chain", colocate=True)
    assert colo.colocated is not None
    want = [r.token_ids for r in ar.generate(ps, p)]
    got = colo.generate(ps, p)
    assert [r.token_ids for r in got] == want
    assert all(r.mean_accepted >= 1.0 for r in got)
    # Sampled requests fall back to the conventional round of the same engine.
    sampled = colo.generate(ps[:1], SamplingParams(max_new_tokens=5, temperature=0.8, seed=3))
    assert len(sampled[0].token_ids) == 5


def test_colocate_options_are_checked():
    with pytest.raises(ValueError, match="tree"):
        EngineOptions(colocate=True, tree_budget=8, tree_depth=4, tree_top_k=2, device="cpu")
    target = tiny_model()
    with pytest.raises(ValueError, match="draft model"):
        _engine(target, None, "chain", colocate=True, ngram_size=3)


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_lookahead_bookkeeping_equals_synchronous(kind):
    # The lookahead (on by default on CUDA) launches round t + 1 before reading round t: rows that finish
    # in round t run once more, rows released or re-admitted meanwhile must emit nothing stale. The CPU
    # runs the same bookkeeping when asked, so it is checked here against the synchronous loop, with rows
    # finishing at different rounds and requests joining while a round is in flight.
    target = tiny_model()
    draft = target.truncated(1)
    V = target.cfg.vocab_size
    ps = prompts([5, 17, 3, 9, 12, 7], V, seed=21)
    lengths = [6, 20, 11, 3, 15, 9]
    sync = _engine(target, draft, kind, max_batch_size=4)
    want = [
        sync.generate([p], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids
        for p, n in zip(ps, lengths, strict=True)
    ]
    eng = _engine(target, draft, kind, max_batch_size=4)
    batch = eng.batch
    batch.lookahead = True
    got = eng.generate(ps[:3], [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths[:3]])
    assert [r.token_ids for r in got] == want[:3]
    reqs = [
        eng.new_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(ps, lengths, strict=True)
    ]
    pending = list(reqs)
    while pending or batch.busy:
        take = [pending.pop(0) for _ in range(min(len(pending), len(batch.free_rows), 2))]
        batch.admit(take)  # admitted while the previous round's tokens are still in flight
        batch.step()
    assert [r.ids for r in reqs] == want
    assert batch.free_rows == [0, 1, 2, 3]
