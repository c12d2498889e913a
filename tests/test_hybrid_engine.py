"""Hybrid (Gated DeltaNet) targets in the engine: greedy AR = chain = tree for every verify strategy,
and a planted tree's commit equals recomputing the accepted sequence from scratch.

The drafters: prompt lookup, the target's own attention layers as a draft model
(``HybridTransformer.attention_only``; both rarely right on random targets, so mostly n = 0 commits), and
a planted drafter that knows the AR output and drafts it with deliberate errors, on a varying sibling of
a tree, so rounds accept 0 .. D tokens along non-first branches and every commit path is exercised.
"""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.round import Round, RoundShape
from sglang_specpilot.engine.runner import ModelRunner
from sglang_specpilot.engine.sampling import BatchSampling
from tree_verify import DraftTree

GREEDY = SamplingParams(max_new_tokens=30, ignore_eos=True)
TREE = dict(tree_budget=10, tree_depth=4, tree_top_k=3)


def make_engine(target, draft=None, **opts):
    o = EngineOptions(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", **opts)
    return Engine(target, WordTokenizer(), o, draft)


def ids(eng, ps):
    return [r.token_ids for r in eng.generate(ps, GREEDY)]


def _prompts(model, batch):
    # Mixed lengths, one past a prefill chunk boundary of 64 (the padded second chunk), one repetitive.
    base = prompts([5, 70, 9], model.cfg.vocab_size, seed=batch)
    return [base[0] * 4, base[1], base[2][:3] * 3 + base[2]][:batch]


@pytest.mark.parametrize("arch", ["tiny-hybrid", "tiny-hybrid-8"])
@pytest.mark.parametrize("batch", [1, 3])
def test_hybrid_greedy_ar_equals_chain_equals_tree(arch, batch):
    target = tiny_model(arch)
    ps = _prompts(target, batch)
    ar = ids(make_engine(target), ps)
    for strat in ("stock", "path", "wy"):
        chain = make_engine(target, ngram_size=3, num_speculative_tokens=4, gdn_verify=strat).generate(ps, GREEDY)
        assert [r.token_ids for r in chain] == ar, ("chain", strat)
        drafted = make_engine(target, target.attention_only(), num_speculative_tokens=3, gdn_verify=strat)
        assert ids(drafted, ps) == ar, ("draft chain", strat)
        if strat == "stock":
            continue
        assert ids(make_engine(target, ngram_size=3, gdn_verify=strat, **TREE), ps) == ar, ("ngram tree", strat)
        assert ids(make_engine(target, target.attention_only(), gdn_verify=strat, **TREE), ps) == ar, ("tree", strat)


def _oracle(eng, ps, ar, width, depth):
    """Replace the round's drafter by one that drafts the AR continuation (known in advance), wrong at
    depth d when (seq_len + d) % 4 == 0, the right child at sibling seq_len % width (tensor ops only)."""
    V = eng.target.cfg.vocab_size
    W = eng.state.history.shape[1]
    full = torch.zeros(eng.state.history.shape[0], W, dtype=torch.long)  # rows past the requests: free
    for b, (p, a) in enumerate(zip(ps, ar, strict=True)):
        full[b, : len(p) + len(a)] = torch.tensor(p + a)
    d = torch.arange(1, depth + 1)
    j = torch.arange(width)

    def draft(hist, seq, nxt, bs, kv_len, features=None):
        B = seq.shape[0]
        right = full[:B].gather(1, (seq[:, None] + d).clamp(max=W - 1))  # [B, D]
        right = torch.where((seq[:, None] + d) % 4 == 0, (right + 7) % V, right)
        rank = seq % width
        kids = (right[:, :, None] + 1 + j) % V  # [B, D, width], all wrong
        kids = torch.where(j == rank[:, None, None], right[:, :, None], kids)
        tokens = kids.reshape(B, depth * width)
        if width == 1:
            return tokens, None, None, None, None
        spine = (d - 1)[None, :] * width + rank[:, None]  # node index of depth d's spine child
        parents = torch.cat([torch.full((B, 1), -1), spine[:, :-1]], 1)[:, :, None].expand(B, depth, width)
        return tokens, parents.reshape(B, depth * width), tokens, None, None

    eng.round._draft = draft
    return eng


@pytest.mark.parametrize("strat,width", [("stock", 1), ("path", 1), ("path", 3), ("wy", 3)])
@pytest.mark.parametrize("batch", [1, 3])
def test_hybrid_planted_drafts_equal_ar(strat, width, batch):
    target = tiny_model("tiny-hybrid")
    ps = _prompts(target, batch)
    ar = ids(make_engine(target), ps)
    opts = dict(num_speculative_tokens=4) if width == 1 else dict(tree_budget=12, tree_depth=4, tree_top_k=3)
    eng = _oracle(make_engine(target, target.attention_only(), gdn_verify=strat, **opts), ps, ar, width, 4)
    res = eng.generate(ps, GREEDY)
    assert [r.token_ids for r in res] == ar
    assert min(r.mean_accepted for r in res) > 2.0  # most drafts accepted: commits of 0 .. 4 nodes


def test_stock_refuses_trees():
    target = tiny_model("tiny-hybrid")
    with pytest.raises(ValueError, match="cannot verify trees"):
        make_engine(target, target.attention_only(), **TREE)
    with pytest.raises(ValueError, match="no truncated drafter"):
        target.truncated(1)


def _greedy_continuation(model, prefix, n):
    seq = list(prefix)
    for _ in range(n):
        r = ModelRunner(model, 1, 128, cuda_graphs=False)
        seq.append(int(r.step(torch.tensor([seq]), torch.tensor([0]), *causal_tree(len(seq)))[0, -1].argmax()))
    return seq[len(prefix) :]


def _planted(g, correct_depth, rank, V, width, depth=4):
    # ``width`` children per node along one spine; the spine follows g for correct_depth levels.
    tokens, parents, parent = [], [], -1
    for d in range(depth):
        kids = [(g[d] + 1 + j) % V for j in range(width)]
        if d < correct_depth:
            kids[rank] = g[d]
        for j, t in enumerate(kids):
            tokens.append(t)
            parents.append(parent)
            if j == rank:
                spine = len(tokens) - 1
        parent = spine
    return tokens, parents


@pytest.mark.parametrize(
    "strat,width,rank", [("stock", 1, 0), ("path", 1, 0), ("path", 3, 2), ("wy", 3, 2), ("wy", 3, 0)]
)
@pytest.mark.parametrize("correct_depth", [0, 2, 4])
def test_planted_round_commit_equals_recompute(strat, width, rank, correct_depth):
    model = tiny_model("tiny-hybrid", dtype=torch.float64)
    V = model.cfg.vocab_size
    prefix = prompts([9], V, seed=11)[0]
    g = _greedy_continuation(model, prefix, 6)  # g[0] is next_tok; the tree drafts g[1:]
    tok, par = _planted(g[1:], correct_depth, rank, V, width)
    N = len(tok)
    runner = ModelRunner(model, 1, 128, cuda_graphs=False, scratch_slots=64)
    runner.step(torch.tensor([prefix]), torch.tensor([0]), *causal_tree(len(prefix)))
    runner.recurrent.configure(strat, 5)
    rnd = Round(runner, None, 1, RoundShape(N, 4, width))
    depths = torch.zeros(1, N)
    tree = DraftTree(torch.tensor([tok]), None if width == 1 else torch.tensor([par]), depths, depths)
    history = torch.zeros(1, 128, dtype=torch.long)
    history[0, : len(prefix)] = torch.tensor(prefix)
    seq = torch.tensor([len(prefix)])
    bs = BatchSampling.from_params([SamplingParams()], "cpu")
    out = torch.zeros(1, 4 + 3, dtype=torch.long)
    acc = None if width == 1 else tree.tokens
    _, n = rnd.verify(history, seq, torch.tensor([g[0]]), tree.tokens, tree.parents, acc, None, None, bs=bs,
                      kv_len=len(prefix) + N + 1, out=out)  # fmt: skip
    assert int(n) == correct_depth
    L = len(prefix) + 1 + correct_depth
    nxt = g[correct_depth + 1]
    step = runner.step(torch.tensor([[nxt]]), torch.tensor([L]), *causal_tree(1))[0, 0]
    ref = ModelRunner(model, 1, 128, cuda_graphs=False)
    full = prefix + g[: correct_depth + 2]
    want = ref.step(torch.tensor([full]), torch.tensor([0]), *causal_tree(len(full)))[0, -1]
    torch.testing.assert_close(step, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(runner.recurrent.ssm, ref.recurrent.ssm, rtol=0, atol=1e-10)


@pytest.mark.parametrize("strat", ["stock", "path"])
def test_auto_off_on_a_hybrid_target_equals_ar(strat):
    # Automatic off's AR rounds (engine/keepup_round.py) step the target one token at a time; the runner
    # commits a hybrid target's recurrent state on such steps itself, so speculation switching off and
    # back on (probes) keeps the state exact: the output is AR's.
    target = tiny_model("tiny-hybrid")
    ps = prompts([7, 12, 4], target.cfg.vocab_size, seed=11)
    ar = ids(make_engine(target), ps)
    # Speculation costs 2.5x an AR step: the attention-only drafter's acceptance cannot pay for it.
    curve = ((1, 1.0, 2.5), (8, 2.0, 5.0))
    opts = dict(num_speculative_tokens=3, gdn_verify=strat, auto_off=True, auto_off_curve=curve)
    eng = make_engine(target, target.attention_only(), auto_off_probe_every=4, **opts)
    assert ids(eng, ps) == ar
    from sglang_specpilot.engine.auto_off import AR, PROBE

    d = eng.policy.decisions
    assert d.get(AR, 0) > 0 and d.get(PROBE, 0) >= 1  # it did switch off, and re-tested while off
