"""Per-row failures: a request the engine cannot run fails alone, with a clear error, and the requests
admitted with it finish with the tokens they get alone. Covers the request's own work at admission, a
shared prefill that fails only with one request, parameters that break mid-generation, output that cannot
be decoded, and target logits that turn NaN (a corrupt checkpoint), through ``Engine.generate`` /
``stream``, the step-level API and the server's scheduler."""

import threading
from dataclasses import replace

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, GenerationError, RequestFailed, SamplingParams
from sglang_specpilot.server.scheduler import Scheduler

GOOD = SamplingParams(max_new_tokens=8, ignore_eos=True)
NONFINITE = "non-finite logits"


KINDS = {  # the round each engine runs: AR, a chain, a best-first tree, co-located chain halves
    "ar": {},
    "chain": dict(num_speculative_tokens=3),
    "tree": dict(tree_budget=8, tree_depth=3, tree_top_k=2),
    "colocated": dict(num_speculative_tokens=3, colocate=True),
}


def _engine(kind: str, target=None, rows: int = 4):
    target = target if target is not None else tiny_model("tiny-llama")
    opts = EngineOptions(max_seq_len=256, max_batch_size=rows, device="cpu", dtype="float32", **KINDS[kind])
    return Engine(target, WordTokenizer(), opts, target.truncated(2) if kind != "ar" else None)


def _poisoned(**bad) -> SamplingParams:
    # Validation refuses these values (test_sampling_params_refuse_...); set them afterwards on purpose, as
    # code holding a SamplingParams may, to reach the engine's own failure inside admission.
    p = SamplingParams(max_new_tokens=8, temperature=0.7)
    for k, v in bad.items():
        setattr(p, k, v)
    return p


POISONS = {"seed-2^64": dict(seed=2**64), "top_k-2^63": dict(top_k=2**63)}


@pytest.mark.parametrize("kind", ["ar", "chain"])
@pytest.mark.parametrize("poison", list(POISONS))
def test_poisoned_request_fails_alone_in_generate_and_stream(kind, poison):
    eng = _engine(kind)
    ps = prompts([5, 9, 4, 7], eng.target.cfg.vocab_size, seed=3)
    alone = [eng.generate([p], GOOD)[0].token_ids for p in ps[1:]]
    params = [_poisoned(**POISONS[poison])] + [GOOD] * 3

    with pytest.raises(GenerationError, match="prompt 0: the engine could not admit") as e:
        eng.generate(ps, params)
    res = e.value.results
    assert res[0].finish_reason == "error" and "Overflow" in res[0].error and res[0].token_ids == []
    assert [r.token_ids for r in res[1:]] == alone and all(r.error is None for r in res[1:])
    assert eng.batch.free_rows == [0, 1, 2, 3]

    res = eng.generate(ps, params, raise_on_error=False)
    assert [r.finish_reason for r in res] == ["error", "length", "length", "length"]
    assert [r.token_ids for r in res[1:]] == alone

    events = list(eng.stream(ps, params))
    mine = [ev for ev in events if ev.index == 0]
    assert len(mine) == 1 and mine[0].finished and mine[0].finish_reason == "error"
    assert [[t for ev in events if ev.index == i for t in ev.token_ids] for i in (1, 2, 3)] == alone


def test_a_prefill_that_fails_only_with_one_request_fails_it_alone():
    # Something no check catches breaks the shared prefill whenever one prompt is in it: the prompts are
    # prefilled again in halves (in the rows they were given) down to that one, and only that one fails.
    eng = _engine("chain")
    ps = prompts([5, 9, 4, 7], eng.target.cfg.vocab_size, seed=3)
    alone = [eng.generate([p], GOOD)[0].token_ids for p in ps]
    real, calls = eng.prefill_rows, []

    def prefill_rows(history, lens):
        calls.append([b for b, n in enumerate(lens) if n])
        if lens[2]:
            raise RuntimeError("simulated kernel failure")
        return real(history, lens)

    eng.prefill_rows = prefill_rows
    res = eng.generate(ps, GOOD, raise_on_error=False)
    assert calls == [[0, 1, 2, 3], [0, 1], [2, 3], [2], [3]]
    assert res[2].finish_reason == "error" and "simulated kernel failure" in res[2].error
    assert [r.token_ids for i, r in enumerate(res) if i != 2] == [a for i, a in enumerate(alone) if i != 2]


