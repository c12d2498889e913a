"""Draft-model tree expansion (EAGLE-2-like): one draft forward per depth over the frontier.

Per request, with ``seq_len`` tokens in the target cache and ``next_tok`` the last emitted token (the
tree's root, not yet in any cache), and the draft cache valid for slots ``0 .. seq_len - 2``:

    depth 0   [tok[seq_len-1], next_tok] at slots/positions seq_len-1, seq_len -> the root's top_k children
    depth d   the top_k candidates of depth d by path score (sum of draft log-probs), fed together: expansion
              e sits at draft slot seq_len + e and position seq_len + d, and sees the prefix, the root and
              its own ancestors (a tree mask over the expansion slots) -> top_k children each

Expansion 0 is the root, expansions 1 .. top_k expand depth 1, and so on: E = 1 + (depth - 1) * top_k
draft slots past the prefix, all scratch until the round's acceptance. Every row expands the same number
of nodes, so the batch needs no packing. The result is a ``tree_verify.Lattice`` (numbering: child j of
expansion e is candidate e * top_k + j) and, per candidate, the expansion that expanded it (-1 if none):
after acceptance the accepted nodes' draft K/V are moved into place (``commit_draft``), since every
accepted node except the last was expanded and its K/V already saw exactly its accepted ancestors.
"""

from __future__ import annotations

import functools

import torch

from tree_verify import Lattice

from ..kernels import launch
from ..kernels.lattice_step import lattice_children, lattice_children_ref, lattice_select, lattice_select_ref
from .attn_meta import causal_tree
from .runner import ModelRunner

try:  # Triton is optional on CPU-only installs: then the draft picks stay torch ops.
    from ..kernels.greedy import greedy_pick
    from ..kernels.topk_logprobs import topk_logprobs
except ImportError:  # pragma: no cover - exercised only where triton is missing
    greedy_pick = topk_logprobs = None


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    # At least float32 (bf16 log-probs would tie too often); float64 models keep float64.
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)


