"""GPU-only checks (run on the H200): CUDA graphs and compiled blocks change nothing."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams

pytestmark = pytest.mark.gpu


def _engine(target, draft=None, graphs=True, compile=False, dtype="float32", **kw):
    opts = EngineOptions(
        max_seq_len=256,
        max_batch_size=8,
        graph_batch_sizes=(1, 2, 4, 8),
        cuda_graphs=graphs,
        compile=compile,
        device="cuda",
        dtype=dtype,
        num_speculative_tokens=4,
        **kw,
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


def test_decode_gemv_equals_cublas_or_near_tie_bf16():
    # AR with the one-row GEMV (the default) against AR with cuBLAS, both compiled and captured: the same
    # tokens, or a first difference at a near-tie of cuBLAS's logits (the sums run in another order).
    target = tiny_model("tiny-llama", dtype=torch.bfloat16).cuda()
    ps = prompts([5, 17, 9, 30], target.cfg.vocab_size, seed=4)
    p = SamplingParams(max_new_tokens=32, ignore_eos=True)
    cublas = _engine(target, compile=True, dtype="bfloat16", decode_gemv=False)
    cublas.warmup()
    assert cublas.target_runner.decode_gemv_layers == 0
    a = [r.token_ids for r in cublas.generate(ps, p)]
    gemv = _engine(target, compile=True, dtype="bfloat16")
    assert gemv.target_runner.decode_gemv_layers == 4 * target.num_layers + 1
    gemv.warmup()
    b = [r.token_ids for r in gemv.generate(ps, p)]
    for prompt, x, y in zip(ps, a, b, strict=True):
        if x != y:
            t = next(i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v)
            top2 = cublas.teacher_force_logits(prompt, x)[t].topk(2).values
            assert float(top2[0] - top2[1]) < 0.25


@pytest.mark.parametrize("B,N,Hq,Hkv,D", [(1, 1, 9, 3, 64), (8, 5, 9, 3, 64), (1, 5, 32, 8, 128), (8, 1, 32, 8, 128)])
def test_tree_attention_kernel_real_shapes(B, N, Hq, Hkv, D):
    from sglang_specpilot.kernels.tree_attention import tree_attention, tree_attention_ref

    g = torch.Generator(device="cuda").manual_seed(0)
    S = 2112
    q = torch.randn(B, N, Hq, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, S, Hkv, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, S, Hkv, D, device="cuda", generator=g).bfloat16()
    seq_len = torch.randint(0, S - N, (B,), device="cuda", generator=g)
    anc = torch.ones(N, N, dtype=torch.bool, device="cuda").tril()
    torch.testing.assert_close(
        tree_attention(q, k, v, seq_len, anc).float(),
        tree_attention_ref(q, k, v, seq_len, anc).float(),
        atol=2e-2,
        rtol=2e-2,
    )


def test_fused_attention_graph_equals_sdpa_fp32():
    target = tiny_model("tiny-qwen3").cuda()  # head_dim 32: the fused kernel's smallest supported size
    ps = prompts([5, 40, 9], target.cfg.vocab_size, seed=3)
    p = SamplingParams(max_new_tokens=24, ignore_eos=True)
    sdpa = _engine(target, target.truncated(2), graphs=False)
    fused = _engine(target, target.truncated(2))
    assert fused.target_runner.fused_attention
    assert [r.token_ids for r in fused.generate(ps, p)] == [r.token_ids for r in sdpa.generate(ps, p)]