def test_a_prefill_too_big_for_memory_is_split_in_halves_until_it_fits():
    # A wave that fails only when more than two prompts share a prefill (out of memory, say): halves of halves
    # until each fits, every request served, its tokens as alone.
    eng = _engine("chain", rows=8)
    ps = prompts([5, 9, 4, 7, 3, 8, 6, 2], eng.target.cfg.vocab_size, seed=5)
    alone = [eng.generate([p], GOOD)[0].token_ids for p in ps]
    real, calls = eng.prefill_rows, []

    def prefill_rows(history, lens):
        calls.append([b for b, n in enumerate(lens) if n])
        if len(calls[-1]) > 2:
            raise torch.cuda.OutOfMemoryError("simulated: the wave does not fit")
        return real(history, lens)

    eng.prefill_rows = prefill_rows
    res = eng.generate(ps, GOOD)
    assert calls == [list(range(8)), [0, 1, 2, 3], [0, 1], [2, 3], [4, 5, 6, 7], [4, 5], [6, 7]]
    assert [r.token_ids for r in res] == alone


@pytest.mark.parametrize("kind", ["ar", "chain"])
def test_parameters_broken_mid_generation_fail_that_request_alone(kind):
    # Step-level API: a running request's parameters become unusable; when the batch's sampling tensors are
    # rebuilt (a request joins), that request fails and the others, the newcomer included, go on.
    eng = _engine(kind)
    ps = prompts([5, 9, 4, 7], eng.target.cfg.vocab_size, seed=3)
    alone = [eng.generate([p], GOOD)[0].token_ids for p in ps]
    batch = eng.batch
    reqs = [eng.new_request(p, replace(GOOD) if i == 1 else GOOD) for i, p in enumerate(ps[:3])]  # its own params
    events = batch.admit(reqs)
    events += batch.step()
    reqs[1].params.top_k = 2**63
    late = eng.new_request(ps[3], GOOD)
    events += batch.admit([late])
    while batch.busy:
        events += batch.step()
    assert reqs[1].finish_reason == "error" and "sampling failed" in reqs[1].error
    assert [ev.finish_reason for ev in events if ev.index == 1][-1] == "error"
    assert [r.ids for r in (reqs[0], reqs[2], late)] == [alone[0], alone[2], alone[3]]
    assert batch.free_rows == [0, 1, 2, 3]


class _RefusingTokenizer(WordTokenizer):
    """Decoding raises for one token id (as a broken tokenizer file might)."""

    def __init__(self, bad: int):
        self.bad = bad

    def decode(self, ids):
        if self.bad in ids:
            raise KeyError(f"no text for token {self.bad}")
        return super().decode(ids)


def test_output_that_cannot_be_decoded_fails_that_request_alone():
    eng = _engine("ar")
    ps = prompts([5, 9, 4, 7], eng.target.cfg.vocab_size, seed=3)
    alone = [eng.generate([p], GOOD)[0].token_ids for p in ps]
    bad = alone[0][2]
    assert all(bad not in a for a in alone[1:])
    eng.tokenizer = _RefusingTokenizer(bad)
    res = eng.generate(ps, GOOD, raise_on_error=False)
    assert res[0].finish_reason == "error" and "could not be decoded" in res[0].error
    assert [r.token_ids for r in res[1:]] == alone[1:]


# ---- non-finite logits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_nan_in_the_lm_head_fails_every_request_and_never_succeeds(kind):
    # One NaN in the head makes every position's logits NaN at that entry; argmax would still pick a token
    # (the NaN's), so without the check the engine would report a "successful" generation.
    target = tiny_model("tiny-llama")
    with torch.no_grad():
        target.lm_head.weight[7, 3] = float("nan")
    eng = _engine(kind, target)
    ps = prompts([5, 9], target.cfg.vocab_size, seed=3)
    with pytest.raises(GenerationError, match=NONFINITE) as e:
        eng.generate(ps, GOOD)
    assert all(r.finish_reason == "error" and NONFINITE in r.error and r.token_ids == [] for r in e.value.results)
    assert eng.batch.free_rows == [0, 1, 2, 3]


