"""GPU-only checks (run on the H200): CUDA graphs and compiled blocks change nothing."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams

pytestmark = pytest.mark.gpu


def _engine(target, draft=None, graphs=True, compile=False, dtype="float32"):
    opts = EngineOptions(
        max_seq_len=256,
        max_batch_size=8,
        graph_batch_sizes=(1, 2, 4, 8),
        cuda_graphs=graphs,
        compile=compile,
        device="cuda",
        dtype=dtype,
        num_speculative_tokens=4,
    )
    return Engine(target, WordTokenizer(), opts, draft)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_graphs_equal_eager_fp32(arch):
    target = tiny_model(arch).cuda()
    ps = prompts([5, 17, 9], target.cfg.vocab_size, seed=1)
    p = SamplingParams(max_new_tokens=32, ignore_eos=True)
    eager = [r.token_ids for r in _engine(target, graphs=False).generate(ps, p)]
    graphed = _engine(target)
    graphed.warmup()
    assert [r.token_ids for r in graphed.generate(ps, p)] == eager
    spec = _engine(target, target.truncated(2))
    spec.warmup()
    assert [r.token_ids for r in spec.generate(ps, p)] == eager


def test_compiled_spec_equals_ar_or_near_tie_bf16():
    target = tiny_model("tiny-llama", dtype=torch.bfloat16).cuda()
    ps = prompts([5, 17, 9, 30], target.cfg.vocab_size, seed=2)
    p = SamplingParams(max_new_tokens=32, ignore_eos=True)
    ar = _engine(target, compile=True, dtype="bfloat16")
    spec = _engine(target, target.truncated(2), compile=True, dtype="bfloat16")
    a = [r.token_ids for r in ar.generate(ps, p)]
    s = [r.token_ids for r in spec.generate(ps, p)]
    for prompt, x, y in zip(ps, a, s, strict=False):
        if x != y:
            t = next(i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v)
            top2 = ar.teacher_force_logits(prompt, y)[t].topk(2).values
            assert float(top2[0] - top2[1]) < 0.25
