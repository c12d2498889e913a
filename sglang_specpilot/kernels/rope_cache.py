"""Rope and the K/V cache write of one attention layer's new tokens in one launch (Triton), and its reference.

Why: between the qkv projection and attention a decode step ran three small kernels a layer under
torch.compile (rope of q; rope of k with the cache write; the v write), ~1 us each plus the gaps between
them (round_profile_h200.json, 57541d1: 1.41 + 1.06 + 0.90 us a layer of the lifted 8B's AR round, in a
step of ~390 kernels for SmolLM2's 30 layers). This kernel reads the fused projection's output once and
writes q (roped, contiguous, for ``tree_attention``), and k (roped) and v into their cache slots.

Rope is the rotate-half layout of ``models/rope.apply_rope``: ``x * cos + rotate_half(x) * sin`` with cos
and sin already in x's dtype, computed in fp32 and rounded once, as inductor's fused kernel of it does.

The grid: one program per (token, head) over the q heads, then the k heads, then the v heads, each moving
one head's ``head_dim`` values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _rope_cache_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    N,
    stride_xb,
    stride_xn,
    stride_cb,
    stride_cn,
    stride_sb,
    stride_sn,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    tok = tl.program_id(0)  # b * N + n
    head = tl.program_id(1)  # q heads, then k heads, then v heads
    b = (tok // N).to(tl.int64)
    n = tok % N
    dims = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    row = qkv_ptr + b * stride_xb + n * stride_xn
    src = row + head * HEAD_DIM
    if head < NUM_HEADS + NUM_KV:
        x = tl.load(src + dims).to(tl.float32)
        # rotate_half: [-x[half:], x[:half]]
        partner = tl.load(src + (dims + half) % HEAD_DIM).to(tl.float32)
        rot = tl.where(dims < half, -partner, partner)
        c = b * stride_cb + n * stride_cn + dims
        cos = tl.load(cos_ptr + c).to(tl.float32)
        sin = tl.load(sin_ptr + c).to(tl.float32)
        out = x * cos + rot * sin
        if head < NUM_HEADS:
            tl.store(q_ptr + (tok * NUM_HEADS + head) * HEAD_DIM + dims, out.to(q_ptr.dtype.element_ty))
        else:
            slot = tl.load(slots_ptr + b * stride_sb + n * stride_sn)
            dst = k_ptr + b * stride_kb + slot * stride_ks + (head - NUM_HEADS) * stride_kh
            tl.store(dst + dims, out.to(k_ptr.dtype.element_ty))
    else:
        slot = tl.load(slots_ptr + b * stride_sb + n * stride_sn)
        dst = v_ptr + b * stride_vb + slot * stride_vs + (head - NUM_HEADS - NUM_KV) * stride_vh
        tl.store(dst + dims, tl.load(src + dims))


INTERPRETED = isinstance(_rope_cache_kernel, InterpretedFunction)


# An opaque custom op that declares its cache writes: torch.compile then mutates the caches in place. (A
# wrap_triton launch inside the compiled block measured worse than the three kernels it replaced: inductor
# cloned both caches before the kernel and copied them back after the block, 4.2 + 3.4 us a layer of the
# lifted 8B, round_profile on the H200 at 3ba6857.)
@torch.library.custom_op("specpilot::rope_cache_write", mutates_args=("k_cache", "v_cache"))
def _rope_cache_op(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    B, N, _ = qkv.shape
    q = torch.empty((B, N, num_heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    _rope_cache_kernel[(B * N, num_heads + 2 * num_kv_heads)](
        qkv,
        cos,
        sin,
        slots,
        q,
        k_cache,
        v_cache,
        N,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0),
        cos.stride(1),
        slots.stride(0),
        slots.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_HEADS=num_heads,
        NUM_KV=num_kv_heads,
        HEAD_DIM=head_dim,
        num_warps=1,
    )
    return q


@_rope_cache_op.register_fake
def _(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim):
    B, N, _ = qkv.shape
    return qkv.new_empty((B, N, num_heads, head_dim))


def rope_cache_write(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Rope q and k of the fused projection's output and write k and v into the caches.

    Parameters
    ----------
    qkv : [B, N, (num_heads + 2 * num_kv_heads) * head_dim], q then k then v columns (``Attention.wqkv``)
    cos, sin : [B, N, 1, head_dim] in qkv's dtype (views of one table are fine: only their B and N strides
        are used, and they must be the same)
    k_cache, v_cache : [B_max, S, num_kv_heads, head_dim]; request b's token n goes to slot ``slots[b, n]``
    slots : [B, N] integer

    Returns q [B, N, num_heads, head_dim], roped, contiguous. Runs on the GPU or in the Triton interpreter.
    """
    B, N, width = qkv.shape
    if width != (num_heads + 2 * num_kv_heads) * head_dim or qkv.stride(-1) != 1:
        raise ValueError(f"qkv {tuple(qkv.shape)} is not {num_heads} + 2 x {num_kv_heads} heads of {head_dim}")
    for t in (cos, sin):
        if t.shape != (B, N, 1, head_dim) or t.stride(-1) != 1 or t.dtype != qkv.dtype:
            raise ValueError(f"cos/sin {tuple(t.shape)} {t.dtype}: expected ({B}, {N}, 1, {head_dim}) {qkv.dtype}")
    if cos.stride()[:2] != sin.stride()[:2]:
        raise ValueError("cos and sin must share their B and N strides")
    if slots.shape != (B, N) or k_cache.shape[2:] != (num_kv_heads, head_dim) or k_cache.stride(-1) != 1:
        raise ValueError("slots must be [B, N] and the caches [B_max, S, num_kv_heads, head_dim]")
    if v_cache.shape != k_cache.shape or v_cache.stride(-1) != 1:
        raise ValueError("v_cache must match k_cache")
    return _rope_cache_op(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim)


def rope_cache_write_ref(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim) -> torch.Tensor:
    """The reference: rope in fp32 rounded once, then the two cache writes, as ``Attention.core`` does."""
    B, N, _ = qkv.shape
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = cos.float(), sin.float()

    def rope(x):
        x = x.float()
        half = head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    q = rope(q.reshape(B, N, num_heads, head_dim)).to(qkv.dtype)
    k = rope(k.reshape(B, N, num_kv_heads, head_dim)).to(qkv.dtype)
    batch_idx = torch.arange(B, device=qkv.device)[:, None]
    k_cache[batch_idx, slots] = k
    v_cache[batch_idx, slots] = v.reshape(B, N, num_kv_heads, head_dim)
    return q
