"""Plan search: MCTS finds a known optimum of a synthetic cost, resumes from its JSON state; evaluation
checks (numerics, reward from paired timings)."""

import numpy as np
import torch

from sglang_specpilot.colocate.ops import OpInfo
from sglang_specpilot.colocate.plan import JointPlan
from sglang_specpilot.controller.mcts import MCTS, Evaluation
from sglang_specpilot.controller.plan_eval import anchor_speedup, numerical_check, round_reward
from sglang_specpilot.controller.proposer import EditProposer, ProposalContext
from sglang_specpilot.harness.timing import PairedTimes


def synthetic_catalog():
    # Three target and three draft segments with one GEMM each, plus one RMSNorm per target segment.
    cat = {}
    for s in range(3):
        cat[f"target/T{s}/gemm"] = OpInfo("target", s, 1, "gemm", (0,), 1e6, (4, 64), 2)
        cat[f"target/T{s}/norm"] = OpInfo("target", s, 0, "rmsnorm", (), 1e3, (4, 64), 2)
        cat[f"draft/D{s}/gemm"] = OpInfo("draft", s, 0, "gemm", (), 1e5, (4, 64), 2)
    return cat


GOOD = {"gemm[draft/D1/gemm,target/T0/gemm]": 0.3, "gemm[draft/D2/gemm,target/T2/gemm]": 0.2}


def synthetic_reward(plan: JointPlan) -> Evaluation:
    # Known optimum: exactly the two good groups (reward 1.5); every other group costs 0.1.
    r = 1.0 + sum(GOOD.get(g.key, -0.1) for g in plan.groups)
    return Evaluation(r)


def test_edit_proposer_enumerates_only_legal_edits():
    cat = synthetic_catalog()
    kinds = {k for k, _ in EditProposer().edits(JointPlan(), cat)}
    assert kinds == {"add", "priority"}
    one = next(p for k, p in EditProposer().edits(JointPlan(), cat) if k == "add")
    assert {k for k, _ in EditProposer().edits(one, cat)} == {"add", "remove", "priority"}
    prio = {p.priority for k, p in EditProposer().edits(one, cat) if k == "priority"}
    assert prio == {"draft", "target"}


def test_mcts_finds_the_known_optimum(tmp_path):
    ctx = ProposalContext(synthetic_catalog())
    search = MCTS(EditProposer(seed=1), synthetic_reward, ctx, proposals=4, state_path=tmp_path / "s.json")
    best = search.run(80)
    assert {g.key for g in best.groups} == set(GOOD)
    assert search.records[best.key]["reward"] == 1.5


def test_mcts_resumes_from_its_state(tmp_path):
    path = tmp_path / "state.json"
    calls = []

    def counted(plan):
        calls.append(plan.key)
        return synthetic_reward(plan)

    first = MCTS(EditProposer(seed=2), counted, ProposalContext(synthetic_catalog()), state_path=path)
    first.run(10)
    n_first = len(calls)
    again = MCTS(EditProposer(seed=2), counted, ProposalContext(synthetic_catalog()), state_path=path)
    assert len(calls) == n_first  # nothing re-evaluated on load, the root included
    assert again.to_dict()["nodes"] == first.to_dict()["nodes"]
    again.run(70)
    assert {g.key for g in again.best().groups} == set(GOOD)
    assert len(set(calls)) == len(calls)  # each plan measured once across both runs


def test_failed_plans_get_the_lowest_reward():
    def failing(plan):
        return Evaluation(None, [{"code": "NUMERICS"}]) if plan.key != "<empty>" else Evaluation(1.0)

    search = MCTS(EditProposer(), failing, ProposalContext(synthetic_catalog()))
    search.run(5)
    assert search.best().groups == ()
    assert all(r["reward"] is None for k, r in search.records.items() if k != "<empty>")


def test_numerical_check():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 50, generator=g)
    assert numerical_check(ref, ref + 1e-4).ok
    assert not numerical_check(ref, ref * 1.05).ok
    swapped = ref.clone()
    top = ref.argmax(-1)
    swapped[0, top[0]] -= 10.0  # a clear argmax change on row 0
    v = numerical_check(ref, swapped)
    assert not v.ok and v.argmax_mismatches == 1
    tie = ref.clone()
    a, b = tie[1].topk(2).indices
    tie[1, b] = tie[1, a] - 1e-4  # near-tie in the reference; the candidate flips it within tolerance
    cand = tie.clone()
    cand[1, b] = tie[1, a] + 1e-4
    v = numerical_check(tie, cand)
    assert v.ok and v.near_tie_mismatches == 1


def test_reward_from_paired_timings():
    blocks = {"anchor": [2.0, 2.2, 2.0], "candidate": [1.6, 2.0, 1.0], "control": [1.9, 2.1, 1.9]}
    times = PairedTimes.from_block_times(blocks)
    # Per-block anchor / candidate ratios: 1.25, 1.1, 2.0; median 1.25.
    assert round_reward(times, 1.2) == np.float64(1.25 * 1.2)
    base = PairedTimes.from_block_times({"seq_graph": [3.0, 3.0], "back_to_back": [3.3, 3.1], "anchor": [2.0, 2.5]})
    s, which = anchor_speedup(base, "anchor", ["seq_graph", "back_to_back"])
    assert which == "seq_graph" and s == np.median([1.5, 1.2])


def test_gate_tunes_the_kernel_configuration():
    from sglang_specpilot.colocate.plan import ConjugatedGroup, KernelConfig
    from sglang_specpilot.controller.plan_eval import PlanEvaluator

    cat = synthetic_catalog()
    group = ConjugatedGroup("gemm", ("target/T0/gemm", "draft/D1/gemm"))
    slow, fast, broken = KernelConfig(block_k=64), KernelConfig(block_k=256, split_k=8), KernelConfig(block_k=128)
    group_ms = {slow: 3.0, fast: 1.0}  # members take 1.0 + 1.0 separately

    def group_times(g):
        if g.config == broken:
            raise RuntimeError("out of shared memory")
        n = 24
        return PairedTimes.from_block_times(
            {
                "target/T0/gemm": [1.0] * n,
                "draft/D1/gemm": [1.0] * n,
                "group": [group_ms[g.config] * (1 + 0.001 * (i % 3)) for i in range(n)],
            }
        )

    ev = PlanEvaluator(
        cat, lambda p: None, lambda p: {}, group_times, 1.0, candidates=lambda family: (slow, broken, fast)
    )
    verdict = ev.gate(group)
    assert verdict["admitted"] and KernelConfig(**verdict["config"]) == fast
    assert [t.get("error", "")[:12] for t in verdict["tuning"]] == ["", "", "RuntimeError"]
    plan = JointPlan((group,))
    assert ev.tuned(plan).groups[0].config == fast and plan.groups[0].config == KernelConfig()
    # A resumed search hands its records back: the group is neither gated nor tuned again.
    again = PlanEvaluator(cat, lambda p: None, lambda p: {}, lambda g: 1 / 0, 1.0)
    again.restore([{"verdicts": {group.key: verdict}}])
    assert again.gate(group) == verdict and again.tuned(plan).groups[0].config == fast
