"""Our trees as SGLang's tree tensors: hand-built expected tensors in SGLang's exact format, and the
standalone drafter's lattice read the way SGLang's own draft loop builds it."""

import pytest
import torch

from sglang_specpilot.sglang_plugin.draft_lattice import best_first_tree, lattice_from_steps
from sglang_specpilot.sglang_plugin.tree_tensors import sglang_tree_tensors
from tests.sglang_support import import_sglang, needs_sglang
from tree_verify import DraftTree

T, F = True, False


def _tree(tokens, parents, depths):
    t = torch.tensor(tokens)
    return DraftTree(t, torch.tensor(parents), torch.tensor(depths), torch.zeros(t.shape))


def test_small_batch_matches_hand_built_tensors():
    # Request 0 (seq_len 3): two branches 0 -> {1 -> 3, 2 -> 4}. Request 1 (seq_len 1): a chain.
    # Request 2 (seq_len 2): best-first order puts a grandchild between the root's children:
    # block 1, 3, 4 are the root's children, block 2 is block 1's child.
    tree = _tree(
        [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]],
        [[-1, -1, 0, 1], [-1, 0, 1, 2], [-1, 0, -1, -1]],
        [[1, 1, 2, 2], [1, 2, 3, 4], [1, 2, 1, 1]],
    )
    got = sglang_tree_tensors(tree, torch.tensor([10, 20, 30]), torch.tensor([3, 1, 2]))
    same = sglang_tree_tensors(tree, torch.tensor([10, 20, 30]), torch.tensor([3, 1, 2]), torch.tensor([3, 1, 2]))
    assert torch.equal(same.custom_mask, got.custom_mask)

    assert got.num_verify_tokens == 5
    assert torch.equal(got.draft_token, torch.tensor([10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 30, 31, 32, 33, 34]))
    assert torch.equal(got.positions, torch.tensor([3, 4, 4, 5, 5, 1, 2, 3, 4, 5, 2, 3, 4, 3, 3]))
    assert torch.equal(got.retrive_index, torch.arange(15).reshape(3, 5))
    assert torch.equal(got.retrive_next_token, torch.tensor([[1, 3, 4, -1, -1], [1, 2, 3, 4, -1], [1, 2, -1, -1, -1]]))
    assert torch.equal(got.retrive_next_sibling, torch.tensor([[-1, 2, -1, -1, -1], [-1] * 5, [-1, 3, -1, 4, -1]]))
    mask0 = [  # 3 prefix columns, then ancestor-or-self over the 5 block entries
        [T, T, T, T, F, F, F, F],
        [T, T, T, T, T, F, F, F],
        [T, T, T, T, F, T, F, F],
        [T, T, T, T, T, F, T, F],
        [T, T, T, T, F, T, F, T],
    ]
    mask1 = [[T] + [j <= i for j in range(5)] for i in range(5)]
    mask2 = [
        [T, T, T, F, F, F, F],
        [T, T, T, T, F, F, F],
        [T, T, T, T, T, F, F],
        [T, T, T, F, F, T, F],
        [T, T, T, F, F, F, T],
    ]
    expected = torch.cat([torch.tensor(m).flatten() for m in (mask0, mask1, mask2)])
    assert got.custom_mask.dtype == torch.bool
    assert torch.equal(got.custom_mask, expected)


def test_lattice_from_steps_hand_built():
    # k = 2, two steps: the root's expansion, then SGLang expands its two children (parents 0 and 1).
    parents_list = [torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 3]])]
    token_list = [torch.tensor([[5, 6]]), torch.tensor([[7, 8, 9, 4]])]
    probs = [torch.tensor([[0.5, 0.25]]), torch.tensor([[1.0, 0.5], [0.5, 0.25]])]
    parents, tokens, logprobs = lattice_from_steps(parents_list, token_list, probs, topk=2)
    assert torch.equal(parents, torch.tensor([[-1, 0, 1]]))
    assert torch.equal(tokens, torch.tensor([[[5, 6], [7, 8], [9, 4]]]))
    assert torch.equal(logprobs, torch.log(torch.tensor([[[0.5, 0.25], [1.0, 0.5], [0.5, 0.25]]])))
    # Best 3 by path probability: 7 (0.5 * 1), 5 (0.5, its parent, ties go parent first), then 6 (0.25)
    # or 8 (0.25) or 9 (0.125): 6 (depth 1) before 8 (depth 2) at equal score.
    tree = best_first_tree(parents, tokens, logprobs, 3)
    assert torch.equal(tree.tokens, torch.tensor([[5, 7, 6]]))
    assert torch.equal(tree.parents, torch.tensor([[-1, 0, -1]]))


@needs_sglang
@pytest.mark.parametrize("batch,topk,steps,num_draft", [(1, 2, 2, 4), (2, 3, 3, 8), (3, 4, 4, 16)])
def test_best_first_selects_eagles_top_candidates(batch, topk, steps, num_draft):
    """Driven through SGLang's own draft-step function, our tree holds the N - 1 candidates EAGLE's
    ``organize_draft_results`` keeps, under the same parents (ties are impossible with random scores)."""
    import_sglang()
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    g = torch.Generator().manual_seed(batch * 100 + topk)
    n_cand = topk + (steps - 1) * topk * topk
    ids = torch.randperm(10_000, generator=g)[: batch * n_cand].reshape(batch, n_cand)  # unique tokens
    used = [0]

    def draw(rows):
        p = torch.rand(batch * rows, topk, generator=g).sort(dim=-1, descending=True).values / topk
        t = ids[:, used[0] : used[0] + rows * topk].reshape(batch * rows, topk)
        used[0] += rows * topk
        return p, t

    topk_p, topk_index = draw(1)
    hidden = torch.zeros(batch, 1)
    scores, score_list, token_list, parents_list, edge = None, [], [], [], []
    for i in range(steps):
        edge.append(topk_p)
        _, hidden, scores, (s, t, p) = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(s)
        token_list.append(t)
        parents_list.append(p)
        if i < steps - 1:
            topk_p, topk_index = draw(topk)

    ref_parents, ref_index, ref_tokens = organize_draft_results(score_list, token_list, parents_list, num_draft)
    tree = best_first_tree(*lattice_from_steps(parents_list, token_list, edge, topk), num_draft - 1)

    flat_tokens = torch.cat(token_list, dim=1)
    for b in range(batch):
        assert sorted(tree.tokens[b].tolist()) == sorted(ref_tokens[b].tolist())
        # SGLang's parent of candidate c is the candidate its expansion c // k expanded (-1: the root).
        exp_parent = ref_parents[b].long()
        token_parent = {}
        for c in ref_index[b].tolist():
            pc = int(exp_parent[c // topk]) if c >= topk else -1
            token_parent[int(flat_tokens[b, c])] = int(flat_tokens[b, pc]) if pc >= 0 else None
        for i, tok in enumerate(tree.tokens[b].tolist()):
            par = int(tree.parents[b, i])
            assert token_parent[tok] == (None if par < 0 else int(tree.tokens[b, par]))
