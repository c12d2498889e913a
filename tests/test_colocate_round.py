"""Co-scheduled rounds on the CPU: the same values as the conventional round, and lossless generation."""

import pytest
import torch
from helpers import engine, prompts, tiny_model

from sglang_specpilot.colocate.coschedule import PlanError
from sglang_specpilot.colocate.plan import ConjugatedGroup, JointPlan
from sglang_specpilot.colocate.segments import StepInputs, verify_chain
from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.engine.attn_meta import build_step_meta, causal_tree
from sglang_specpilot.engine.colocated import ColocatedDecoder, RoundBuffers, build_round
from sglang_specpilot.engine.kv_cache import KVCache

PLAN = JointPlan(
    (
        ConjugatedGroup("gemm", ("target/L0.attn/qkv", "draft/s0.L0.attn/qkv")),
        ConjugatedGroup("rmsnorm", ("target/L0.attn/attn_norm", "draft/s0.L0.attn/attn_norm")),
        ConjugatedGroup("gemm", ("target/L1.mlp/down", "draft/s1.L1.mlp/down")),
        ConjugatedGroup("add", ("target/L3.mlp/mlp_add", "draft/s2.L0.mlp/mlp_add")),
    )
)


@pytest.fixture(scope="module")
def models():
    return tiny_model("tiny-llama", seed=0), tiny_model("tiny-llama", seed=1, num_layers=2)


def test_segments_reproduce_the_model_forward(models):
    target, _ = models
    kv = KVCache(target.cfg, 2, 64, "cpu", torch.float32)
    kv2 = KVCache(target.cfg, 2, 64, "cpu", torch.float32)
    seq = torch.tensor([3, 7])
    anc, depth = causal_tree(5)
    meta = build_step_meta(seq, anc, depth, 64, target.cfg.num_heads // target.cfg.num_kv_heads)
    tokens = torch.randint(2, 500, (2, 5), generator=torch.Generator().manual_seed(0))
    ref = target(tokens, meta.positions, meta.slots, meta.mask, kv.layers)
    step = StepInputs(tokens, meta.positions, meta.slots, meta.mask, kv2.layers, width=5, batch=2)
    chain = verify_chain(target, step)
    chain.run()
    assert torch.equal(chain.state["logits"], ref)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(kv.layers, kv2.layers, strict=True))


def test_compiled_operations_match_the_eager_chain(models):
    # compiled=True compiles the operations between GEMMs (inductor here, as on CUDA): a different kernel
    # schedule, the same mathematics up to fp32 rounding, and the same cache writes.
    target, _ = models
    anc, depth = causal_tree(5)
    meta = build_step_meta(torch.tensor([3, 7]), anc, depth, 64, target.cfg.num_heads // target.cfg.num_kv_heads)
    tokens = torch.randint(2, 500, (2, 5), generator=torch.Generator().manual_seed(0))
    out = []
    for compiled in (False, True):
        kv = KVCache(target.cfg, 2, 64, "cpu", torch.float32)
        chain = verify_chain(
            target, StepInputs(tokens, meta.positions, meta.slots, meta.mask, kv.layers, width=5, batch=2), compiled
        )
        chain.run()
        out.append((chain.state["logits"], kv.layers))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-5)
    for (k1, v1), (k0, v0) in zip(out[1][1], out[0][1], strict=True):
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)


def _round_outputs(models, plan, streams=True, fused=False):
    target, draft = models
    tk = KVCache(target.cfg, 4, 128, "cpu", torch.float32)
    dk = KVCache(draft.cfg, 4, 128, "cpu", torch.float32)
    g = torch.Generator().manual_seed(5)
    for k, v in tk.layers + dk.layers:  # a filled cache, never zeros
        k.normal_(generator=g)
        v.normal_(generator=g)
    a, b = (RoundBuffers(target, draft, tk, dk, lo, lo + 2, 3, 128, fused) for lo in (0, 2))
    a.load(torch.tensor([9, 20]))
    b.load(torch.tensor([11, 4]))
    a.verify_block.copy_(torch.randint(2, 500, (2, 4), generator=g))
    b.draft_block.copy_(torch.randint(2, 500, (2, 2), generator=g))
    rnd = build_round(target, draft, a, b, plan, streams=streams)
    rnd()
    return (
        rnd.target.state["logits"],
        torch.stack(rnd.draft.state["drafts"], 1),
        torch.stack(rnd.draft.state["draft_logits"], 1),
    )


def test_co_scheduled_round_equals_the_conventional_round(models):
    conventional = _round_outputs(models, None, streams=False)
    for plan in (None, PLAN, PLAN.control()):
        for got, want in zip(_round_outputs(models, plan), conventional, strict=True):
            assert torch.equal(got, want)


def test_fused_attention_round_matches_the_masked_round(models32):
    # The fused tree-attention path (the CUDA default; its PyTorch reference here) reads the per-step
    # starts that ``load`` rewrites: same drafts, logits equal up to fp32 summation order.
    masked = _round_outputs(models32, None, streams=False)
    for plan in (None, PLAN):
        logits, drafts, draft_logits = _round_outputs(models32, plan, fused=True)
        assert torch.equal(drafts, masked[1])
        torch.testing.assert_close(logits, masked[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(draft_logits, masked[2], rtol=1e-5, atol=1e-5)


def test_illegal_plan_is_refused_with_its_codes(models):
    bad = JointPlan((ConjugatedGroup("gemm", ("target/L0.attn/qkv", "target/L0.attn/o")),))
    with pytest.raises(PlanError) as err:
        _round_outputs(models, bad)
    assert {p.code for p in err.value.problems} >= {"NOT_CROSS_MODEL", "DEPENDENT_MEMBERS"}


@pytest.mark.parametrize("plan", [None, PLAN])
def test_colocated_generation_is_lossless(models, plan):
    target, draft = models
    ps = prompts([5, 9, 3, 12, 7], target.cfg.vocab_size, seed=3)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    want = [r.token_ids for r in engine(target, draft, gamma=3).generate(ps, params)]
    got = ColocatedDecoder(target, draft, 3, 8, 256, plan=plan).generate(ps, 16)
    assert got == want


@pytest.fixture(scope="module")
def models32():
    # head_dim 32: a size the fused tree-attention kernel has (the tiny preset's 16 is not one).
    kw = dict(num_heads=2, num_kv_heads=1, head_dim=32)
    return tiny_model("tiny-llama", seed=0, **kw), tiny_model("tiny-llama", seed=1, num_layers=2, **kw)


@pytest.mark.parametrize("plan", [None, PLAN])
def test_fused_attention_generation_is_lossless(models32, plan):
    target, draft = models32
    ps = prompts([5, 9, 3, 12, 7], target.cfg.vocab_size, seed=3)
    want = [
        r.token_ids
        for r in engine(target, draft, gamma=3).generate(ps, SamplingParams(max_new_tokens=16, ignore_eos=True))
    ]
    assert ColocatedDecoder(target, draft, 3, 8, 256, plan=plan, fused=True).generate(ps, 16) == want
