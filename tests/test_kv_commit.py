"""The accepted-K/V move (kernels/kv_commit.py) against its reference on odd shapes (a slot of fewer values
than a program's block, several blocks, overlapping sources and targets, rows padded past their accepted
length), in the Triton interpreter on the CPU (natively on the GPU), and the engine's tree rounds with it."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import kernel_cases

K = importlib.import_module("sglang_specpilot.kernels.kv_commit")
INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, K, "_kv_commit_kernel")


def _case(L, B, S, H, D, A, seed=0):
    """A storage [L, 2, B + 1, S, H, D] (one row past the batch, which must stay untouched), prefix lengths,
    increasing paths with path[t] >= t padded past each row's accepted length by repeating its last entry,
    and the accepted lengths."""
    g = torch.Generator().manual_seed(seed)
    storage = torch.randn(L, 2, B + 1, S, H, D, generator=g).to(torch.bfloat16).to(DEVICE)
    seq = torch.randint(0, S - 2 * A, (B,), generator=g)
    n = torch.randint(0, A, (B,), generator=g)
    paths = []
    for b in range(B):
        nodes = sorted(torch.randperm(2 * A - 1, generator=g)[: int(n[b])].add(1).tolist())
        row = [0] + nodes
        paths.append(row + [row[-1]] * (A - len(row)))
    path = torch.tensor(paths)  # sorted distinct nodes from 1: path[t] >= t
    return storage, seq.to(DEVICE), path.to(DEVICE), n.to(DEVICE)


@kernel_case
@pytest.mark.parametrize("L,B,S,H,D,A", [(3, 5, 40, 3, 16, 4), (2, 3, 30, 8, 128, 7), (1, 1, 20, 2, 64, 2)])
def test_kernel_kv_commit_matches_the_reference_where_anything_reads(L, B, S, H, D, A):
    storage, seq, path, n = _case(L, B, S, H, D, A, seed=L + A)
    want = storage.clone()
    K.kv_commit_ref(want, seq, path)
    got = storage.clone()
    K.kv_commit(got, seq, path, n)
    for b in range(B):
        keep = int(seq[b]) + int(n[b]) + 1  # the prefix, the root and the accepted nodes: what is read later
        assert torch.equal(got[:, :, b, :keep], want[:, :, b, :keep])
        assert torch.equal(got[:, :, b, keep:], storage[:, :, b, keep:])  # padding entries are not moved
    assert torch.equal(got[:, :, B], storage[:, :, B])  # rows past the batch untouched
    everything = storage.clone()
    K.kv_commit(everything, seq, path)  # without lengths: every entry, as the reference
    assert torch.equal(everything, want)


@kernel_case
def test_kernel_overlapping_sources_and_targets():
    # Node 2 moves to slot 1 while node 3 (to slot 2) and node 5 (to slot 3) still wait to be read.
    storage = torch.arange(1 * 2 * 1 * 8 * 1 * 16, dtype=torch.float32).reshape(1, 2, 1, 8, 1, 16).to(DEVICE)
    seq, path, n = torch.tensor([1]), torch.tensor([[0, 2, 3, 5]]), torch.tensor([3])
    want = storage.clone()
    K.kv_commit_ref(want, seq.to(DEVICE), path.to(DEVICE))
    got = storage.clone()
    K.kv_commit(got, seq.to(DEVICE), path.to(DEVICE), n.to(DEVICE))
    assert torch.equal(got, want)
    assert torch.equal(got[0, 0, 0, 2], storage[0, 0, 0, 3]) and torch.equal(got[0, 1, 0, 4], storage[0, 1, 0, 6])


def test_tree_rounds_with_the_reference_commit_equal_the_kernel_commit(monkeypatch):
    """Greedy tree output does not depend on which commit ran (the kernel's skipped entries are never read)."""
    from helpers import WordTokenizer, prompts, tiny_model

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams, kv_cache

    target = tiny_model("tiny-llama")
    ps = prompts([5, 11, 3, 8], target.cfg.vocab_size, seed=7)
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True)
    opts = dict(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4, tree_budget=10, tree_depth=4)
    opts |= dict(tree_top_k=3)

    def run():
        eng = Engine(target, WordTokenizer(), EngineOptions(**opts), target.truncated(1))
        return [r.token_ids for r in eng.generate(ps, sp)], eng.batch.round_tokens > eng.batch.rounds

    moved = []
    real = kv_cache.kv_commit
    monkeypatch.setattr(kv_cache, "kv_commit", lambda *a: (moved.append(1), real(*a))[1])
    with_kernel, accepted = run()
    assert moved and accepted  # the tree rounds took the lengths-aware commit, and drafts were accepted
    monkeypatch.setattr(kv_cache.launch, "ROUND_KERNELS", False)
    assert run()[0] == with_kernel
