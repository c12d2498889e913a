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


def test_engine_options_reach_the_runners():
    # Options must not be dropped on the way: compile=True has to arm the compiled block in every runner.
    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine

    target = tiny_model("tiny-qwen3")
    opts = EngineOptions(
        max_seq_len=64,
        max_batch_size=2,
        compile=True,
        cuda_graphs=False,
        device="cpu",
        dtype="float32",
        num_speculative_tokens=3,
        graph_batch_sizes=(1, 2),
    )
    eng = Engine(target, None, opts, target.truncated(1))
    for runner in (eng.target_runner, eng.draft_runner):
        assert runner._layer_fn is not None
        assert runner.ladder == (1, 2) and runner.max_seq == 64
    assert eng.shape.depth == 3
