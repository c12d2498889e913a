"""Bad requests get a clear error that names the problem, and the engine keeps working."""

import pytest
from helpers import engine, prompts, tiny_model

from sglang_specpilot.engine import RequestError, SamplingParams


def test_request_errors_then_engine_still_works():
    target = tiny_model("tiny-llama")
    eng = engine(target, target.truncated(1), max_seq=64)
    with pytest.raises(RequestError, match="empty"):
        eng.generate([[]])
    with pytest.raises(RequestError, match="context holds 64"):
        eng.generate([list(range(2, 62))], SamplingParams(max_new_tokens=8))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        eng.generate([[5, 10**6]])
    with pytest.raises(RequestError, match="max_batch_size"):
        eng.generate([[5]] * 9)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    ok = eng.generate(prompts([5], target.cfg.vocab_size), SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(ok[0].token_ids) == 4
