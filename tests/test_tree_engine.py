"""Engine tree rounds: greedy output equals AR, planted trees, draft expansion masks, options.

Lossless must hold whatever the drafter proposes, so the drafters here range from the target itself
(oracle) through a truncated self-drafter to an unrelated random model (nothing accepted).
"""

import pytest
import torch
from conftest import needs_smollm2
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree, window_mask
from sglang_specpilot.engine.draft_tree import expand_lattice
from sglang_specpilot.engine.ngram_tree import ngram_tree
from sglang_specpilot.engine.round import Round, RoundShape
from sglang_specpilot.engine.runner import ModelRunner
from sglang_specpilot.engine.sampling import BatchSampling
from tree_verify import DraftTree

GREEDY = SamplingParams(max_new_tokens=30, ignore_eos=True)


def make_engine(target, draft=None, max_batch=8, **opts):
    o = EngineOptions(max_seq_len=256, max_batch_size=max_batch, device="cpu", dtype="float32", **opts)
    return Engine(target, WordTokenizer(), o, draft)


def ids(eng, ps, params=GREEDY):
    return [r.token_ids for r in eng.generate(ps, params)]


TREES = [
    dict(tree_depth=3),
    dict(tree_budget=8, tree_depth=3, tree_top_k=3),
    dict(tree_budget=20, tree_depth=5, tree_top_k=4),
]


@pytest.mark.parametrize("tree", TREES, ids=["chain3", "n8d3k3", "n20d5k4"])
@pytest.mark.parametrize("batch", [1, 3])
def test_tree_greedy_equals_ar(tree, batch):
    target = tiny_model("tiny-llama")
    ps = prompts([7, 13, 1][:batch], target.cfg.vocab_size, seed=batch)
    ar = ids(make_engine(target), ps)
    means = {}
    for name, draft in (
        ("self", target.truncated(1)),
        ("oracle", target),
        ("random", tiny_model("tiny-llama", seed=9)),
    ):
        res = make_engine(target, draft, **tree).generate(ps, GREEDY)
        assert [r.token_ids for r in res] == ar, name
        means[name] = min(r.mean_accepted for r in res)
    assert means["random"] < 1.2  # an unrelated drafter is almost never right
    if tree == TREES[0]:
        assert means["oracle"] == 4.0  # a chain of 3 from the target itself: every round emits 4 tokens
    assert means["oracle"] > 1.9


def test_tree_top_k_1_equals_chain_engine():
    # A chain is the tree with top_k = 1: same tokens and the same acceptance as the stock chain round.
    target = tiny_model("tiny-qwen3")
    draft = target.truncated(2)
    ps = prompts([5, 11, 3], target.cfg.vocab_size, seed=7)
    chain = make_engine(target, draft, num_speculative_tokens=4).generate(ps, GREEDY)
    tree = make_engine(target, draft, tree_depth=4).generate(ps, GREEDY)
    assert [r.token_ids for r in tree] == [r.token_ids for r in chain]
    assert [r.rounds for r in tree] == [r.rounds for r in chain]


def test_tree_batch_equals_single():
    target = tiny_model("tiny-qwen2")
    ps = prompts([3, 30, 8, 15], target.cfg.vocab_size, seed=5)
    eng = make_engine(target, target.truncated(2), tree_budget=12, tree_depth=4, tree_top_k=3)
    assert ids(eng, ps) == [ids(eng, [p])[0] for p in ps]


def test_ngram_tree_greedy_equals_ar():
    target = tiny_model("tiny-llama")
    # Repetitive prompts, so prompt lookup finds several continuations.
    base = prompts([6], target.cfg.vocab_size, seed=2)[0]
    ps = [base * 4, base[:3] * 5 + base]
    ar = ids(make_engine(target), ps)
    eng = make_engine(target, ngram_size=3, tree_budget=12, tree_depth=4, tree_top_k=3)
    assert ids(eng, ps) == ar


