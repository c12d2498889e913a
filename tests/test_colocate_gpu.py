"""GPU-only checks of co-located rounds (run on the H200): two streams captured in one graph change nothing."""

import pytest
import torch
from helpers import tiny_model

from sglang_specpilot.colocate.grouped_gemm import GemmMember, GroupedGemm, gemm_ref
from sglang_specpilot.colocate.plan import GEMM_CANDIDATES, ConjugatedGroup, JointPlan
from sglang_specpilot.engine.colocated import RoundBuffers, build_round
from sglang_specpilot.engine.kv_cache import KVCache

pytestmark = pytest.mark.gpu

PLAN = JointPlan(
    (
        ConjugatedGroup("gemm", ("target/L0.attn/qkv", "draft/s0.L0.attn/qkv")),
        ConjugatedGroup("rmsnorm", ("target/L1.mlp/mlp_norm", "draft/s1.L0.mlp/mlp_norm")),
        ConjugatedGroup("add", ("target/L3.mlp/mlp_add", "draft/s2.L1.mlp/mlp_add")),
    )
)


def _round(plan, *, streams=True, capture=False, compiled=False):
    kw = dict(num_heads=2, num_kv_heads=1, head_dim=32)  # a head size the fused attention kernel has
    target = tiny_model("tiny-llama", seed=0, **kw).cuda()
    draft = tiny_model("tiny-llama", seed=1, num_layers=2, **kw).cuda()
    tk, dk = (KVCache(m.cfg, 4, 128, "cuda", torch.float32) for m in (target, draft))
    g = torch.Generator(device="cuda").manual_seed(5)
    for k, v in tk.layers + dk.layers:
        k.normal_(generator=g)
        v.normal_(generator=g)
    a, b = (RoundBuffers(target, draft, tk, dk, lo, lo + 2, 3, 128) for lo in (0, 2))
    assert a.fused
    a.load(torch.tensor([9, 20], device="cuda"))
    b.load(torch.tensor([11, 4], device="cuda"))
    a.verify_block.copy_(torch.randint(2, 500, (2, 4), device="cuda", generator=g))
    b.draft_block.copy_(torch.randint(2, 500, (2, 2), device="cuda", generator=g))
    rnd = build_round(target, draft, a, b, plan, streams=streams, compiled=compiled)
    if capture:
        rnd.capture()
    rnd()
    torch.cuda.synchronize()
    return rnd.target.state["logits"], torch.stack(rnd.draft.state["drafts"], 1)


@pytest.mark.parametrize("compiled", [False, True])
def test_captured_two_stream_round_is_bit_identical(compiled):
    want = _round(None, streams=False, compiled=compiled)
    for plan in (None, JointPlan(priority="draft"), PLAN.control()):
        got = _round(plan, capture=True, compiled=compiled)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), plan and plan.key


def test_captured_interleaved_round_matches():
    # Interleaved kernels sum in another order (fp32 here): equal drafts, logits to rounding.
    want = _round(None, streams=False)
    logits, drafts = _round(PLAN, capture=True)
    assert torch.equal(drafts, want[1])
    torch.testing.assert_close(logits, want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", GEMM_CANDIDATES, ids=lambda c: f"{c.block_m}x{c.block_n}x{c.block_k}s{c.split_k}")
def test_grouped_gemm_candidates_match_reference(cfg):
    g = torch.Generator(device="cuda").manual_seed(0)

    def t(*s):
        return torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)

    # Decode-like members with odd sizes: 20 target rows, 4 draft rows, a K tail, an N tail.
    members = [
        GemmMember(t(20, 1000), t(300, 1000), None, cfg.split_k),
        GemmMember(t(4, 520), t(77, 520), t(77), cfg.split_k),
    ]
    outs = [torch.empty(m.x.shape[0], m.w.shape[0], device="cuda", dtype=torch.bfloat16) for m in members]
    GroupedGemm(
        members,
        outs,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        block_k=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )()
    for y, r in zip(outs, gemm_ref(members), strict=True):
        torch.testing.assert_close(y.float(), r.float(), rtol=2e-2, atol=2e-2 * float(r.abs().max()))


@pytest.mark.parametrize("compiled", [False, True])
def test_captured_colocated_generation_is_lossless(compiled):
    from helpers import engine, prompts

    from sglang_specpilot.engine import SamplingParams
    from sglang_specpilot.engine.colocated import ColocatedDecoder

    kw = dict(num_heads=2, num_kv_heads=1, head_dim=32)
    target = tiny_model("tiny-llama", seed=0, **kw).cuda()
    draft = tiny_model("tiny-llama", seed=1, num_layers=2, **kw).cuda()
    ps = prompts([5, 9, 3, 12, 7], target.cfg.vocab_size, seed=3)
    eng = engine(target, draft, gamma=3, device="cuda")
    want = [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=24, ignore_eos=True))]
    dec = ColocatedDecoder(target, draft, 3, 8, 256, plan=PLAN, compiled=compiled)
    assert dec.graphs
    assert dec.generate(ps, 24) == want
