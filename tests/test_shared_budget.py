"""The shared node budget (issue 18): never over its size, every row's share a prefix-closed tree, rows
not in use take nothing, and greedy output under it equals AR and each request alone."""

import pytest
import torch
from helpers import WordTokenizer, captured_case, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.round_kinds import kinds_at
from sglang_specpilot.engine.shared_budget import shared_keep
from tree_verify import best_first
from tree_verify.lattice import Lattice


def _random_trees(B, depth, k, N, seed):
    g = torch.Generator().manual_seed(seed)
    E = 1 + (depth - 1) * k
    lp = torch.log_softmax(torch.randn(B, E, k, generator=g), -1)
    parents = torch.cat([torch.full((B, 1), -1), torch.arange(1, E).expand(B, E - 1) - 1], 1)
    # expansion e > 0 expands candidate (e - 1): a valid lattice of parent candidates before it
    lat = Lattice(parents=parents, tokens=torch.randint(0, 50, (B, E, k), generator=g), logprobs=lp)
    return best_first(lat, N)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("total", [1, 5, 17, 40, 1000])
def test_budget_never_exceeded_and_every_share_is_prefix_closed(seed, total):
    B, N = 5, 12
    tree = _random_trees(B, 4, 3, N, seed)
    use = torch.tensor([True, True, False, True, True])
    keep = shared_keep(tree.scores, use, total)
    assert int(keep.sum()) == min(total, int(use.sum()) * N)
    assert not keep[~use].any()
    for b in range(B):
        for i in range(N):
            p = int(tree.parents[b, i])
            if keep[b, i] and p >= 0:
                assert keep[b, p], (b, i, p)  # a kept node's parent is kept: prefix-closed
        # and the share is the row's best nodes: no dropped node scores above a kept one
        if keep[b].any() and (~keep[b]).any():
            assert tree.scores[b][keep[b]].min() >= tree.scores[b][~keep[b]].max()
    # globally: every kept node scores at least as high as every dropped node of a row in use
    dropped = (~keep) & use[:, None]
    if keep.any() and dropped.any():
        assert tree.scores[keep].min() >= tree.scores[dropped].max()


def _ids(eng, ps, n=24):
    return [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize("total", [3, 10])
def test_greedy_under_the_shared_budget_equals_alone_and_ar(total):
    target = tiny_model("tiny-llama")
    draft = target.truncated(2)
    ps = prompts([5, 9, 3, 12], target.cfg.vocab_size, seed=6)
    base = dict(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32")
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(**base)), ps)
    tree = dict(tree_budget=8, tree_depth=4, tree_top_k=2)
    eng = Engine(target, WordTokenizer(), EngineOptions(**base, **tree, shared_budget=total), draft)
    alone = [_ids(eng, [p])[0] for p in ps]
    assert _ids(eng, ps) == ar == alone
    assert eng.policy.shared_rounds > 0
    assert eng.batch.round_tokens > eng.batch.rounds  # drafts were accepted within the shares


def test_shared_budget_needs_trees():
    with pytest.raises(ValueError, match="tree"):
        EngineOptions(shared_budget=8, device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("adaptive_width", [False, True])
def test_captured_batched_mechanisms_equal_ar_gpu(adaptive_width):
    # bench batched's specpilot_batched system on the H200 failed its capture: the shared budget's
    # ``keep[taken] = True`` copied a host scalar inside the graph. Capture every mechanism together here.
    target = tiny_model("tiny-llama").cuda()
    draft = target.truncated(2)
    ps = prompts([5, 9, 3, 12, 30, 7], target.cfg.vocab_size, seed=6)
    kw = dict(max_seq_len=256, max_batch_size=8, graph_batch_sizes=(1, 2, 4, 8), device="cuda", dtype="float32")
    ar = _ids(Engine(target, WordTokenizer(), EngineOptions(**kw, compile=False)), ps)
    mech = dict(tree_budget=8, tree_depth=4, tree_top_k=2, shared_budget=12, auto_off=True, adaptive_depths=(2, 3))
    mech["adaptive_width"] = adaptive_width  # every narrower width captured at every bucket, chosen per round
    eng = Engine(target, WordTokenizer(), EngineOptions(**kw, compile=False, **mech), draft)
    eng.warmup()
    assert _ids(eng, ps) == ar
    assert eng.policy.shared_rounds > 0
    assert eng.policy.width_rounds.get(4, 0) > 0  # 12 nodes: 4 a row from 2 rows up, captured narrowed kinds
    assert all(b in eng.kinds_captured[k] for b in (2, 4, 8) for k in eng.kinds_captured if k in kinds_at(eng, b))
    # The engine's own round is captured only where no shared budget narrows it: 8 nodes fit 12 at 1 row.
    assert [b for b in (1, 2, 4, 8) if b in eng.captured] == [1]


@pytest.mark.gpu
def test_captured_mechanisms_with_admission_carry_in_the_ar_round_gpu():
    # Prompts ride the keep-up AR round where the speculative one is planted slower than the separate prefill
    # (``admission.carry_kind``); one and two riders a round, each its own captured shape.
    from test_prompt_admission import _serve

    target, draft, ps, kw, alone = captured_case()
    mech = dict(tree_budget=8, tree_depth=4, tree_top_k=2, shared_budget=12, auto_off=True, prompt_admission=64)
    eng = Engine(target, WordTokenizer(), EngineOptions(**kw, compile=False, **mech), draft)
    eng.warmup()
    assert eng.carry_ms and all("ar" in ms for ms in eng.carry_ms.values())
    captured = len(eng.carrying._graphs)
    for key in eng.carry_ms:  # planted: only the AR round carries within the prefill's time
        eng.carry_ms[key] = {k: (1.0 if k == "ar" else 9.0) for k in eng.carry_ms[key]}
        eng.admission_costs[key] = (1.0, 2.0)
    got, _, _ = _serve(eng, [[ps[0]], [], [ps[1], ps[2]], [ps[3]], [], [ps[4], ps[5]]], 20, lookahead=True)
    assert got == alone
    assert eng.batch.carrying_kinds.get("ar", 0) >= 2 and set(eng.batch.carrying_kinds) == {"ar"}
    assert len(eng.carrying._graphs) == captured  # every carrying shape was captured at warm-up


def test_kinds_at_lists_only_what_a_bucket_runs():
    # Under a shared budget of 16 nodes a tree of 8 runs whole at 2 rows and narrowed (4 nodes) at 4, so
    # the 4-row bucket captures the narrowed kind, not the whole one (which 64 rows of an 8B could not hold).
    target = tiny_model("tiny-llama")
    opts = EngineOptions(
        max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", tree_budget=8, tree_depth=4,
        tree_top_k=2, shared_budget=16, auto_off=True, adaptive_depths=(2,),
    )  # fmt: skip
    eng = Engine(target, WordTokenizer(), opts, target.truncated(2))
    assert kinds_at(eng, 2) == [None, "ar", 2]
    assert kinds_at(eng, 4) == ["ar", (4, 4), (2, 4)]
    for b in (2, 4):  # and the policy only ever picks a listed kind
        assert eng.policy.choose(list(range(b)), b) in kinds_at(eng, b)
