"""Verify-with-tree-mask followed by commit equals recomputing the accepted sequence from scratch."""

import torch
from helpers import tiny_model

from sglang_specpilot.engine.attn_meta import build_step_meta, causal_tree
from sglang_specpilot.engine.runner import ModelRunner

PARENTS = [-1, 0, 0, 1, 2, 3, 1]  # a small tree in topological order


def ancestors(parents):
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, p in enumerate(parents):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    return anc, depth


def test_mask_matches_brute_force():
    anc, depth = ancestors(PARENTS)
    seq_len = torch.tensor([0, 5, 3])
    meta = build_step_meta(seq_len, anc, depth, kv_len=16, group=2)
    N = len(PARENTS)
    for b, L in enumerate(seq_len.tolist()):
        for i in range(N):
            assert meta.positions[b, i] == L + depth[i]
            assert meta.slots[b, i] == L + i
            for g in range(2):
                for j in range(16):
                    want = j < L or (L <= j < L + N and bool(anc[i, j - L]))
                    assert bool(meta.mask[b, 0, i * 2 + g, j]) == want


def test_tree_verify_commit_equals_recompute():
    torch.manual_seed(0)
    model = tiny_model("tiny-llama", dtype=torch.float64)
    V = model.cfg.vocab_size
    prefix_lens = [11, 6]
    paths = [[0, 2, 4], [0, 1, 3, 5]]
    prefix = torch.randint(2, V, (2, 11))
    tree_tokens = torch.randint(2, V, (2, len(PARENTS)))
    anc, depth = ancestors(PARENTS)

    runner = ModelRunner(model, max_batch=2, max_seq=64, cuda_graphs=False)
    lens = torch.tensor(prefix_lens)
    # Right-padded batch prefill: row 1's slots 6..10 hold padding, which lies past its length.
    a, d = causal_tree(11)
    runner.step(prefix, torch.tensor([0, 0]), a, d)
    tree_logits = runner.step(tree_tokens, lens, anc, depth)
    A = max(len(p) for p in paths)
    path_t = torch.tensor([p + [p[-1]] * (A - len(p)) for p in paths])
    runner.kv.commit(lens, path_t)

    for b, (L, path) in enumerate(zip(prefix_lens, paths, strict=False)):
        seq = torch.cat([prefix[b, :L], tree_tokens[b, path]])[None]
        ref = ModelRunner(model, max_batch=1, max_seq=64, cuda_graphs=False)
        a, d = causal_tree(seq.shape[1])
        ref_logits = ref.step(seq, torch.tensor([0]), a, d)[0]
        n = L + len(path)
        for (k, v), (rk, rv) in zip(runner.kv.layers, ref.kv.layers, strict=False):
            torch.testing.assert_close(k[b, :n], rk[0, :n], rtol=0, atol=1e-12)
            torch.testing.assert_close(v[b, :n], rv[0, :n], rtol=0, atol=1e-12)
        torch.testing.assert_close(tree_logits[b, path], ref_logits[L:], rtol=0, atol=1e-10)

    # And the next decode step after the commit sees exactly the accepted sequence.
    nxt = torch.randint(2, V, (2, 1))
    new_len = torch.tensor([L + len(p) for L, p in zip(prefix_lens, paths, strict=False)])
    a1, d1 = causal_tree(1)
    step_logits = runner.step(nxt, new_len, a1, d1)
    for b, (L, path) in enumerate(zip(prefix_lens, paths, strict=False)):
        seq = torch.cat([prefix[b, :L], tree_tokens[b, path], nxt[b]])[None]
        ref = ModelRunner(model, max_batch=1, max_seq=64, cuda_graphs=False)
        a, d = causal_tree(seq.shape[1])
        torch.testing.assert_close(step_logits[b, 0], ref.step(seq, torch.tensor([0]), a, d)[0, -1], rtol=0, atol=1e-10)


def test_fused_attention_path_equals_sdpa():
    # On the CPU the fused path runs the kernel's PyTorch reference (or the kernel under TRITON_INTERPRET=1);
    # both compute in float32, so the two paths agree to float32 rounding, not bit for bit.
    model = tiny_model("tiny-qwen3", dtype=torch.float32)
    anc, depth = ancestors(PARENTS)
    toks = torch.randint(2, model.cfg.vocab_size, (2, len(PARENTS)))
    outs = []
    for fused in (False, True):
        r = ModelRunner(model, max_batch=2, max_seq=64, cuda_graphs=False)
        a, d = causal_tree(9)
        r.step(torch.randint(2, 300, (2, 9), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 0]), a, d)
        outs.append(r._forward(toks, torch.tensor([9, 4]), anc, depth, 64, fused_attention=fused))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