def _nan_token_setup(kind):
    """A model whose embedding row of one token is NaN, and prompts where: request 0 reaches that token in
    its generation (its rounds turn NaN), request 1 has it in its prompt (its prefill turns NaN), requests
    2 and 3 never see it. Returns (engine, prompts, clean alone outputs, the token).

    Request 0's prompt is longer than one padded prefill chunk (64 tokens) and request 2's nearly one, so
    the NaN K/V request 0 leaves lies past what request 2's prefill rewrites in that row, and inside what
    its last rounds attend to (``test_a_row_that_held_nan_is_reused_cleanly``)."""
    target = tiny_model("tiny-llama")
    clean = _engine(kind, target)
    ps = prompts([66, 9, 60, 7], target.cfg.vocab_size, seed=3)
    alone = [clean.generate([p], GOOD)[0].token_ids for p in ps]
    t = alone[0][2]
    ps[1] = ps[1][:4] + [t] + ps[1][4:]
    assert t not in ps[0] + alone[0][:2] and all(t not in ps[i] + alone[i] for i in (2, 3))
    with torch.no_grad():
        target.embed.weight[t] = float("nan")
    return _engine(kind, target), ps, alone, t


@pytest.mark.parametrize("kind", list(KINDS))
def test_nan_logits_fail_only_their_rows(kind):
    eng, ps, alone, t = _nan_token_setup(kind)
    res = eng.generate(ps, GOOD, raise_on_error=False)
    assert res[0].finish_reason == "error" and NONFINITE in res[0].error
    # Request 0 stops where its logits went bad: what it emitted before is alone's (the NaN token itself,
    # emitted by finite logits, at most); nothing computed from NaN logits is emitted.
    assert res[0].token_ids == alone[0][: len(res[0].token_ids)] and len(res[0].token_ids) <= 3
    assert res[1].finish_reason == "error" and NONFINITE in res[1].error and res[1].token_ids == []
    assert [r.token_ids for r in res[2:]] == alone[2:] and all(r.error is None for r in res[2:])
    # Request 0 failed in a round (the flag of the round's readback), request 1 in its prefill.
    assert eng.batch.rounds > 0 and eng.batch.free_rows == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_row_that_held_nan_is_reused_cleanly(kind):
    # The failed row's cache held NaN K/V past any new owner's length; masked attention weighs those slots
    # by 0, and 0 * NaN is NaN, so the row is cleared before it is given away.
    eng, ps, alone, _ = _nan_token_setup(kind)
    res = eng.generate(ps[:1], GOOD, raise_on_error=False)  # row 0 fails mid-generation
    assert res[0].finish_reason == "error"
    assert eng.generate(ps[2:3], GOOD)[0].token_ids == alone[2]  # in row 0 again, its output is alone's


def test_nan_logits_reach_a_client_as_an_error_through_the_scheduler():
    eng, ps, alone, _ = _nan_token_setup("chain")
    sched = Scheduler(eng, idle_wait_s=0.05)
    sinks = [_Collector() for _ in ps]
    for p, s in zip(ps, sinks, strict=True):  # queued before the thread starts: one shared prefill
        sched.submit(eng.new_request(p, GOOD), s)
    sched.start()
    try:
        assert all(s.done.wait(60) for s in sinks)
    finally:
        sched.stop()
    for s in sinks[:2]:
        assert isinstance(s.items[-1], RequestFailed) and NONFINITE in str(s.items[-1])
    assert [s.ids() for s in sinks[2:]] == alone[2:]
    assert sched.metrics.requests["error"] == 2 and sched.metrics.requests["length"] == 2
    assert sched.batch.free_rows == [0, 1, 2, 3]


class _Collector:
    def __init__(self):
        self.items, self.done = [], threading.Event()

    def __call__(self, item):
        self.items.append(item)
        if isinstance(item, Exception) or item.finished:
            self.done.set()

    def ids(self):
        return [t for ev in self.items if not isinstance(ev, Exception) for t in ev.token_ids]


@pytest.mark.parametrize("json_out", [True, False])
def test_the_generate_command_fails_on_nan_logits(capsys, monkeypatch, json_out):
    from sglang_specpilot import cli

    real = Engine.from_options.__func__

    def nan_head(cls, options):  # the model as a corrupt checkpoint would load
        eng = real(cls, options)
        with torch.no_grad():
            eng.target.lm_head.weight[7, 3] = float("nan")
        return eng

    monkeypatch.setattr(Engine, "from_options", classmethod(nan_head))
    args = ["generate", "--prompt", "abc", "--model", "tiny-llama", "--synthetic", "--max-new-tokens", "4"]
    rc = cli.main(args + ["--mode", "ar"] + (["--json"] if json_out else []))
    out = capsys.readouterr()
    assert rc == 1 and NONFINITE in out.err and "tokens/s" not in out.out and "{" not in out.out
