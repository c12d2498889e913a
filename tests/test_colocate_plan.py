"""Joint plans: JSON round trip, interleaving proportions, and every legality feedback code."""

import pytest
import torch
from helpers import tiny_model

from sglang_specpilot.colocate import legality as L
from sglang_specpilot.colocate.plan import ConjugatedGroup, JointPlan, KernelConfig
from sglang_specpilot.engine.colocated import RoundBuffers, build_round
from sglang_specpilot.engine.kv_cache import KVCache


@pytest.fixture(scope="module")
def catalog():
    t, d = tiny_model("tiny-llama", seed=0), tiny_model("tiny-llama", seed=1, num_layers=2)
    tk = KVCache(t.cfg, 4, 128, "cpu", torch.float32)
    dk = KVCache(d.cfg, 4, 128, "cpu", torch.float32)
    a = RoundBuffers(t, d, tk, dk, 0, 2, 3, 128)
    b = RoundBuffers(t, d, tk, dk, 2, 4, 3, 128)
    return build_round(t, d, a, b).catalog


def G(family, *members, **cfg):
    return ConjugatedGroup(family, members, KernelConfig(**cfg))


QKV = G("gemm", "target/L0.attn/qkv", "draft/s0.L0.attn/qkv")
NORM = G("rmsnorm", "target/L2.mlp/mlp_norm", "draft/s1.L0.mlp/mlp_norm")


def codes(plan, catalog):
    return {f.code for f in L.check_plan(plan, catalog)}


def test_plan_json_round_trip(catalog):
    plan = L.annotate_proportions(JointPlan((NORM, G("gemm", *QKV.members, block_n=32, split_k=2)), kmax=3), catalog)
    back = JointPlan.from_json(plan.to_json())
    assert back == plan and back.to_dict() == plan.to_dict() and back.key == plan.key
    assert back.groups[0].config.split_k in (1, 2) and back.proportions == plan.proportions


def test_proportions_follow_arithmetic_work(catalog):
    props = L.annotate_proportions(JointPlan((QKV,)), catalog).proportions[QKV.key]
    t, d = catalog["target/L0.attn/qkv"], catalog["draft/s0.L0.attn/qkv"]
    # Same layer shapes, but the verify block has gamma + 1 = 4 rows per request, draft step 0 has 2.
    assert props["target/L0.attn/qkv"] == pytest.approx(t.work / (t.work + d.work))
    assert props["target/L0.attn/qkv"] == pytest.approx(4 / 6)


def test_legal_plans_pass(catalog):
    assert L.check_plan(JointPlan(), catalog) == []
    assert L.check_plan(JointPlan((QKV, NORM)), catalog) == []


@pytest.mark.parametrize(
    "groups, code",
    [
        ((G("gemm", "target/L0.attn/qkv", "draft/nope/qkv"),), L.UNKNOWN_OP),
        ((G("softmax", "target/L0.attn/qkv", "draft/s0.L0.attn/qkv"),), L.BAD_FAMILY),
        ((G("gemm", "target/L0.attn/attn_norm", "draft/s0.L0.attn/qkv"),), L.FAMILY_MISMATCH),
        ((G("gemm", "target/L0.attn/qkv"),), L.GROUP_SIZE),
        ((G("gemm", "target/L0.attn/qkv", "target/L1.attn/qkv"),), L.NOT_CROSS_MODEL),
        ((QKV, G("gemm", "target/L0.attn/qkv", "draft/s1.L0.attn/qkv")), L.DUPLICATE_OP),
        ((G("gemm", "target/L0.attn/qkv", "target/L0.attn/o", "draft/s0.L0.attn/qkv"),), L.DEPENDENT_MEMBERS),
        ((G("gemm", "target/L0.attn/qkv", "draft/s0.L0.attn/qkv", "draft/s0.L1.attn/qkv"),), L.SPANS_SEGMENTS),
        ((QKV, G("rmsnorm", "target/L0.attn/attn_norm", "draft/s1.L0.attn/attn_norm")), L.NOT_INJECTIVE),
        (
            (
                G("gemm", "target/L0.attn/qkv", "draft/s2.L0.attn/qkv"),
                G("gemm", "target/L1.attn/qkv", "draft/s1.L0.attn/qkv"),
            ),
            L.CYCLE,
        ),
        # One joint node, two groups ordered oppositely: qkv before o in the target, after it in the draft.
        (
            (
                G("gemm", "target/L0.attn/qkv", "draft/s0.L0.attn/o"),
                G("gemm", "target/L0.attn/o", "draft/s0.L0.attn/qkv"),
            ),
            L.CYCLE,
        ),
        ((G("gemm", *QKV.members, block_n=48),), L.BAD_CONFIG),
    ],
)
def test_each_feedback_code(catalog, groups, code):
    assert code in codes(JointPlan(groups), catalog)


def test_memory_budget(catalog):
    plan = JointPlan((QKV, NORM), memory_budget_bytes=1000)
    assert codes(plan, catalog) == {L.MEMORY_BUDGET}
    need = L.memory_bytes(JointPlan((QKV, NORM)), catalog)
    assert L.check_plan(JointPlan((QKV, NORM), memory_budget_bytes=need), catalog) == []
    # The placement control builds no interleaved kernels, so it needs no extra memory.
    assert L.memory_bytes(JointPlan((QKV, NORM)).control(), catalog) == 0


def test_stream_priority_is_part_of_the_plan(catalog):
    plan = JointPlan((QKV,), priority="draft")
    back = JointPlan.from_json(plan.to_json())
    assert back == plan and back.priority == "draft"
    # Distinct search nodes, and the placement control keeps the same scheduling arrangement.
    assert plan.key != JointPlan((QKV,)).key and JointPlan().key == "<empty>"
    assert plan.control().priority == "draft" and plan.with_groups(()).priority == "draft"
    assert L.check_plan(plan, catalog) == []
    assert codes(JointPlan(priority="sideways"), catalog) == {L.BAD_PRIORITY}