def _top_children(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, tokens) of each row's k best children. On CUDA one two-launch kernel
    (kernels/topk_logprobs.py) where PyTorch ran a cast, a softmax and a four-pass radix top-k: ~35 us a
    depth of SmolLM2's tree round on the H200. Ties go to the smaller token id there; torch.topk leaves them
    unspecified (the tree may differ at a tie, the verified output does not)."""
    if topk_logprobs is not None and logits.is_cuda and logits.dtype != torch.float64 and k <= 64:
        return topk_logprobs(logits, k)
    return _logprobs(logits).topk(k, dim=-1)


def _argmax(logits: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """``logits.argmax(-1)``; on CUDA the chunked greedy pick (kernels/greedy.py), since PyTorch's argmax of one
    row leaves most of the GPU idle (10 us a depth over SmolLM2's 49,152 logits in the chain round on the
    H200). Ties go to the smaller index either way."""
    if greedy_pick is not None and logits.is_cuda:
        tok = greedy_pick(logits)[0]
        return tok.unsqueeze(-1) if keepdim else tok
    return logits.argmax(-1, keepdim=keepdim)


def expand_lattice(
    runner: ModelRunner,
    history: torch.Tensor,
    seq_len: torch.Tensor,
    next_tok: torch.Tensor,
    depth: int,
    top_k: int,
    kv_len: int | None = None,
    sample=None,
    features: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[Lattice, torch.Tensor, torch.Tensor | None]:
    """Grow the draft lattice of B requests (tensor ops only: capturable in a CUDA graph).

    ``kv_len`` (>= max(seq_len) + E) bounds the slots dense-mask (CPU) attention reads. ``sample``
    (chains only, top_k 1): a function logits -> (probs [B, V], tokens [B]) that draws each draft
    token from the drafter's distribution instead of taking its argmax (speculative sampling).

    Returns
    -------
    lattice : batched Lattice, parents [B, E], tokens / logprobs [B, E, top_k]
    expanded_by : [B, E * top_k] int64, the expansion index that expanded each candidate, -1 if none
    qs : [B, depth, V] draft distributions of the sampled chain, or None
    """
    B = seq_len.shape[0]
    dev = seq_len.device
    k = top_k
    if sample is not None and k != 1:
        raise ValueError("sampled drafting draws one token per depth (top_k 1)")
    E = 1 + (depth - 1) * k
    logits, h_root, head, d2t = _draft_root(runner, history, seq_len, next_tok, kv_len, features, sample is not None)
    hidden = None if h_root is None else h_root[:, None]  # [B, expansions so far, H]: each one's output
    qs = []

    def children(logits):
        if sample is None and k == 1:
            # A chain needs no scores (nothing is selected among candidates): the argmax alone spares a
            # log-softmax over the vocabulary and a radix top-k (about 5 kernels a depth).
            tok = _argmax(logits, keepdim=True)
            return torch.zeros(tok.shape, device=dev), tok
        if sample is None:
            return _top_children(logits, k)
        q, tok = sample(logits.reshape(B, -1))  # top_k 1: one distribution per row
        qs.append(q)
        shape = logits.shape[:-1] + (1,)
        return torch.zeros(shape, device=dev), tok.view(shape)

    # The lattice in buffers the depths fill in place (candidate c = e * k + j is child j of expansion e).
    C = E * k
    lp, tok = children(logits)
    scores = torch.empty(B, C, dtype=lp.dtype, device=dev)
    logprobs = torch.empty(B, C, dtype=lp.dtype, device=dev)
    tokens = torch.empty(B, C, dtype=torch.long, device=dev)
    select, write = (
        (lattice_select, lattice_children) if launch.ROUND_KERNELS else (lattice_select_ref, lattice_children_ref)
    )
    write(scores, logprobs, tokens, torch.zeros_like(lp[:, :1]), lp[:, None], tok[:, None], d2t, 0)
    parents = torch.full((B, E), -1, dtype=torch.long, device=dev)
    # vis[b, e, e'] = expansion e' is e or one of its ancestors (slot seq_len + e' is visible to e).
    vis = torch.zeros(B, E, E, dtype=torch.bool, device=dev)
    vis[:, 0, 0] = True
    expanded_by = torch.full((B, C), -1, dtype=torch.long, device=dev)
    if hidden is not None:
        hidden = torch.cat([hidden, hidden.new_zeros(B, E - 1, hidden.shape[-1])], 1)  # [B, E, H]
    for d in range(1, depth):
        e0 = 1 + (d - 1) * k  # this depth's expansions e0 .. e0 + k - 1
        sel = select(scores, tokens, parents, vis, expanded_by, seq_len, d, k)
        mask = vis[:, e0 : e0 + k].contiguous()
        if hidden is None:
            logits = runner.forward(sel.x, sel.pos, sel.slots, seq_len, mask, kv_len)
        else:
            g = hidden.gather(1, sel.parent_exp[:, :, None].expand(B, k, hidden.shape[-1]))
            h = runner.forward(sel.x, sel.pos, sel.slots, seq_len, mask, kv_len, g=g)
            hidden[:, e0 : e0 + k] = h
            logits = head(h)
        lp, tok = children(logits)  # [B, k, k]
        # Path scores: parent score + edge, the order candidate_scores adds in, so the numbers are the same.
        write(scores, logprobs, tokens, sel.base, lp, tok, d2t, e0 * k)
    # Every child of a depth-d expansion has depth d + 1 (the root's children depth 1).
    depths = _child_depths(depth, k, str(dev)).expand(B, -1)
    lattice = Lattice(parents, tokens.view(B, E, k), logprobs.view(B, E, k), check=False, scores=scores, depths=depths)
    return lattice, expanded_by, (torch.stack(qs, 1) if qs else None)


def draft_chain(
    runner: ModelRunner,
    history: torch.Tensor,
    seq_len: torch.Tensor,
    next_tok: torch.Tensor,
    depth: int,
    kv_len: int | None = None,
    features: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """A greedy chain's draft tokens [B, depth]: ``expand_lattice`` at top_k 1, without the lattice.

    The same forwards with the same inputs, so the same tokens: the root step, then depth d's one node at
    slot and position seq_len + d seeing the prefix and nodes 0 .. d (row d of a causal mask over the
    ``depth`` expansion slots, shared by every row), fed the previous depth's argmax (and, for an EAGLE-3
    drafter, the previous depth's hidden state). What it leaves out is the lattice's bookkeeping, which a
    chain never reads: scores, a sort over one candidate, the visibility and expansion tables. On the H200
    that bookkeeping was about 30 small kernels (~45 us) a depth of the lifted 8B's chain round
    (round_profile_h200.json, 57541d1).
    """
    logits, h, head, d2t = _draft_root(runner, history, seq_len, next_tok, kv_len, features, False)
    h = None if h is None else h[:, None]  # [B, 1, H]
    tok = _argmax(logits, keepdim=True)  # [B, 1]
    if d2t is not None:
        tok = d2t[tok]
    tokens = [tok]
    vis = _tril(depth, str(seq_len.device))  # expansion e sees expansions 0 .. e (a chain's ancestors)
    for d in range(1, depth):
        pos = (seq_len + d)[:, None]
        if h is None:
            logits = runner.forward(tok, pos, pos, seq_len, vis[d : d + 1], kv_len)
        else:
            h = runner.forward(tok, pos, pos, seq_len, vis[d : d + 1], kv_len, g=h)
            logits = head(h)
        tok = _argmax(logits)  # [B, 1]
        if d2t is not None:
            tok = d2t[tok]
        tokens.append(tok)
    return torch.cat(tokens, 1)


def _draft_root(runner, history, seq_len, next_tok, kv_len, features, sampled: bool):
    """The depth-0 draft step of ``expand_lattice`` and ``draft_chain``: (root logits [B, V'], the EAGLE-3
    root hidden state [B, H] or None, the head that scores later depths or None, the draft-to-target id
    map or None). A plain drafter runs [tok[seq_len-1], next_tok] at slots seq_len-1, seq_len."""
    if features is None:
        ar2 = torch.arange(2, device=seq_len.device)
        prev = history.gather(1, (seq_len - 1)[:, None])
        pos0 = (seq_len - 1)[:, None] + ar2
        logits = runner.forward(
            torch.cat([prev, next_tok[:, None]], 1), pos0, pos0, seq_len - 1, _tril(2, str(seq_len.device)), kv_len
        )[:, -1]
        return logits, None, None, None
    drafter = runner.model
    h_root = _eagle_root(runner, history, seq_len, next_tok, *features, kv_len)
    # Greedy drafting ranks the draft vocabulary itself and maps the winners' ids (d2t): an argmax or top-k
    # over the target's whole vocabulary cost 13.5 us a depth on the H200 for SmolLM2's 49,152. Sampling
    # needs the distribution over target ids.
    head = drafter.target_logits if sampled else drafter.logits
    d2t = drafter.d2t if not sampled and drafter.spec.draft_vocab != drafter.spec.target_vocab else None
    return head(h_root), h_root, head, d2t


def _eagle_root(runner, history, seq_len, next_tok, feats, n_prev, kv_len) -> torch.Tensor:
    """The EAGLE-3 depth-0 step: the drafter's hidden state at the root [B, H].

    The last round accepted n = ``n_prev`` tokens a_1 .. a_n and emitted the root (``next_tok``) after
    them: with s = ``seq_len``, they sit at positions s - n .. s - 1 and s. The drafter re-runs those
    n + 1 tokens with the target features the verify pass computed one position earlier (``feats[:, t]``
    for window entry t), writing true-feature K/V at their slots. The window is a fixed depth + 1 wide
    (a static shape); entries past n are padding whose writes land past s, in slots this round's deeper
    expansions overwrite before anything reads them. Entry n is the root, whose output expands the tree.
    """
    drafter = runner.model
    B, W = feats.shape[:2]
    toks, idx, start = _eagle_window(history, seq_len, next_tok, n_prev, W)
    anc = _tril(W, str(seq_len.device))
    h = runner.forward(toks, idx, idx, start, anc, kv_len, g=drafter.project(feats))
    return h.gather(1, n_prev[:, None, None].expand(B, 1, h.shape[-1]))[:, 0]


def eagle_root_kv(runner, history, seq_len, next_tok, feats, n_prev) -> None:
    """``_eagle_root``'s cache writes alone (the drafter's K/V of the window), for a round that does not
    expand the tree: an AR round keeping the drafter current (``keepup_round``)."""
    toks, idx, _ = _eagle_window(history, seq_len, next_tok, n_prev, feats.shape[1])
    runner.model.write_kv(toks, idx, idx, runner.kv.layers, g=runner.model.project(feats))


def _eagle_window(history, seq_len, next_tok, n_prev, W: int):
    """(tokens, slots, start) of the EAGLE-3 root window: the last round's n accepted tokens, then the
    root, then padding, W wide (see ``_eagle_root``)."""
    t = torch.arange(W, device=seq_len.device)
    start = seq_len - n_prev  # slot of window entry 0
    idx = (start[:, None] + t).clamp(max=history.shape[1] - 1)
    toks = torch.where(t == n_prev[:, None], next_tok[:, None], history.gather(1, idx))
    return toks, idx, start


@functools.cache
def _child_depths(depth: int, k: int, dev: str) -> torch.Tensor:
    # [E * k]: the depth of each lattice candidate (child of expansion e), a constant per (depth, top_k).
    e = torch.arange(1 + (depth - 1) * k, device=dev)
    return (torch.where(e == 0, 0, (e - 1) // k + 1) + 1).repeat_interleave(k)


@functools.cache
def _tril(n: int, dev: str) -> torch.Tensor:
    # A depth-0 draft step's causal [n, n] mask, one per (n, device): a constant the captured round reads.
    return causal_tree(n, dev)[0]


def commit_draft(
    runner: ModelRunner,
    seq_len: torch.Tensor,
    candidates: torch.Tensor,
    expanded_by: torch.Tensor,
    path: torch.Tensor,
) -> None:
    """Move the draft K/V of the accepted nodes into place after the root.

    candidates : [B, N] lattice candidate of each tree node; expanded_by : [B, C] (``expand_lattice``);
    path : [B, A] accepted block indices from the root, padded by repeating the last one. Afterwards the
    draft cache holds [.., root, a_1, .., a_{n-1}] at slots seq_len .. seq_len + n - 1 (a_n, the last
    accepted node, is fed again at the start of the next round).
    """
    node = (path[:, 1:] - 1).clamp(min=0)
    exp = expanded_by.gather(1, candidates.gather(1, node))
    # Non-expanded entries (the last accepted node, padding) point at the root: they land past the
    # sequence end, where nothing reads them.
    exp = torch.where(exp < 0, 0, exp)
    draft_path = torch.cat([torch.zeros_like(exp[:, :1]), exp[:, :-1]], 1)
    runner.kv.commit(seq_len, draft_path)
