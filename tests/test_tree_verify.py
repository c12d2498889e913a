"""tree_verify: best-first trees against brute force, masks and positions, greedy and sampled acceptance.

The sampling tests are statistical with fixed seeds: chi-square of the emitted tokens against the target
distribution, rejected at p < 1e-4; a negative control runs the same test with a broken residual update
and must fail it, which shows the test has the power to catch a wrong rule.
"""

import heapq
import itertools

import pytest
import torch

import tree_verify.accept as accept_mod
from tree_verify import (
    DraftTree,
    Lattice,
    accept_greedy,
    accept_greedy_batched,
    accept_sampling,
    ancestor_mask,
    best_first,
    best_first_per_depth,
    chain,
    positions,
)

# ---------------------------------------------------------------------------------------- helpers


def random_lattice(seed: int, num_expansions: int, k: int, vocab: int = 50) -> Lattice:
    """EAGLE-2-like lattice: each expansion expands a random earlier candidate (or the root)."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1]
    for e in range(1, num_expansions):
        parents.append(int(torch.randint(-1, e * k, (), generator=g)))
    logits = torch.randn(num_expansions, vocab, generator=g) * 2
    lp, tok = torch.log_softmax(logits, -1).topk(k, dim=-1)
    return Lattice(torch.tensor(parents), tok, lp)


def brute_force_top(lattice: Lattice, n: int) -> list[int]:
    """Scores by walking each candidate's path to the root; the top n candidate ids."""
    k = lattice.topk
    par, lp = lattice.parents.tolist(), lattice.logprobs.flatten().tolist()
    scores = []
    for c in range(len(lp)):
        s, cur = 0.0, c
        while cur >= 0:
            s += lp[cur]
            cur = par[cur // k]
        scores.append(s)
    return sorted(range(len(lp)), key=lambda c: -scores[c])[:n]


def check_tree_structure(tree: DraftTree) -> None:
    par, dep, sc = tree.parents.tolist(), tree.depths.tolist(), tree.scores.tolist()
    for i, p in enumerate(par):
        assert p < i, "topological: parent before child"
        assert dep[i] == (1 if p < 0 else dep[p] + 1)
        if p >= 0:
            assert sc[p] >= sc[i]
    assert all(a >= b for a, b in itertools.pairwise(sc)), "non-increasing score order"


def anc_reference(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    anc = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    for i in range(n + 1):
        j = i
        while True:
            anc[i, j] = True
            if j == 0:
                break
            j = parents[j - 1] + 1
    return anc


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value (upper tail = regularized upper incomplete gamma)."""
    n = counts.sum()
    expected = probs.double() * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with target probability 0 was emitted"
    stat = ((counts[keep].double() - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


# ------------------------------------------------------------------------------------ best first


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 5, 17])
def test_best_first_matches_brute_force(seed, n):
    lat = random_lattice(seed, num_expansions=7, k=3)
    tree = best_first(lat, n)
    want = brute_force_top(lat, n)
    cand_tokens = lat.tokens.flatten()
    assert sorted(tree.tokens.tolist()) == sorted(cand_tokens[want].tolist())
    scores, _ = lat.candidate_scores()
    torch.testing.assert_close(tree.scores, scores[want], rtol=0, atol=0)
    check_tree_structure(tree)


def test_best_first_batched_equals_per_request():
    lats = [random_lattice(s, 6, 4) for s in range(5)]
    batched = Lattice(
        torch.stack([x.parents for x in lats]),
        torch.stack([x.tokens for x in lats]),
        torch.stack([x.logprobs for x in lats]),
    )
    tb = best_first(batched, 11)
    for b, lat in enumerate(lats):
        t = best_first(lat, 11)
        for f in ("tokens", "parents", "depths", "scores"):
            assert torch.equal(getattr(tb, f)[b], getattr(t, f)), f


def test_best_first_ties_keep_parents_first():
    # Probability-1 edges: every node scores 0, so only the tie-break keeps parents first.
    lat = Lattice.from_expansions(
        [(-1, torch.tensor([5, 6]), torch.tensor([0.0, 0.0])), (1, torch.tensor([7, 8]), torch.zeros(2))]
        + [(3, torch.tensor([9, 10]), torch.zeros(2))]
    )
    tree = best_first(lat, 6)
    check_tree_structure(tree)
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9, 10]
    assert tree.parents.tolist() == [-1, -1, 1, 1, 3, 3]


def test_lattice_rejects_bad_input():
    with pytest.raises(ValueError):
        Lattice(torch.tensor([0]), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2))  # parent not earlier
    with pytest.raises(ValueError):
        Lattice(torch.tensor([-1]), torch.zeros(1, 2, dtype=torch.long), torch.full((1, 2), 0.1))
    with pytest.raises(ValueError):
        best_first(random_lattice(0, 2, 2), 5)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 8, 30])
def test_best_first_per_depth_matches_brute_force(seed, n):
    g = torch.Generator().manual_seed(seed)
    D, k = 4, 3
    lp = torch.log_softmax(torch.randn(D, 20, generator=g) * 2, -1)[:, :k]  # unsorted on purpose
    tok = torch.randint(0, 1000, (D, k), generator=g)
    paths = [r for d in range(1, D + 1) for r in itertools.product(range(k), repeat=d)]
    score = {r: sum(lp[i, ri].item() for i, ri in enumerate(r)) for r in paths}
    want = heapq.nlargest(n, paths, key=score.get)
    tree = best_first_per_depth(tok, lp, n)
    check_tree_structure(tree)
    torch.testing.assert_close(
        tree.scores.double(), torch.tensor([score[r] for r in want], dtype=torch.float64), rtol=0, atol=1e-6
    )
    # Reconstruct each node's token path and compare as multisets with the brute force's.
    seqs = []
    for i in range(n):
        s, j = [], i
        while j >= 0:
            s.append(tree.tokens[j].item())
            j = tree.parents[j].item()
        seqs.append(tuple(reversed(s)))
    assert sorted(seqs) == sorted(tuple(tok[d, r[d]].item() for d in range(len(r))) for r in want)


# ------------------------------------------------------------------------------- mask, positions


@pytest.mark.parametrize("seed", range(4))
def test_ancestor_mask_and_positions(seed):
    tree = best_first(random_lattice(seed, 8, 3), 13)
    anc = ancestor_mask(tree.parents)
    assert torch.equal(anc, anc_reference(tree.parents.tolist()))
    pos = positions(tree, 40)
    assert pos[0] == 40
    assert torch.equal(pos, 40 + anc.sum(-1) - 1)  # depth = number of strict ancestors
    # Batched: [B, N] parents and [B] prefix lengths.
    trees = [best_first(random_lattice(s, 8, 3), 13) for s in range(3)]
    par = torch.stack([t.parents for t in trees])
    assert torch.equal(ancestor_mask(par), torch.stack([anc_reference(t.parents.tolist()) for t in trees]))
    bt = DraftTree(par, par, torch.stack([t.depths for t in trees]), par.float())
    pre = torch.tensor([3, 0, 100])
    assert torch.equal(positions(bt, pre), torch.stack([positions(t, int(p)) for t, p in zip(trees, pre, strict=True)]))


def test_chain():
    t = chain(torch.tensor([4, 5, 6]), torch.log(torch.tensor([0.5, 0.5, 0.5])))
    assert t.parents.tolist() == [-1, 0, 1] and t.depths.tolist() == [1, 2, 3]
    assert torch.equal(ancestor_mask(t.parents), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(positions(t, 7), torch.arange(7, 11))
    assert t.block_tokens(9).tolist() == [9, 4, 5, 6]


# ------------------------------------------------------------------------------------ greedy


def test_greedy_oracle_accepts_whole_path():
    tree = best_first(random_lattice(3, 10, 3), 20)
    leaf = max(range(20), key=lambda i: (tree.depths[i].item(), -i))
    path = [leaf]
    while tree.parents[path[-1]] >= 0:
        path.append(tree.parents[path[-1]].item())
    path = [0] + [i + 1 for i in reversed(path)]
    target = torch.full((21,), 10_000)  # a token no node has
    for a, b in itertools.pairwise(path):
        target[a] = tree.tokens[b - 1]
    target[path[-1]] = 77
    got_path, bonus = accept_greedy(tree, target)
    assert got_path == path and bonus == 77


def test_greedy_no_match_accepts_root_only():
    tree = best_first(random_lattice(1, 6, 3), 12)
    target = torch.full((13,), 10_000)
    assert accept_greedy(tree, target) == ([0], 10_000)


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_greedy_match_at_depth_and_sibling_rank(depth, rank):
    # Full 3-ary tree of depth 3 built level by level; the target follows sibling `rank` for `depth` steps.
    k, tokens, parents, frontier = 3, [], [], [-1]
    for _ in range(3):
        nxt = []
        for p in frontier:
            for _ in range(k):
                parents.append(p)
                tokens.append(len(tokens) + 100)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    n = len(tokens)
    tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.zeros(n, dtype=torch.long), torch.zeros(n))
    children = {u: [i for i, p in enumerate(parents) if p == u] for u in [-1, *range(n)]}
    target = torch.full((n + 1,), 5)
    node, want = -1, [0]
    for _ in range(depth):
        child = children[node][rank]
        target[node + 1] = tokens[child]
        want.append(child + 1)
        node = child
    target[node + 1] = 42
    assert accept_greedy(tree, target) == (want, 42)
    res = accept_greedy_batched(
        tree.parents[None].repeat(2, 1), tree.tokens[None].repeat(2, 1), target[None].repeat(2, 1)
    )
    assert res.accept_length.tolist() == [depth, depth] and res.bonus.tolist() == [42, 42]
    assert res.path[0, : depth + 1].tolist() == want and (res.path[0, depth + 1 :] == -1).all()


# ---------------------------------------------------------------------------------- sampling

V = 8
TRIALS = 6000


def sampling_setup(seed: int):
    g = torch.Generator().manual_seed(seed)
    # Target and draft deliberately far apart so a wrong residual shows up clearly.
    p1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1).double()
    q1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1).double()
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1).double()  # p2[x]: target after token x
    q2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1).double()
    return p1, q1, p2, q2


def draw(q: torch.Tensor, m: int, replacement: bool, g: torch.Generator) -> list[int]:
    return torch.multinomial(q, m, replacement=replacement, generator=g).tolist()


def run_sampling(mode: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Emitted first-token counts [V], and second-token counts [V, V] given the first (when emitted)."""
    p1, q1, p2, q2 = sampling_setup(0)
    g = torch.Generator().manual_seed(seed)
    first = torch.zeros(V, dtype=torch.long)
    second = torch.zeros(V, V, dtype=torch.long)
    rep = mode == "with_replacement"
    for _ in range(TRIALS):
        if mode == "deterministic":
            kids = q1.topk(3).indices.tolist()
        else:
            kids = draw(q1, 3, rep, g)
        tokens, parents, tp, dp = [], [], [p1], [q1]
        for x in kids:
            tokens.append(x)
            parents.append(-1)
            tp.append(p2[x])
            dp.append(q2[x])
        for i, x in enumerate(kids):
            grand = q2[x].topk(2).indices.tolist() if mode == "deterministic" else draw(q2[x], 2, rep, g)
            for y in grand:
                tokens.append(y)
                parents.append(i)
                tp.append(p1)  # the third token is not checked
                dp.append(q1)
        n = len(tokens)
        tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.zeros(n, dtype=torch.long), torch.zeros(n))
        path, final = accept_sampling(tree, torch.stack(tp), torch.stack(dp), mode=mode, generator=g)
        emitted = [tokens[i - 1] for i in path[1:]] + [final]
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            second[emitted[0], emitted[1]] += 1
    return first, second


@pytest.mark.parametrize("mode", ["with_replacement", "without_replacement", "deterministic"])
def test_sampling_is_lossless(mode):
    p1, _, p2, _ = sampling_setup(0)
    first, second = run_sampling(mode, seed=1)
    assert chi2_pvalue(first, p1) > 1e-4
    for x in range(V):
        if second[x].sum() >= 200:
            assert chi2_pvalue(second[x], p2[x]) > 1e-4, f"second token after {x}"
    assert second.sum() > TRIALS // 4  # the depth-2 check saw real data


@pytest.mark.parametrize("mode", ["with_replacement", "without_replacement"])
def test_sampling_negative_control(mode, monkeypatch):
    # Wrong rule: on rejection keep sampling from the unchanged target instead of the residual.
    monkeypatch.setattr(accept_mod, "_residual", lambda p, q: p)
    p1, _, _, _ = sampling_setup(0)
    first, _ = run_sampling(mode, seed=1)
    assert chi2_pvalue(first, p1) < 1e-4


def test_sampling_without_replacement_needs_q_renormalized(monkeypatch):
    # Wrong rule for without-replacement drafting: test every sibling against the original q.
    p1, _, _, _ = sampling_setup(0)

    def wrong(tree, tp, dp, mode, generator):
        return accept_mod.accept_sampling(tree, tp, dp, mode="with_replacement", generator=generator)

    monkeypatch.setitem(globals(), "accept_sampling", wrong)
    first, _ = run_sampling("without_replacement", seed=1)
    assert chi2_pvalue(first, p1) < 1e-4
