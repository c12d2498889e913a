"""Rope and the K/V cache write of one attention layer's new tokens in one launch (Triton), and its reference.

Why: between the qkv projection and attention a decode step ran three small kernels a layer under
torch.compile (rope of q with the zero fill of the attention's merge tickets; rope of k with its cache write;
the v write): 1.08 + 0.99 + 0.79 us a layer of SmolLM2's AR round on the H200 plus two gaps
(rounds_h200.json at 6e058fb, smollm2.ar.round's profile), in a round of 325 kernels for 30 layers. This
kernel reads the fused projection's output once and writes q (roped, contiguous, for ``tree_attention``),
k (roped) and v into their cache slots, and zeroes the attention's ticket counters (``tree_attention``'s
in-kernel merge), which under torch.compile must be a fresh zeroed buffer each call.

Rope is the rotate-half layout of ``models/rope.apply_rope``: ``x * cos + rotate_half(x) * sin`` with cos
and sin already in x's dtype, computed in fp32 and rounded once, as inductor's fused kernel of it does.

The grid: one program per (token, block of ``heads_per_program`` heads) over the q heads, then the k heads,
then the v heads (a block may straddle them: each head's destination is chosen per head); program (0, 0)
also zeroes the tickets.

The op does not declare its cache writes (``mutates_args=()``). Declared, torch.compile functionalizes
them, and since a layer's K and V caches are two views of one tensor (``engine/kv_cache.py``), two
aliased inputs of the compiled block, it cloned both caches around the op and copied them back: 4.1 + 3.5
us a layer of the lifted 8B on the H200 (9dcbe26), more than the kernel saves; a wrap_triton launch did the
same. Undeclared is safe here because the caches' only reader in the block is ``tree_attention``, which
takes this op's q and so runs after it in any order the compiler picks, and no caller reads the caches it
passed in afterwards expecting the old values (the tests compare the compiled block with eager code and
with the unfused path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import interpreted
from .pdl import uses_pdl


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
    tickets_ptr,
    num_tickets,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS: tl.constexpr,
    TICKET_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # USE_PDL (kernels/pdl.py): everything this kernel reads was written by the step's earlier kernels, so
    # it waits first; it lets the next kernel (the attention) launch at once.
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    tok = tl.program_id(0)  # b * N + n
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)  # q heads, then k heads, then v heads
    b = (tok // N).to(tl.int64)
    n = tok % N
    dims = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    if (tok == 0) & (tl.program_id(1) == 0):
        for t0 in range(0, num_tickets, TICKET_BLOCK):
            offs = t0 + tl.arange(0, TICKET_BLOCK)
            tl.store(tickets_ptr + offs, tl.zeros([TICKET_BLOCK], tl.int32), mask=offs < num_tickets)
    is_q = heads < NUM_HEADS
    is_v = (heads >= NUM_HEADS + NUM_KV) & (heads < NUM_HEADS + 2 * NUM_KV)
    is_k = (heads >= NUM_HEADS) & (heads < NUM_HEADS + NUM_KV)
    live = (is_q | is_k | is_v)[:, None]
    row = qkv_ptr + b * stride_xb + n * stride_xn + heads[:, None] * HEAD_DIM
    raw = tl.load(row + dims[None, :], mask=live, other=0.0)
    x = raw.to(tl.float32)
    # rotate_half: [-x[half:], x[:half]]
    partner = tl.load(row + ((dims + half) % HEAD_DIM)[None, :], mask=live, other=0.0).to(tl.float32)
    rot = tl.where(dims[None, :] < half, -partner, partner)
    c = b * stride_cb + n * stride_cn + dims
    cos = tl.load(cos_ptr + c).to(tl.float32)
    sin = tl.load(sin_ptr + c).to(tl.float32)
    out = x * cos[None, :] + rot * sin[None, :]
    q_dst = q_ptr + (tok * NUM_HEADS + heads[:, None]) * HEAD_DIM + dims[None, :]
    tl.store(q_dst, out.to(q_ptr.dtype.element_ty), mask=is_q[:, None])
    slot = tl.load(slots_ptr + b * stride_sb + n * stride_sn)
    k_dst = k_ptr + b * stride_kb + slot * stride_ks + (heads - NUM_HEADS)[:, None] * stride_kh + dims[None, :]
    tl.store(k_dst, out.to(k_ptr.dtype.element_ty), mask=is_k[:, None])
    v_dst = v_ptr + b * stride_vb + slot * stride_vs + (heads - NUM_HEADS - NUM_KV)[:, None] * stride_vh
    tl.store(v_dst + dims[None, :], raw, mask=is_v[:, None])


INTERPRETED = interpreted(_rope_cache_kernel)

# Values a program moves: one head each (128 values, one warp) made the lifted 8B's verify pass at 144 rows
# launch 6,912 tiny programs a layer, 9 us a call against ~1 us of traffic, 338 us of a 9.9 ms tree round
# (H100, 16 rows, (6, 8) tree, round_profile_b16 in batched_h100.json at 937d7ec; 1.8 us at AR's 16 rows).
# 1,024 values (8 heads of 128) a program of four warps cuts the programs eightfold. Not yet timed on a GPU.
PROGRAM_VALUES = 1024


def heads_per_program(head_dim: int) -> int:
    """Heads one program of the kernel ropes and writes: a power of two, ``PROGRAM_VALUES`` values at most."""
    return max(1, triton.next_power_of_2(PROGRAM_VALUES // head_dim + 1) // 2)


# An opaque custom op with undeclared cache writes (the module docstring says why).
@torch.library.custom_op("specpilot::rope_cache_write", mutates_args=())
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
    num_tickets: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, _ = qkv.shape
    q = torch.empty((B, N, num_heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    tickets = torch.empty(max(1, num_tickets), device=qkv.device, dtype=torch.int32)
    if qkv.device.type == "cpu" and not INTERPRETED:
        tickets.zero_()
        q.copy_(rope_cache_write_ref(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim))
        return q, tickets
    pdl = uses_pdl(qkv, INTERPRETED)
    heads = heads_per_program(head_dim)
    _rope_cache_kernel[(B * N, triton.cdiv(num_heads + 2 * num_kv_heads, heads))](
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
        tickets,
        num_tickets,
        NUM_HEADS=num_heads,
        NUM_KV=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS=heads,
        TICKET_BLOCK=1024,
        USE_PDL=pdl,
        num_warps=4 if heads * head_dim >= 1024 else 1,
        **({"launch_pdl": True} if pdl else {}),
    )
    return q, tickets


@_rope_cache_op.register_fake
def _(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim, num_tickets):
    B, N, _ = qkv.shape
    return qkv.new_empty((B, N, num_heads, head_dim)), qkv.new_empty(max(1, num_tickets), dtype=torch.int32)


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
    num_tickets: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope q and k of the fused projection's output and write k and v into the caches.

    Parameters
    ----------
    qkv : [B, N, (num_heads + 2 * num_kv_heads) * head_dim], q then k then v columns (``Attention.wqkv``)
    cos, sin : [B, N, 1, head_dim] in qkv's dtype (views of one table are fine: only their B and N strides
        are used, and they must be the same)
    k_cache, v_cache : [B_max, S, num_kv_heads, head_dim]; request b's token n goes to slot ``slots[b, n]``
    slots : [B, N] integer
    num_tickets : int32 counters to hand ``tree_attention`` zeroed (its ``tickets``), at least 1

    Returns q [B, N, num_heads, head_dim], roped, contiguous, and the zeroed tickets. Runs on the GPU or in
    the Triton interpreter; on the CPU otherwise, the reference.
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
    return _rope_cache_op(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim, num_tickets)


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
