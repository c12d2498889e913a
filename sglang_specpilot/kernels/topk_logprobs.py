"""Top-k of each logit row's log-softmax, in two launches (Triton), and its reference.

Why: a draft tree's expansion takes, per depth, the k best children of every frontier node by draft
log-probability: ``log_softmax(logits.float()).topk(k)``. PyTorch runs that as a cast, a softmax kernel and
a radix top-k of four passes, each several launches: on the H200 SmolLM2's tree-32 round (depth 6, top-k 8)
spent 50 us in the softmax and ~150 us in 24 radix passes of 6 top-k calls (rounds_h200.json at e532d9d,
smollm2.tree32.round's profile), about 35 us a depth against ~1 us of reading the logits.

Here each row is cut into ``CHUNK``-logit pieces, one program each: it reads its piece once, takes the
piece's max and sum of exp (for the log-sum-exp), and its k best entries by k rounds of one max-reduction
over 64-bit keys (the value's order-preserving bits above the complemented index, so a tie goes to the
smaller index and no two rounds take the same entry). A second launch per row merges the pieces' sums
and keys, and writes ``(x - max) - log(sum)`` in fp32 for the k winners, in the order and rounding of
PyTorch's log-softmax (the sum is taken in another order, so a value may differ in its last bit).

``topk_logprobs_ref`` is the reference. A row with a NaN yields in-range indices of no meaning (the
draft it feeds is verified by the target like any other).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import interpreted

CHUNK = 4096  # logits a program reads: 12 programs a row at SmolLM2's 49,152, 32 at Llama 3's 128,256
LOW: tl.constexpr = tl.constexpr(0xFFFFFFFF)  # the key's low 32 bits hold LOW - index


@triton.jit
def _key(x, offs):
    # fp32 -> int32 with the same order (negative floats have their magnitude bits flipped), above LOW - index.
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) + (LOW - offs.to(tl.int64))


@triton.jit
def _unkey(key):
    # (fp32 value, int64 index) of a key.
    ordered = (key >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), LOW - (key & LOW)


@triton.jit
def _topk_chunks(x_ptr, key_ptr, m_ptr, s_ptr, V, stride_x, n_chunks, K: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(x - m_safe), 0)
    out = row * n_chunks + chunk
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    # Entries past V never win: the smallest key there is.
    key = tl.where(ok, _key(x, offs), -(2**63))
    for j in tl.static_range(K):
        best = tl.max(key, 0)
        tl.store(key_ptr + out * K + j, best)
        key = tl.where(key == best, -(2**63), key)


@triton.jit
def _topk_merge(
    key_ptr, m_ptr, s_ptr, lp_ptr, idx_ptr, V, n_chunks, K: tl.constexpr, SPLITS: tl.constexpr, CAND: tl.constexpr
):
    row = tl.program_id(0)
    c = tl.arange(0, SPLITS)
    c_ok = c < n_chunks
    mc = tl.load(m_ptr + row * n_chunks + c, mask=c_ok, other=float("-inf"))
    sc = tl.load(s_ptr + row * n_chunks + c, mask=c_ok, other=0.0)
    m = tl.max(mc, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    log_sum = tl.log(tl.sum(sc * tl.exp(mc - m_safe), 0))
    i = tl.arange(0, CAND)
    key = tl.load(key_ptr + row * n_chunks * K + i, mask=i < n_chunks * K, other=-(2**63))
    for j in tl.static_range(K):
        best = tl.max(key, 0)
        key = tl.where(key == best, -(2**63), key)
        v, idx = _unkey(best)
        tl.store(lp_ptr + row * K + j, (v - m) - log_sum)
        tl.store(idx_ptr + row * K + j, tl.minimum(tl.maximum(idx, 0), V - 1))


INTERPRETED = interpreted(_topk_chunks)


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [..., V]`` (bf16, fp16 or fp32) -> (log-probs fp32 [..., k], indices int64 [..., k]), the k
    largest of each row's ``log_softmax`` in descending order, ties to the smaller index; GPU or interpreter."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"topk_logprobs takes bf16, fp16 or fp32 logits, got {logits.dtype}")
    if not 1 <= k <= min(V, 64):
        raise ValueError(f"topk_logprobs takes 1 <= k <= min(V, 64), got k={k} for V={V}")
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    n_chunks = triton.cdiv(V, CHUNK)
    dev = logits.device
    keys = torch.empty(R * n_chunks * k, device=dev, dtype=torch.int64)
    m = torch.empty(R * n_chunks, device=dev, dtype=torch.float32)
    s = torch.empty(R * n_chunks, device=dev, dtype=torch.float32)
    lp = torch.empty(R, k, device=dev, dtype=torch.float32)
    idx = torch.empty(R, k, device=dev, dtype=torch.int64)
    _topk_chunks[(R, n_chunks)](x, keys, m, s, V, x.stride(0), n_chunks, K=k, CHUNK=CHUNK, num_warps=8)
    _topk_merge[(R,)](
        keys,
        m,
        s,
        lp,
        idx,
        V,
        n_chunks,
        K=k,
        SPLITS=triton.next_power_of_2(n_chunks),
        CAND=triton.next_power_of_2(n_chunks * k),
        num_warps=4,
    )
    return lp.view(*lead, k), idx.view(*lead, k)


def topk_logprobs_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: fp32 log-softmax, then a stable descending sort's first k (ties to the smaller index)."""
    lp = torch.log_softmax(logits.float(), -1)
    order = torch.sort(lp, dim=-1, descending=True, stable=True).indices[..., :k]
    return lp.gather(-1, order), order
