"""Greedy acceptance of draft trees in one launch (kernels/tree_accept.py) against accept_greedy_batched and
the round's padded path, in the Triton interpreter on the CPU (natively on a GPU): trees of 1 to 64 nodes,
targets that accept nothing, a whole branch, or tie two equally deep paths, padding nodes (-1) that never
match, and depths that cut or pad the path."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases

from tree_verify import ancestor_mask

A = importlib.import_module("sglang_specpilot.kernels.tree_accept")

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, A, "_accept_kernel")


def _trees(B: int, N: int, seed: int, follow: float):
    """Random topological trees over a 6-token vocabulary (so siblings share tokens and paths tie) and a
    target whose argmax after an entry is one of that entry's children's tokens with probability ``follow``."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.stack(
        [torch.tensor([int(torch.randint(-1, n, (1,), generator=g)) for n in range(N)]) for _ in range(B)]
    )
    tokens = torch.randint(0, 6, (B, N), generator=g)
    target = torch.randint(0, 6, (B, N + 1), generator=g)
    for b in range(B):
        for e in range(N + 1):
            kids = [n for n in range(N) if int(parents[b, n]) == e - 1]
            if kids and float(torch.rand(1, generator=g)) < follow:
                target[b, e] = tokens[b, kids[int(torch.randint(len(kids), (1,), generator=g))]]
    tokens[0, N // 2] = -1  # a padding node (a shared budget's): never accepted
    return [t.to(DEVICE) for t in (parents, tokens, target)]


@kernel_case
@pytest.mark.parametrize("N", [1, 7, 32, 64])
@pytest.mark.parametrize("follow", [0.0, 0.6, 1.0])
def test_kernel_accept_equals_the_reference(N, follow):
    for seed in range(3):
        parents, tokens, target = _trees(4, N, seed=N * 10 + seed, follow=follow)
        anc = ancestor_mask(parents)
        for D in (1, 3, N):
            got, got_path = A.accept_greedy_tree(parents, tokens, target, anc, D)
            want, want_path = A.accept_greedy_tree_ref(parents, tokens, target, anc, D)
            for name in ("last", "accept_length", "path_mask", "path", "bonus"):
                a, b = getattr(got, name), getattr(want, name)
                assert a.dtype == b.dtype and torch.equal(a, b), (name, N, follow, seed, D)
            assert torch.equal(got_path, want_path), (N, follow, seed, D)
    if follow == 1.0 and N > 1:
        assert int(want.accept_length.max()) > 1  # the cases reach deep paths, not only the root


@kernel_case
def test_kernel_accept_takes_the_earliest_of_equally_deep_paths():
    # Two children of the root carry the same token the target wants: both match at depth 1; the earlier
    # entry (node 0, block entry 1) is the accepted one, as in the reference's key.
    parents = torch.tensor([[-1, -1]], device=DEVICE)
    tokens = torch.tensor([[4, 4]], device=DEVICE)
    target = torch.tensor([[4, 9, 8]], device=DEVICE)
    res, path = A.accept_greedy_tree(parents, tokens, target, ancestor_mask(parents), 2)
    assert res.last.tolist() == [1] and res.bonus.tolist() == [9] and path.tolist() == [[0, 1, 1]]
