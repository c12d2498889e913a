"""Tree attention over a static KV cache: one verification (or draft-expansion) step per request.

The contract (DESIGN.md, tree verification; the same as ``engine.attn_meta``): request b has
``seq_len[b]`` tokens in slots ``0 .. seq_len[b]-1``. The step has Nq query tokens and a window of W new
slots ``seq_len[b] .. seq_len[b] + W - 1`` whose K/V are already written (some may hold stale values from
an earlier step: they must be finite). Query token i sees every prefix slot, and window slot
``seq_len[b] + t`` iff ``anc[(b,) i, t]``. Verification is W = Nq with a True diagonal (t is an ancestor
of i, or i itself); draft-tree expansion at depth d has k queries at window slots ``seq_len + e`` (their
expansion index e) that see the root and their ancestors among the W expansion slots. Slots from
``seq_len[b] + W`` on hold garbage, possibly NaN, and never reach the result.

The idea. Decode attention is bound by reading the cache, so every K/V block is read once for all the
queries that need it: a program owns one (request, KV head, row tile, KV split) and the Nq * G query rows
(row ``n * G + g``) of the G query heads that share that KV head, padded to BLOCK_R >= 16 for ``tl.dot``.
It walks its slice of the cache in BLOCK_S slots at a time with an online softmax in fp32 (log2 domain).
Blocks that lie wholly in the prefix take an unmasked fast path; only the last one or two blocks of a
request (the prefix tail and the window) load the ancestor mask.

Small batches leave most SMs idle, so the cache is also cut into ``num_splits`` contiguous ranges
(flash-decoding). The count is fixed on the host from static shapes only; the ranges themselves come
from ``seq_len`` inside the kernel, so nothing reads ``seq_len`` on the host and the op is safe to capture
in a CUDA graph. Each split writes its normalized partial output and log-sum-exp; a second small kernel
merges them. With one split the first kernel writes the output directly.

``tree_attention`` is a ``torch.library.triton_op`` (``specpilot::tree_attention``), so
``torch.compile(fullgraph=True)`` sees through it. On the CPU it runs the PyTorch reference, unless
``TRITON_INTERPRET=1`` was set before triton was imported: then the Triton kernels run in the interpreter
(how the tests exercise them on a machine without a GPU).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Tile sizes from one sweep on the H200 (bf16, 8 kv heads, G = 4, D = 128; median us of 20 CUDA-graph
# replays, a single run): 64 slots x 3 stages was best on 3 of 6 shapes and within 15% on the rest (32 slots
# won batch 8, N = 8, 8k context: 97 vs 112 us). Batch 64, N = 8, 8k: 493 us (64 slots, 3 stages), 573
# (64, 2), 501 (128, 2), 612 (32, 3); 128 slots x 3 stages x 128 rows runs out of shared memory.
# BLOCK_S is also the unit a split's range is aligned to.
BLOCK_S = 64
# Three stages of K/V tiles in flight; fp32 tiles are twice the bytes, so fp32 keeps two (3 x 64 KB of
# 64 x 128 fp32 K/V plus the q tile would pass the 227 KB of shared memory).
NUM_STAGES = {2: 3, 4: 2}
# Rows per tile: 128-row tiles beat 64 once there are programs enough (batch 8, N = 64, 8k: 176 vs 212 us)
# but leave SMs idle at batch 1 (N = 64, 1k context: 44 vs 27 us), so small grids use 64.
MAX_BLOCK_R = 128
# Cap on splits (not swept): at 64 splits an 8k context gives each split only two blocks.
MAX_SPLITS = 64
# Programs per SM the split heuristic aims for (not swept): two let one program's loads overlap another's
# math.
PROGRAMS_PER_SM = 2
# Used when the device is not a GPU (the interpreter): the SM count of an H100/H200.
DEFAULT_NUM_SMS = 132


# ---------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _split_blocks(seq, num_win, num_splits, BLOCK_S: tl.constexpr):
    # Cache blocks per split for this request; both kernels must cut the range the same way.
    num_blocks = tl.cdiv(seq + num_win, BLOCK_S)
    return tl.cdiv(num_blocks, num_splits)


@triton.jit
def _attend_block(
    acc,
    m_i,
    l_i,
    q,
    k,
    v,
    allowed,
    qk_scale,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # One online-softmax step over a [BLOCK_R, BLOCK_S] score tile, in the log2 domain.
    if UPCAST:
        # Interpreter only: its bf16 tl.dot multiplies the raw bit patterns (triton-lang/triton#11584).
        # bf16 x bf16 products are exact in fp32, so this is what the tensor cores compute.
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row can have seen nothing yet (m = -inf); exp2(-inf - -inf) would be NaN, so shift by 0.
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    alpha = tl.math.exp2(m_i - m_new_safe)
    p = tl.math.exp2(s - m_new_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # p is rounded to the cache dtype so the second product runs on the tensor cores too.
    p = p.to(v.dtype)
    if UPCAST:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _tree_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    seq_len_ptr,
    anc_ptr,
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_on,
    stride_oh,
    stride_ab,
    stride_ai,
    stride_aj,
    stride_seq,
    num_kv_heads,
    num_q,
    num_win,
    group,
    num_row_tiles,
    num_splits,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # -- program id -> (request, kv head, row tile, split) ----------------------------------------------
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tile = pid % num_row_tiles
    kv_head = (pid // num_row_tiles) % num_kv_heads
    b = (pid // num_row_tiles // num_kv_heads).to(tl.int64)  # batch strides can pass 2**31 elements
    # Under torch.compile inductor passes Python floats as fp64; fp64 scores would make m_i change type.
    qk_scale = tl.full([], qk_scale, tl.float32)

    # -- query rows: row r is query token r // G of query head kv_head * G + r % G ------------------------
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_q * group
    tok = rows // group
    head = kv_head * group + rows % group
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + b * stride_qb + tok[:, None] * stride_qn + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )

    # -- this split's slot range [start, end), aligned to BLOCK_S, computed from seq_len on the device -----
    seq = tl.load(seq_len_ptr + b * stride_seq).to(tl.int32)
    total = seq + num_win
    per_split = _split_blocks(seq, num_win, num_splits, BLOCK_S)
    start = split * per_split * BLOCK_S
    end = tl.minimum(start + per_split * BLOCK_S, total)  # below start when the split is empty
    # Blocks that end at or before seq are pure prefix: every row sees every slot, no mask needed.
    full_end = tl.maximum(start, (tl.minimum(end, seq) // BLOCK_S) * BLOCK_S)

    k_base = k_ptr + b * stride_kb + kv_head * stride_kh
    v_base = v_ptr + b * stride_vb + kv_head * stride_vh
    anc_base = anc_ptr + b * stride_ab + tok * stride_ai
    slots = tl.arange(0, BLOCK_S)

    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)

    # -- prefix blocks: unmasked loads --------------------------------------------------------------------
    for s0 in range(start, full_end, BLOCK_S):
        offs = s0 + slots
        k = tl.load(k_base + offs[:, None] * stride_ks + dims[None, :])
        v = tl.load(v_base + offs[:, None] * stride_vs + dims[None, :])
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k, v, None, qk_scale, False, DOT_PRECISION, UPCAST)

    # -- the prefix tail and the window: the ancestor mask decides --------------------------------------
    for s0 in range(full_end, end, BLOCK_S):
        offs = s0 + slots
        in_use = offs < total
        # Masked loads (not multiply-by-zero) keep NaN garbage past the window out of the dot products.
        # Window slots a row may not see are finite (the contract), so their masked p = 0 adds nothing.
        k = tl.load(k_base + offs[:, None] * stride_ks + dims[None, :], mask=in_use[:, None], other=0.0)
        v = tl.load(v_base + offs[:, None] * stride_vs + dims[None, :], mask=in_use[:, None], other=0.0)
        rel = offs - seq
        is_win = (rel >= 0) & in_use
        anc_ptrs = anc_base[:, None] + rel[None, :] * stride_aj
        tree = tl.load(anc_ptrs, mask=row_ok[:, None] & is_win[None, :], other=0)
        allowed = (offs < seq)[None, :] | (tree != 0)
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k, v, allowed, qk_scale, True, DOT_PRECISION, UPCAST)

    # -- store: the output itself, or this split's normalized partial and its log-sum-exp -----------------
    # A split with no slots has l = 0: it stores out = 0 and lse = -inf, a zero weight in the merge.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if ONE_SPLIT:
        o_ptrs = o_ptr + b * stride_ob + tok[:, None] * stride_on + head[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
        part = pid.to(tl.int64) * num_splits + split
        local = tl.arange(0, BLOCK_R)
        tl.store(part_lse_ptr + part * BLOCK_R + local, lse)
        tl.store(part_o_ptr + (part * BLOCK_R + local[:, None]) * HEAD_DIM + dims[None, :], out)


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    seq_len_ptr,
    o_ptr,
    stride_ob,
    stride_on,
    stride_oh,
    stride_seq,
    num_kv_heads,
    num_q,
    num_win,
    group,
    num_row_tiles,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    # One program per (request, kv head, row tile), same mapping as the attention kernel.
    pid = tl.program_id(0)
    tile = pid % num_row_tiles
    kv_head = (pid // num_row_tiles) % num_kv_heads
    b = (pid // num_row_tiles // num_kv_heads).to(tl.int64)
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_q * group
    tok = rows // group
    head = kv_head * group + rows % group
    local = tl.arange(0, BLOCK_R)
    dims = tl.arange(0, HEAD_DIM)

    # Splits past the last non-empty one hold (0, -inf); skipping them saves reading them at short contexts.
    seq = tl.load(seq_len_ptr + b * stride_seq).to(tl.int32)
    per_split = _split_blocks(seq, num_win, num_splits, BLOCK_S)
    num_active = tl.cdiv(tl.cdiv(seq + num_win, BLOCK_S), per_split)

    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for split in range(0, num_active):
        part = pid.to(tl.int64) * num_splits + split
        lse = tl.load(part_lse_ptr + part * BLOCK_R + local)
        out = tl.load(part_o_ptr + (part * BLOCK_R + local[:, None]) * HEAD_DIM + dims[None, :])
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        w = tl.math.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + w[:, None] * out
        l_sum = l_sum * alpha + w
        m = m_new
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    o_ptrs = o_ptr + b * stride_ob + tok[:, None] * stride_on + head[:, None] * stride_oh + dims[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------

# TRITON_INTERPRET=1 counts only if it was set before triton was imported (@triton.jit and triton's own
# jit helpers read it then), so ask the kernel rather than the environment.
INTERPRETED = isinstance(_tree_attention_kernel, InterpretedFunction)


def _launchable(kernel):
    # Interpreted kernels launch directly: wrap_triton accepts them only from torch 2.13 on.
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_num_splits(batch: int, num_kv_heads: int, row_tiles: int, capacity: int, num_sms: int) -> int:
    """KV splits from static shapes only: enough programs for PROGRAMS_PER_SM per SM, capped."""
    programs = batch * num_kv_heads * row_tiles
    want = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    return max(1, min(want, MAX_SPLITS, triton.cdiv(capacity, BLOCK_S)))


def row_block(rows: int, batch: int, num_kv_heads: int, num_sms: int) -> int:
    """Query rows per program: the next power of two >= 16, at most MAX_BLOCK_R; 64 on a small grid."""
    block = min(max(16, triton.next_power_of_2(rows)), MAX_BLOCK_R)
    if block > 64 and batch * num_kv_heads * triton.cdiv(rows, block) < num_sms // 2:
        block = 64
    return block


@torch.library.triton_op("specpilot::tree_attention", mutates_args=())
def _tree_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    scale: float,
    num_splits: int,
) -> torch.Tensor:
    B, Nq, Hq, D = q.shape
    S, Hkv = k_cache.shape[1], k_cache.shape[2]
    W = anc.shape[-1]
    G = Hq // Hkv
    num_sms = _num_sms(q.device)
    block_r = row_block(Nq * G, B, Hkv, num_sms)
    row_tiles = triton.cdiv(Nq * G, block_r)
    if num_splits <= 0:
        num_splits = default_num_splits(B, Hkv, row_tiles, S, num_sms)
    # anc goes in as bool: Triton reads it through an i1 pointer, one byte each. A uint8 view would do as
    # well in eager mode, but inductor cannot lower a bool -> uint8 view (torch 2.11).
    stride_ab = anc.stride(0) if anc.dim() == 3 else 0  # a shared [Nq, W] mask: every request reads it

    o = torch.empty_like(q)
    one_split = num_splits == 1
    if one_split:
        # Unused (the kernel writes o directly); distinct buffers so no argument aliases o.
        part_o = part_lse = torch.empty(1, device=q.device, dtype=torch.float32)
    else:
        programs = B * Hkv * row_tiles
        part_o = torch.empty((programs, num_splits, block_r, D), device=q.device, dtype=torch.float32)
        part_lse = torch.empty((programs, num_splits, block_r), device=q.device, dtype=torch.float32)

    # fp32 models are the lossless reference runs: keep the dots in IEEE fp32, not TF32.
    upcast = INTERPRETED and q.dtype == torch.bfloat16
    dot_precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    num_warps = 8 if block_r >= 128 else 4
    grid = (B * Hkv * row_tiles, num_splits)
    _launchable(_tree_attention_kernel)[grid](
        q,
        k_cache,
        v_cache,
        seq_len,
        anc,
        o,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        stride_ab,
        anc.stride(-2),
        anc.stride(-1),
        seq_len.stride(0),
        Hkv,
        Nq,
        W,
        G,
        row_tiles,
        num_splits,
        scale * math.log2(math.e),
        HEAD_DIM=D,
        BLOCK_R=block_r,
        BLOCK_S=BLOCK_S,
        ONE_SPLIT=one_split,
        DOT_PRECISION=dot_precision,
        UPCAST=upcast,
        num_warps=num_warps,
        num_stages=NUM_STAGES[q.element_size()],
    )
    if not one_split:
        _launchable(_merge_splits_kernel)[(B * Hkv * row_tiles,)](
            part_o,
            part_lse,
            seq_len,
            o,
            o.stride(0),
            o.stride(1),
            o.stride(2),
            seq_len.stride(0),
            Hkv,
            Nq,
            W,
            G,
            row_tiles,
            num_splits,
            HEAD_DIM=D,
            BLOCK_R=block_r,
            BLOCK_S=BLOCK_S,
            num_warps=4,
        )
    return o


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    scale: float | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attention of Nq query tokens per request over a static KV cache and a window of W new slots.

    ``o[b, i, h] = softmax_j(scale * q[b, i, h] . k[b, j, h // G]) @ v[b, j, h // G]`` over the slots j
    that query i may see: every ``j < seq_len[b]``, and ``j = seq_len[b] + t`` where ``anc[(b,) i, t]``.

    Parameters
    ----------
    q : [B, Nq, Hq, D] bf16, fp16 or fp32, contiguous; Hq = G * Hkv, D in {32, 64, 128}
    k_cache, v_cache : [B_max, S, Hkv, D], q's dtype, B_max >= B; rows 0..B-1 are read. The window's K/V
        sit at slots ``seq_len[b] .. seq_len[b] + W - 1`` and must be finite, also where no query sees
        them; later slots may hold anything.
    seq_len : [B] int64 (or int32), tokens already in the cache per request; ``seq_len + W <= S``
        (not checked: checking would read seq_len on the host)
    anc : [Nq, W] shared or [B, Nq, W] per request, bool; anc[i, t] = query i sees window slot t. Every
        query must see some slot (seq_len > 0 or a True in its row); verification passes W = Nq and the
        ancestor-or-self matrix.
    scale : softmax scale, default ``1 / sqrt(D)``
    num_splits : KV splits per (request, kv head); None picks one from the static shapes

    Returns
    -------
    o : [B, Nq, Hq, D] in q's dtype (accumulated in fp32)
    """
    B, Nq, Hq, D = q.shape
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "k_cache, v_cache: [B_max, S, Hkv, D]"
    assert k_cache.shape[0] >= B and k_cache.shape[3] == D, "cache rows or head_dim do not match q"
    assert Hq % k_cache.shape[2] == 0, "query heads must be a multiple of kv heads"
    assert D in (32, 64, 128), f"head_dim {D} not supported (32, 64 or 128)"
    assert q.dtype in (torch.bfloat16, torch.float16, torch.float32), q.dtype
    assert k_cache.dtype == q.dtype and v_cache.dtype == q.dtype, "q and the cache must share a dtype"
    assert q.is_contiguous(), "q must be contiguous"
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "cache head_dim must be contiguous"
    assert seq_len.shape == (B,) and not seq_len.dtype.is_floating_point, "seq_len: [B] integer"
    assert anc.dim() in (2, 3) and anc.dtype == torch.bool, "anc: [Nq, W] or [B, Nq, W] bool"
    W = anc.shape[-1]
    assert W >= 1 and anc.shape in ((Nq, W), (B, Nq, W)), f"anc {tuple(anc.shape)}: [Nq, W] or [B, Nq, W]"
    assert W <= k_cache.shape[1], "the window is wider than the cache"
    if scale is None:
        scale = D**-0.5
    if q.device.type == "cpu" and not INTERPRETED:
        return tree_attention_ref(q, k_cache, v_cache, seq_len, anc, scale)
    return _tree_attention_op(q, k_cache, v_cache, seq_len, anc, float(scale), num_splits or 0)