def test_ngram_tree_structure():
    seq = [5, 6, 7, 8, 5, 6, 9, 1, 5, 6]  # "5 6" was followed by 7 8 .. and by 9 1 ..
    history = torch.zeros(1, 32, dtype=torch.long)
    history[0, :9] = torch.tensor(seq[:9])
    tree, valid = ngram_tree(history, torch.tensor([9]), torch.tensor([6]), 2, 3, 4, 8)
    n = int(valid.sum())
    toks, pars = tree.tokens[0, :n].tolist(), tree.parents[0, :n].tolist()
    # Latest match first: "5 6" at 4 -> 9 1 5; then at 0 -> 7 8 5; then "6" alone adds nothing new.
    assert toks[:6] == [9, 1, 5, 7, 8, 5] and pars[:6] == [-1, 0, 1, -1, 3, 4]
    assert all(p < i for i, p in enumerate(pars))
    assert not valid[0, n:].any()


# ---------------------------------------------------------------------------- planted trees, one round


def _greedy_continuation(model, prefix, n):
    seq = list(prefix)
    for _ in range(n):
        r = ModelRunner(model, 1, 128, cuda_graphs=False)
        a, d = causal_tree(len(seq))
        seq.append(int(r.step(torch.tensor([seq]), torch.tensor([0]), a, d)[0, -1].argmax()))
    return seq[len(prefix) :]


def _planted_tree(g, correct_depth, rank, V, width=3, depth=4):
    """A tree with ``width`` children per node along one spine; the spine follows g for correct_depth
    levels (the correct child at sibling ``rank``), wrong tokens elsewhere."""
    tokens, parents, depths = [], [], []
    parent = -1
    for d in range(depth):
        wrong = [(g[d] + 1 + j) % V for j in range(width)]
        kids = list(wrong)
        if d < correct_depth:
            kids[rank] = g[d]
        spine = None
        for j, t in enumerate(kids):
            tokens.append(t)
            parents.append(parent)
            depths.append(d + 1)
            if j == rank:
                spine = len(tokens) - 1
        parent = spine
    return tokens, parents, depths


