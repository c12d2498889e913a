"""SamplingParams refuses, when the request is made, what would fail inside the engine (a seed
``manual_seed`` cannot take, a top_k that overflows int64, a NaN temperature), and treats vanishing
temperatures as greedy."""

import pytest
from helpers import engine, prompts, tiny_model

from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.engine.sampling import BatchSampling

GOOD = SamplingParams(max_new_tokens=8, ignore_eos=True)


def _poisoned(**bad) -> SamplingParams:
    p = SamplingParams(max_new_tokens=8, temperature=0.7)
    for k, v in bad.items():  # past validation, on purpose
        setattr(p, k, v)
    return p


def test_sampling_params_refuse_what_would_fail_in_the_engine():
    for bad in (
        dict(seed=2**64, temperature=0.7),
        dict(seed=2**63),
        dict(seed=-1),
        dict(seed=True),
        dict(seed=1.0),
        dict(top_k=2**63),
        dict(top_k=-1),
        dict(top_k=2.0),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature=-1e-9),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)
    # What was refused above indeed fails inside the engine's sampling (the reason for the checks).
    for k, v in (("seed", 2**64), ("top_k", 2**63)):
        with pytest.raises((ValueError, RuntimeError, OverflowError)):
            BatchSampling.from_params([_poisoned(**{k: v})], "cpu")
    # Below 1e-5 a temperature is greedy: logits / 1e-40 overflow float32 and the probabilities are NaN.
    for t in (1e-40, 1e-300, 9.9e-6):
        assert SamplingParams(temperature=t).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    edge = SamplingParams(seed=2**63 - 1, top_k=2**63 - 1, temperature=0.5)
    assert (edge.seed, edge.top_k) == (2**63 - 1, 2**63 - 1)
    BatchSampling.from_params([edge], "cpu")  # and the engine takes the largest values it accepts


def test_a_vanishing_temperature_generates_greedy_text():
    target = tiny_model("tiny-llama")
    eng = engine(target, None, max_batch=4)
    p = prompts([6], eng.target.cfg.vocab_size, seed=2)[0]
    want = eng.generate([p], GOOD)[0].token_ids
    got = eng.generate([p], SamplingParams(max_new_tokens=8, ignore_eos=True, temperature=1e-40, seed=5))[0]
    assert got.token_ids == want
