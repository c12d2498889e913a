"""tlv/ as a library: the plan, the combined tree, the EAGLE-3 feature window, trunk statistics, each
against its plain reference on odd shapes."""

import pytest
import torch

from tlv import (
    TLVPlan,
    chain_window,
    chain_window_reference,
    combine_tree,
    combine_tree_reference,
    trunk_accepted,
    trunk_accepted_reference,
)
from tree_verify import accept_greedy_batched, ancestor_mask


def _random_tree(B, N, g):
    """B random topological trees of N nodes (parent < own index, -1 = root)."""
    par = torch.stack(
        [torch.tensor([int(torch.randint(-1, i, (1,), generator=g)) for i in range(N)]) for _ in range(B)]
    )
    return torch.randint(0, 7, (B, N), generator=g), par


@pytest.mark.parametrize("B,L,Nh,Nr", [(1, 1, 1, 0), (3, 4, 5, 0), (2, 2, 3, 4), (5, 7, 1, 1), (1, 3, 6, 6)])
def test_combine_tree_matches_reference(B, L, Nh, Nr):
    g = torch.Generator().manual_seed(B * 100 + L)
    chain = torch.randint(0, 7, (B, L), generator=g)
    ht, hp = _random_tree(B, Nh, g)
    rt, rp = _random_tree(B, Nr, g) if Nr else (None, None)
    tok, par = combine_tree(chain, ht, hp, rt, rp)
    rtok, rpar = combine_tree_reference(chain, ht, hp, rt, rp)
    assert torch.equal(tok, rtok) and torch.equal(par, rpar)
    assert tok.shape == (B, L + Nh + Nr)
    assert bool((par < torch.arange(par.shape[1])).all())  # topological: what ancestor_mask needs
    anc = ancestor_mask(par)
    depth = anc.sum(-1) - 1
    assert torch.equal(depth[:, 1 : L + 1], torch.arange(1, L + 1).expand(B, L))  # the trunk
    assert bool((depth[:, L + 1 : L + 1 + Nh] > L).all())  # the hanging tree sits below c_L
    assert bool(anc[:, L + 1 : L + 1 + Nh, L].all())  # every hanging node has c_L as an ancestor


def _walk(tokens, parents, target, node=-1):
    """Greedy acceptance by hand: the longest path from ``node`` whose every token is the target's argmax
    at its parent (siblings may repeat a token: every matching child is tried). -> (n, bonus)."""
    want = target[node + 1]
    best = (0, want)
    for i, p in enumerate(parents):
        if p == node and tokens[i] == want:
            n, bonus = _walk(tokens, parents, target, i)
            if n + 1 > best[0]:
                best = (n + 1, bonus)
    return best


def test_greedy_acceptance_on_combined_trees():
    g = torch.Generator().manual_seed(3)
    for _ in range(30):
        B, L, Nh, Nr = 3, int(torch.randint(1, 5, (1,), generator=g)), 4, 3
        chain = torch.randint(0, 3, (B, L), generator=g)
        ht, hp = _random_tree(B, Nh, g)
        rt, rp = _random_tree(B, Nr, g)
        tok, par = combine_tree(chain, ht % 3, hp, rt % 3, rp)
        target = torch.randint(0, 3, (B, tok.shape[1] + 1), generator=g)
        res = accept_greedy_batched(par, tok, target, ancestor_mask(par))
        for b in range(B):
            n, bonus = _walk(tok[b].tolist(), par[b].tolist(), target[b].tolist())
            assert int(res.accept_length[b]) == n
            if n:  # ties between equally deep paths may pick either bonus; n = 0 has one
                continue
            assert int(res.bonus[b]) == bonus


@pytest.mark.parametrize("B,W,L,F", [(1, 1, 1, 1), (3, 5, 4, 2), (4, 2, 6, 3)])
def test_chain_window_matches_reference(B, W, L, F):
    g = torch.Generator().manual_seed(W * 10 + L)
    feats, qf = torch.randn(B, W, F, generator=g), torch.randn(B, L, F, generator=g)
    n_prev = torch.randint(0, W, (B,), generator=g)
    assert torch.equal(chain_window(feats, qf, n_prev), chain_window_reference(feats, qf, n_prev))


def test_trunk_accepted_matches_reference():
    path = torch.tensor([[0, 1, 2, 2, 2], [0, 5, 6, 6, 6], [0, 1, 2, 3, 4], [0, -1, -1, -1, -1], [0, 1, 2, 3, 9]])
    assert torch.equal(trunk_accepted(path, 3), trunk_accepted_reference(path, 3))
    assert trunk_accepted(path, 3).tolist() == [2, 0, 3, 0, 3]


def test_plan_budget_split_and_bounds():
    p = TLVPlan(chain_len=3, depth=4, top_k=2, hang_budget=6, root_budget=4)
    assert p.budget == 13 and p.max_depth == 7 and p.max_children == 3 and p.expansions == 7
    assert p.reach >= p.budget + 2 and p.reach >= p.max_depth + p.chain_len + 2
    chain = TLVPlan(chain_len=1, depth=1, top_k=1, hang_budget=1)
    assert chain.budget == 2 and chain.max_depth == 2 and chain.max_children == 1
    for bad in (dict(chain_len=0), dict(hang_budget=0), dict(hang_budget=99), dict(root_budget=-1)):
        with pytest.raises(ValueError, match="tlv_"):
            TLVPlan(**{**dict(chain_len=2, depth=3, top_k=2, hang_budget=4), **bad})