# ---------------------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------------------


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Plain PyTorch ``tree_attention`` in fp32 (same arguments and result).

    The mask spans the whole cache capacity S rather than ``max(seq_len) + W``: the same answer without
    reading seq_len on the host, so this also runs under ``torch.compile(fullgraph=True)``.
    """
    B, Nq, Hq, D = q.shape
    S, Hkv = k_cache.shape[1], k_cache.shape[2]
    W = anc.shape[-1]
    G = Hq // Hkv
    if scale is None:
        scale = D**-0.5
    rel = torch.arange(S, device=q.device)[None, :] - seq_len[:, None].long()  # [B, S], 0 = first window slot
    in_use = rel < W
    tree = anc.expand(B, Nq, W).gather(2, rel.clamp(0, W - 1)[:, None, :].expand(B, Nq, S))  # [B, Nq, S]
    mask = (rel < 0)[:, None, :] | ((rel >= 0) & in_use)[:, None, :] & tree
    # Zero the garbage past the end: a masked NaN would still poison the p @ v product (0 * NaN).
    k = torch.where(in_use[:, :, None, None], k_cache[:B].float(), 0.0)
    v = torch.where(in_use[:, :, None, None], v_cache[:B].float(), 0.0)
    qf = q.float().view(B, Nq, Hkv, G, D)
    scores = torch.einsum("bnhgd,bshd->bhgns", qf, k) * scale
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    o = torch.einsum("bhgns,bshd->bnhgd", scores.softmax(-1), v)
    return o.reshape(B, Nq, Hq, D).to(q.dtype)
