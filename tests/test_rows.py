"""Continuous batching (RowBatch): requests that join and leave between rounds get exactly the tokens they
would get alone, and every row comes back."""

import pytest
from helpers import WordTokenizer, engine, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.rows import RowBatch


def _engine(drafter: str, max_batch: int = 3):
    target = tiny_model("tiny-llama")
    if drafter == "ngram":
        opts = EngineOptions(max_seq_len=256, max_batch_size=max_batch, ngram_size=3, device="cpu", dtype="float32")
        return Engine(target, WordTokenizer(), opts)
    return engine(target, target.truncated(2) if drafter == "layers" else None, gamma=3, max_batch=max_batch)


@pytest.mark.parametrize("drafter", ["ar", "layers", "ngram"])
def test_joining_and_leaving_rows_equals_alone(drafter):
    eng = _engine(drafter)
    vocab = eng.target.cfg.vocab_size
    ps = prompts([5, 17, 3, 9, 12, 7], vocab, seed=11)
    lengths = [6, 20, 11, 3, 15, 9]
    alone = [
        eng.generate([p], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids
        for p, n in zip(ps, lengths, strict=True)
    ]
    batch = RowBatch(eng)
    reqs = {}
    for i, (p, n) in enumerate(zip(ps, lengths, strict=True)):
        reqs[i] = eng.new_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
    pending = list(reqs.items())
    got, peak = {}, 0
    while pending or batch.active:
        take = [pending.pop(0) for _ in range(min(len(pending), len(batch.free_rows)))]
        batch.admit([r for _, r in take])
        batch.step()
        peak = max(peak, batch.active)
        got.update({k: r.ids for k, r in reqs.items() if r.finished and k not in got})
    assert [got[i] for i in range(len(ps))] == alone
    assert peak == 3 and batch.free_rows == [0, 1, 2]
    assert batch.rounds > 0 and 1.0 <= batch.round_tokens / batch.rounds <= eng.shape.max_emitted


def test_released_row_is_reused_cleanly():
    eng = _engine("layers", max_batch=2)
    vocab = eng.target.cfg.vocab_size
    a, b, c = prompts([8, 4, 13], vocab, seed=2)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone_c = eng.generate([c], params)[0].token_ids
    batch = RowBatch(eng)
    ra, rb = eng.new_request(a, params), eng.new_request(b, params)
    batch.admit([ra, rb])
    batch.step()
    assert batch.release(ra.index) is ra and batch.free_rows == [0]  # a client went away mid-generation
    rc = eng.new_request(c, params)
    batch.admit([rc])
    assert rc.index == 0
    while batch.active:
        batch.step()
    assert rc.ids == alone_c and rb.finished and len(rb.ids) == 12
    assert batch.free_rows == [0, 1]


def test_seeded_sampling_alone_matches_generate():
    eng = _engine("layers")
    (p,) = prompts([6], eng.target.cfg.vocab_size, seed=4)
    params = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    ref = eng.generate([p], params)[0].token_ids
    batch = RowBatch(eng)
    req = eng.new_request(p, params)
    batch.admit([req])
    while batch.active:
        batch.step()
    assert req.ids == ref


def test_admit_refuses_more_than_free_rows():
    eng = _engine("ar", max_batch=1)
    batch = RowBatch(eng)
    ps = prompts([3, 3], eng.target.cfg.vocab_size)
    with pytest.raises(ValueError, match="free rows"):
        batch.admit([eng.new_request(p, SamplingParams(max_new_tokens=2)) for p in ps])
