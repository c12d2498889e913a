"""One decoder pass over several groups of tokens that read every weight once (prompt admission).

A round's verify block is [B, N + 1] tokens; a prompt that arrives meanwhile needs a prefill chunk of
[B', P] tokens. Run apart, the two passes stream the target's weights twice. Here the projections and
the MLP (everything that reads weights) run once on the groups' tokens concatenated, and only attention,
which reads each group's own cache rows, runs per group, the way mixed prefill/decode batches pack tokens.
Per token the arithmetic is ``Transformer.forward``'s (``Block.forward``: h = x + attn(norm(x)), then
h + mlp(norm(h))); only the GEMMs' row count differs, and the norms run as one launch each where
``eager_norm`` has its kernel (the same two roundings, the mean's sum in another order): this pass runs
eagerly or inside a graph captured from eager code, where a norm was eight kernels: 65 norms, ~520 of the
~1,500 kernels of a packed 8B prefill (H100, admit_profile.json). Not yet timed on a GPU.

A group names its cache rows either as a range (its rows' views of the cache; attention over prefix and
block as ``Attention.core``) or as a tensor of row indices, packed: then the group is a prompt's first
chunk, which sees only its own tokens, so attention is causal over the chunk's own K/V (no cache read) and
the K/V are scattered into those rows. Packing lets a prefill carry only the prompts that need it, not
every row of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .llama import Transformer, eager_norm


@dataclass
class Group:
    """One group of a mixed pass: ``tokens`` [B, N] in cache rows ``rows[0] .. rows[1] - 1``, or in the rows
    a [B] int64 tensor ``rows`` lists (a packed first chunk: see the module docstring).

    positions, slots : [B, N]; mask : [B, 1, N * G, S] bool or None (the fused kernel, which needs
    ``seq_len`` [B] and ``anc``); logit_rows : [B, R] or None (all N); feature_layers : layer indices
    whose outputs are also returned for this group (an EAGLE-3 drafter reads them), or None.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor | None
    rows: tuple[int, int] | torch.Tensor
    seq_len: torch.Tensor | None = None
    anc: torch.Tensor | None = None
    logit_rows: torch.Tensor | None = None
    feature_layers: tuple[int, ...] | None = None


def mixed_forward(model: Transformer, groups: list[Group], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> list:
    """Run every group through the decoder in one pass; per group its logits [B, N or R, V], or the pair
    (logits, features [B, N, len(feature_layers) * hidden]) where the group asks for features."""
    shapes = [g.tokens.shape for g in groups]
    sizes = [b * n for b, n in shapes]
    x = torch.cat([model.embed(g.tokens).flatten(0, 1) for g in groups])  # [sum B N, hidden]
    rope = []
    for g in groups:
        cs = model.rope[g.positions].to(x.dtype)
        rope.append((cs[:, :, 0, None], cs[:, :, 1, None]))
    idx = [torch.arange(b, device=x.device)[:, None] for b, _ in shapes]
    feats: list[list[torch.Tensor]] = [[] for _ in groups]
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, kv, strict=True)):
        attn = layer.attn
        qkv = attn.wqkv(eager_norm(layer.attn_norm, x)).split(sizes)
        outs = []
        for g, (b, n), part, (cos, sin), bi in zip(groups, shapes, qkv, rope, idx, strict=True):
            if isinstance(g.rows, torch.Tensor):
                o = _first_chunk_attention(attn, part.view(b, n, -1), cos, sin, k_cache, v_cache, g.rows, g.slots)
            else:
                lo, hi = g.rows
                # The group's rows of the cache as views, so its K/V writes land in the shared cache.
                kc, vc = k_cache[lo:hi], v_cache[lo:hi]
                o = attn.core(part.view(b, n, -1), cos, sin, kc, vc, bi, g.slots, g.mask, g.seq_len, g.anc)
            outs.append(o.flatten(0, 1))
        x = x + attn.wo(torch.cat(outs))
        x = x + layer.mlp(eager_norm(layer.mlp_norm, x))
        for j, g in enumerate(groups):
            if g.feature_layers is not None and i in g.feature_layers:
                feats[j].append(x)
    results = []
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    for j, (g, (b, n)) in enumerate(zip(groups, shapes, strict=True)):
        h = x[offsets[j] : offsets[j + 1]].view(b, n, -1)
        if g.logit_rows is not None:
            h = h.gather(1, g.logit_rows[..., None].expand(-1, -1, h.shape[-1]))
        logits = model.lm_head(eager_norm(model.norm, h))
        if g.feature_layers is None:
            results.append(logits)
        else:
            f = torch.cat([t[offsets[j] : offsets[j + 1]] for t in feats[j]], -1).view(b, n, -1)
            results.append((logits, f))
    return results


def _first_chunk_attention(attn, qkv, cos, sin, k_cache, v_cache, rows, slots) -> torch.Tensor:
    """``Attention.core`` for a prompt's first chunk in cache rows ``rows`` [B]: the same projections' split,
    norms and rope, K/V written at ``slots``, then causal attention over the chunk itself -> [B, N, q_size]."""
    cfg = attn.cfg
    B, N, _ = qkv.shape
    q, k, v = attn.split_heads(qkv, cos, sin)
    k_cache[rows[:, None], slots] = k
    v_cache[rows[:, None], slots] = v
    # GQA inside SDPA (torch >= 2.5) instead of repeat_interleave: two fewer copies of the chunk's K/V per
    # layer, the same arithmetic per head (tests/test_packed_prefill compares it with the padded prefill).
    kh, vh = k.transpose(1, 2), v.transpose(1, 2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, is_causal=True, enable_gqa=kh.shape[1] != q.shape[2])
    return o.transpose(1, 2).reshape(B, N, cfg.q_size)
