"""The rounds suite's timing helper, on the CPU: one generation through the engine's stream."""

import pytest
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.suites.rounds import timed_generation


def _engine():
    target = tiny_model("tiny-llama")
    return Engine(target, WordTokenizer(), EngineOptions(max_seq_len=128, max_batch_size=2, device="cpu"))


def test_timed_generation_returns_the_generation_and_its_first_token_time():
    eng = _engine()
    p = prompts([9], eng.target.cfg.vocab_size, seed=3)[0]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    result, first, total = timed_generation(eng, p, params)
    assert result.token_ids == eng.generate([p], params)[0].token_ids
    assert len(result.token_ids) == 6 and 0 < first <= total


def test_timed_generation_refuses_a_failed_generation():
    # A request the engine fails ends with an error event (a result with ``error`` set), not an exception;
    # the timing must not count it as a generation.
    from sglang_specpilot.engine.request import GenerationResult, StreamEvent

    class Failing:
        def stream(self, batch, params):
            bad = GenerationResult("", [], "error", 3, 0, 0.0, 0.0, 0.0, error="NaN logits")
            yield StreamEvent(0, [], "", True, "error", bad)

    with pytest.raises(RuntimeError, match="timed generation failed: NaN logits"):
        timed_generation(Failing(), [1, 2, 3], SamplingParams(max_new_tokens=4))
