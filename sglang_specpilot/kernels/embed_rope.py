"""A forward's inputs in one launch (Triton): the token embeddings (an EAGLE-3 drafter's with its features
concatenated after them) and the rope cos/sin rows of the positions, in the model's dtype; the reference is
the eager ops the models run (``embed_rope_ref``).

Why: outside the compiled blocks a forward starts with an embedding gather, the feature cast and concat
(drafter), a gather of the rope table and its cast: four or five small kernels, before every drafter depth
and every verify pass (a tree round of depth 6 runs eight forwards, a chain of 6 seven). Copies and one cast
to the model's dtype (round to nearest), so the results equal the eager ops' bit for bit on the GPU (the
interpreter truncates its casts: a cast to bf16 may differ there in its last bit).
"""

from __future__ import annotations

import torch

from .launch import runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs keep the reference
    triton = None


if triton is not None:

    @triton.jit
    def _embed_rope_kernel(tok_ptr, pos_ptr, emb_ptr, g_ptr, rope_ptr, x_ptr, cs_ptr, N, H, H2, D2,
                           stride_tb, stride_tn, stride_pb, stride_pn,
                           HAS_G: tl.constexpr, BH: tl.constexpr, BG: tl.constexpr, BR: tl.constexpr):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)  # a token of the batch's B * N
        b, n = t // N, t % N
        out_ty = x_ptr.dtype.element_ty
        W = H + H2
        tok = tl.load(tok_ptr + b * stride_tb + n * stride_tn)
        h = tl.arange(0, BH)
        e = tl.load(emb_ptr + tok * H + h, mask=h < H, other=0.0)
        tl.store(x_ptr + t * W + h, e.to(out_ty), mask=h < H)
        if HAS_G:
            c = tl.arange(0, BG)
            g = tl.load(g_ptr + t * H2 + c, mask=c < H2, other=0.0)
            tl.store(x_ptr + t * W + H + c, g.to(out_ty), mask=c < H2)
        pos = tl.load(pos_ptr + b * stride_pb + n * stride_pn)
        r = tl.arange(0, BR)  # cos then sin of the position: 2 * head_dim values
        cs = tl.load(rope_ptr + pos * D2 + r, mask=r < D2, other=0.0)
        tl.store(cs_ptr + t * D2 + r, cs.to(out_ty), mask=r < D2)


def embed_rope_ref(tokens, positions, embed, rope, g=None, dtype=None):
    """The eager ops: (x [B, N, H (+ H2)], cs [B, N, 2, D]) in ``dtype`` (default the embedding's)."""
    dtype = dtype or embed.dtype
    x = torch.nn.functional.embedding(tokens, embed).to(dtype)
    if g is not None:
        x = torch.cat([x, g.to(dtype)], -1)
    return x, rope[positions].to(dtype)


def embed_rope(tokens, positions, embed, rope, g=None, dtype=None):
    """``embed_rope_ref`` in one launch where the kernel runs (a GPU or the interpreter)."""
    dtype = dtype or embed.dtype
    if not runs_on(tokens, _embed_rope_kernel if triton is not None else None) or embed.dtype != dtype:
        return embed_rope_ref(tokens, positions, embed, rope, g, dtype)
    B, N = tokens.shape
    H = embed.shape[1]
    H2 = 0 if g is None else g.shape[-1]
    D2 = rope.shape[1] * rope.shape[2]
    x = torch.empty(B, N, H + H2, dtype=dtype, device=tokens.device)
    cs = torch.empty(B, N, *rope.shape[1:], dtype=dtype, device=tokens.device)
    if B * N:
        gg = x if g is None else g.contiguous()
        _embed_rope_kernel[(B * N,)](
            tokens, positions, embed.contiguous(), gg, rope.contiguous(), x, cs, N, H, H2, D2,
            tokens.stride(0), tokens.stride(1), positions.stride(0), positions.stride(1),
            HAS_G=g is not None, BH=triton.next_power_of_2(H), BG=triton.next_power_of_2(max(H2, 1)),
            BR=triton.next_power_of_2(D2), num_warps=4,
        )  # fmt: skip
    return x, cs
