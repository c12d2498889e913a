"""One Q-pass step against one exact verify step of a TLV engine (``tlv_q_pass_over_exact_pass``, issue 16).

The Q step is what ``TLVRound.q_pass`` runs L times a round: one token through the target's 8-bit view
(the hi planes alone). The exact step is the round's ``Round.verify`` forward: the root and the combined
tree's N nodes (the trunk, a K-ary tree hanging from its end, the root tree) through the full W12 weights,
with the features an EAGLE-3 drafter reads when there is one. Both run on the engine's own runners and
KV cache at a row parked at ``context`` cached tokens, each captured as one CUDA graph so the time is
the GPU's, not Python's launches (eagerly on the CPU, where the numbers only check the bookkeeping).
"""

from __future__ import annotations

import torch

from tlv import combine_tree
from tree_verify import ancestor_mask

from ..engine.attn_meta import causal_tree


def _kary(n: int, k: int, dev) -> torch.Tensor:
    """Parents of a breadth-first k-ary tree of n nodes (-1: the tree's root children): topological."""
    return torch.div(torch.arange(n, device=dev), k, rounding_mode="floor") - 1


def _block(plan, dev, vocab: int, seed: int = 0):
    """(tokens [1, N + 1], depth [1, N + 1], anc [1, N + 1, N + 1]) of a combined tree of ``plan``'s shape."""
    g = torch.Generator(device=dev).manual_seed(seed)
    L, Nh, Nr, k = plan.chain_len, plan.hang_budget, plan.root_budget, plan.top_k
    chain = torch.randint(0, vocab, (1, L), device=dev, generator=g)
    hang = torch.randint(0, vocab, (1, Nh), device=dev, generator=g)
    root = torch.randint(0, vocab, (1, Nr), device=dev, generator=g) if Nr else None
    root_p = _kary(Nr, k, dev)[None] if Nr else None
    tokens, parents = combine_tree(chain, hang, _kary(Nh, k, dev)[None], root, root_p)
    anc = ancestor_mask(parents, plan.max_depth)
    depth = torch.cat([torch.zeros_like(parents[:, :1]), anc[:, 1:].sum(-1) - 1], 1)
    block = torch.cat([torch.randint(0, vocab, (1, 1), device=dev, generator=g), tokens], 1)
    return block, depth, anc


def step_fns(eng, context: int):
    """-> (q_step, exact_step): callables running one Q step and one exact verify forward of ``eng``
    (a TLV engine) for row 0 parked at ``context`` (their K/V land past it, in slots no request owns)."""
    rnd = eng.round
    dev, V = eng.device, eng.target.cfg.vocab_size
    seq = torch.full((1,), context, dtype=torch.long, device=dev)
    kv_len = context + rnd.shape.reach + 1
    x = torch.randint(0, V, (1, 1), device=dev)
    pos = seq[:, None].clone()
    one = causal_tree(1, dev)[0]
    block, depth, anc = _block(rnd.plan, dev, V)
    positions = seq[:, None] + depth
    slots = seq[:, None] + torch.arange(block.shape[1], device=dev)
    extra = {} if rnd.feature_layers is None else {"feature_layers": rnd.feature_layers}

    def q_step():
        return rnd.q.forward(x, pos, pos, seq, one, kv_len, **extra)

    def exact_step():
        return rnd.target.forward(block, positions, slots, seq, anc, kv_len, **extra)

    return q_step, exact_step


def step_ms(fn, iters: int, cuda: bool) -> list[float]:
    """Per-call milliseconds of ``fn``: CUDA-event times of its graph's replays, or wall times on the CPU."""
    from ..harness.timing import times_ms

    if not cuda:
        return times_ms(fn, iters, cuda=False)
    from ..harness.graphs import graph_replay

    with torch.inference_mode():
        return times_ms(graph_replay(fn), iters, cuda=True)