@pytest.mark.parametrize("correct_depth", [0, 1, 3, 4])
@pytest.mark.parametrize("rank", [0, 2])
def test_planted_tree_round(correct_depth, rank):
    model = tiny_model("tiny-llama", dtype=torch.float64)
    V = model.cfg.vocab_size
    prefix = prompts([9], V, seed=11)[0]
    g = _greedy_continuation(model, prefix, 6)  # g[0] is next_tok; the tree drafts g[1:]
    tok, par, dep = _planted_tree(g[1:], correct_depth, rank, V)
    N = len(tok)
    runner = ModelRunner(model, 1, 128, cuda_graphs=False, scratch_slots=64)
    a, d = causal_tree(len(prefix))
    runner.step(torch.tensor([prefix]), torch.tensor([0]), a, d)
    rnd = Round(runner, None, 1, RoundShape(N, 4, 3))
    tree = DraftTree(torch.tensor([tok]), torch.tensor([par]), torch.tensor([dep]), torch.zeros(1, N))
    history = torch.zeros(1, 128, dtype=torch.long)
    history[0, : len(prefix)] = torch.tensor(prefix)
    seq_len = torch.tensor([len(prefix)])
    bs = BatchSampling.from_params([SamplingParams()], "cpu")
    out = torch.zeros(1, 4 + 3, dtype=torch.long)  # RoundState.out: D + 1 tokens, the non-finite flag, n
    _, n = rnd.verify(
        history,
        seq_len,
        torch.tensor([g[0]]),
        tree.tokens,
        tree.parents,
        tree.tokens,
        None,
        None,
        bs=bs,
        kv_len=len(prefix) + N + 1,
        out=out,
    )
    assert int(n) == correct_depth
    assert out[0, : correct_depth + 1].tolist() == g[1 : correct_depth + 2]  # accepted + bonus
    assert out[0, -2] == 0  # finite logits
    L = len(prefix) + 1 + correct_depth
    assert history[0, :L].tolist() == prefix + g[: correct_depth + 1]
    # The committed cache is the accepted sequence's cache: the next step's logits equal a recompute.
    nxt = g[correct_depth + 1]
    step = runner.step(torch.tensor([[nxt]]), torch.tensor([L]), *causal_tree(1))[0, 0]
    ref = ModelRunner(model, 1, 128, cuda_graphs=False)
    full = prefix + g[: correct_depth + 2]
    want = ref.step(torch.tensor([full]), torch.tensor([0]), *causal_tree(len(full)))[0, -1]
    torch.testing.assert_close(step, want, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------- draft expansion


def test_window_mask_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    seq_len = torch.tensor([3, 0, 7])
    vis = torch.rand(3, 4, 5, generator=g) > 0.5
    m = window_mask(seq_len, vis, kv_len=16, group=2)
    for b, L in enumerate(seq_len.tolist()):
        for i in range(4):
            for j in range(16):
                want = j < L or (L <= j < L + 5 and bool(vis[b, i, j - L]))
                assert bool(m[b, 0, 2 * i, j]) == want and bool(m[b, 0, 2 * i + 1, j]) == want


@pytest.mark.parametrize("depth,top_k", [(1, 3), (3, 2), (4, 3)])
def test_expand_lattice_equals_recompute(depth, top_k):
    # Each expansion's children must be the draft's top-k given exactly the prefix, the root and the
    # expansion's own path: a brute-force recompute of each path from scratch checks masks and positions.
    model = tiny_model("tiny-qwen3", dtype=torch.float64)
    V = model.cfg.vocab_size
    lens = [6, 11]
    ps = prompts(lens, V, seed=4)
    runner = ModelRunner(model, 2, 128, cuda_graphs=False)
    history = torch.zeros(2, 128, dtype=torch.long)
    for b, p in enumerate(ps):
        history[b, : len(p)] = torch.tensor(p)
    # Draft cache valid for slots 0 .. seq_len - 2 (row 1's tail is rewritten by the expansion).
    a, d = causal_tree(11)
    runner.step(history[:, :11], torch.tensor([0, 0]), a, d)
    seq_len = torch.tensor([len(p) - 1 for p in ps])  # the prompt's last token is the root (next_tok)
    next_tok = torch.tensor([p[-1] for p in ps])
    lat, expanded_by, _ = expand_lattice(runner, history, seq_len, next_tok, depth, top_k)
    E = 1 + (depth - 1) * top_k
    assert lat.parents.shape == (2, E) and lat.tokens.shape == (2, E, top_k)
    flat_tok = lat.tokens.flatten(1)
    for b, p in enumerate(ps):
        for e in range(E):
            path, c = [], int(lat.parents[b, e])
            while c >= 0:
                path.append(int(flat_tok[b, c]))
                c = int(lat.parents[b, c // top_k])
            assert c == -1 and (e == 0 or int(expanded_by[b, int(lat.parents[b, e])]) == e)
            seq = p + path[::-1]
            ref = ModelRunner(model, 1, 128, cuda_graphs=False)
            want = torch.log_softmax(
                ref.step(torch.tensor([seq]), torch.tensor([0]), *causal_tree(len(seq)))[0, -1], -1
            )
            lp, tk = want.topk(top_k)
            assert lat.tokens[b, e].tolist() == tk.tolist()
            torch.testing.assert_close(lat.logprobs[b, e], lp, rtol=0, atol=1e-9)


@pytest.mark.parametrize("w", [2, 3, 5])
def test_narrow_top_k_drafts_the_same_best_tree(w):
    # ``round_kinds.width_shape`` drafts a w-node kind with top_k w, not the engine's wider top_k: the best
    # w nodes of the wide lattice must all be in the narrow one, so both build the same tree.
    from tree_verify import best_first

    model = tiny_model("tiny-qwen3", dtype=torch.float64)
    ps = prompts([6, 11, 9], model.cfg.vocab_size, seed=12)
    trees = []
    for k in (6, w):
        runner = ModelRunner(model, 3, 128, cuda_graphs=False)
        history = torch.zeros(3, 128, dtype=torch.long)
        for b, p in enumerate(ps):
            history[b, : len(p)] = torch.tensor(p)
        runner.step(history[:, :11], torch.tensor([0, 0, 0]), *causal_tree(11))
        seq_len = torch.tensor([len(p) - 1 for p in ps])
        next_tok = torch.tensor([p[-1] for p in ps])
        lat, _, _ = expand_lattice(runner, history, seq_len, next_tok, min(4, w), k)
        tree = best_first(lat, w)
        trees.append((tree.tokens.tolist(), tree.parents.tolist(), tree.scores))
    assert trees[0][:2] == trees[1][:2]
    torch.testing.assert_close(trees[0][2], trees[1][2], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(tree_budget=40, tree_depth=4, tree_top_k=2), "tree_budget must be in 1..14"),
        (dict(tree_budget=5), "raise tree_top_k"),
        (dict(tree_depth=0), "tree_depth must be in 1..32"),
        (dict(tree_top_k=0, tree_depth=2), "tree_top_k must be in 1..64"),
        (dict(tree_budget=300, tree_depth=8, tree_top_k=16), "at most 256"),
        (dict(tree_budget=2.5), "must be an integer"),
    ],
)
def test_tree_options_rejected(kw, needle):
    with pytest.raises(ValueError, match=needle):
        EngineOptions(device="cpu", **kw)


def test_tree_options_defaults():
    o = EngineOptions(device="cpu")
    assert not o.tree and o.tree_budget is None
    o = EngineOptions(device="cpu", num_speculative_tokens=5, tree_top_k=1)
    assert o.tree and (o.tree_budget, o.tree_depth, o.tree_top_k) == (5, 5, 1)


def test_tree_needs_a_drafter_or_is_ar():
    target = tiny_model("tiny-llama")
    # No drafter at all: AR, tree options have nothing to act on and the output is AR's.
    ps = prompts([5], target.cfg.vocab_size, seed=1)
    assert ids(make_engine(target, tree_depth=3), ps) == ids(make_engine(target), ps)
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        make_engine(
            tiny_model("tiny-llama", vocab_size=40),
            tiny_model("tiny-llama", vocab_size=40, seed=3),
            tree_budget=10,
            tree_depth=2,
            tree_top_k=50,
        )


# ---------------------------------------------------------------------------- the real pair


@needs_smollm2
def test_smollm2_tree_greedy_equals_ar():
    from sglang_specpilot.engine.loading import load_engine_models
    from sglang_specpilot.models.build import build_model
    from sglang_specpilot.models.config import ModelConfig

    opts = EngineOptions(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=2)
    target, _, tok, opts = load_engine_models(opts)
    ps = ["def fibonacci(n):\n    ", "The capital of France is"]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ar = [r.token_ids for r in Engine(target, tok, opts).generate(ps, params)]
    # An untrained drafter of the same vocabulary: two random layers (nothing it says needs to be right).
    cfg = ModelConfig(**{**target.cfg.to_dict(), "num_layers": 2, "name": "random-2"})
    random_draft = build_model(cfg, synthetic_seed=0, dtype=torch.float32, max_positions=target.rope.shape[0])
    tree = dict(tree_budget=16, tree_depth=4, tree_top_k=4)
    for draft in (target.truncated(4), random_draft):
        o = EngineOptions(**{**opts.__dict__, **tree})
        res = Engine(target, tok, o, draft).generate(ps, params)
        assert [r.token_ids for r in res] == ar


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_draft_chain_equals_the_top1_lattice(depth):
    # The greedy chain's fast path must draft the very tokens expand_lattice grows at top_k 1.
    from sglang_specpilot.engine.draft_tree import draft_chain

    model = tiny_model("tiny-qwen3", dtype=torch.float64)
    ps = prompts([6, 11, 8], model.cfg.vocab_size, seed=7)
    history = torch.zeros(3, 128, dtype=torch.long)
    for b, p in enumerate(ps):
        history[b, : len(p)] = torch.tensor(p)
    seq_len = torch.tensor([len(p) - 1 for p in ps])
    next_tok = torch.tensor([p[-1] for p in ps])
    got = []
    for fast in (False, True):
        runner = ModelRunner(model, 3, 128, cuda_graphs=False)
        a, d = causal_tree(11)
        runner.step(history[:, :11], torch.tensor([0, 0, 0]), a, d)
        if fast:
            got.append(draft_chain(runner, history, seq_len, next_tok, depth))
        else:
            lat, _, _ = expand_lattice(runner, history, seq_len, next_tok, depth, 1)
            got.append(lat.tokens[:, :, 0])
    assert got[1].shape == (3, depth) and torch.equal(got[0], got[1])
