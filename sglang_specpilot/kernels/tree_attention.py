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

Small batches leave most SMs idle, so the cache is also cut into contiguous ranges (flash-decoding). The
grid's split count is fixed on the host from static shapes only (``pick_config``); the ranges come from
``seq_len`` inside the kernel (the live blocks cut into at most that many splits, or with ``balanced`` the
live slots cut into equal ranges), and the programs past the live range exit at once, so nothing reads
``seq_len`` on the host and the op is safe to capture in a CUDA graph. With one live split a program writes
the output directly. Otherwise each split writes its normalized partial (fp32, or the call's half dtype if
the config says so) and log-sum-exp, then takes a ticket (an acq_rel atomic on a per-(request, kv head, row
tile) counter); the split that draws the last ticket merges every partial, in split order, a chunk of rows
at a time with the next chunk's loads in flight, so the result does not depend on which one finished last,
and resets the counter to zero for the next call and the next graph replay. One launch, no merge kernel.
The counters live in a per-device buffer that stays zero between calls (under torch.compile a fresh zeroed
one each call), so two calls must not run at once on different streams.

``tree_attention`` is a ``torch.library.triton_op`` (``specpilot::tree_attention``), so
``torch.compile(fullgraph=True)`` sees through it. On the CPU it runs the PyTorch reference, unless
``TRITON_INTERPRET=1`` was set before triton was imported: then the Triton kernels run in the interpreter
(how the tests exercise them on a machine without a GPU).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launch import interpreted
from .pdl import uses_pdl

# Measurements behind the constants below: the H200, Llama-3.1-8B attention (8 kv heads, G = 4, D = 128,
# bf16), batch 1, a 4224-slot cache; us per step of 32 calls over 32 layer caches in one CUDA graph, median
# of 30 replays, one run each (benchmarks/attention_bench.py). "4k / 1k" = 4096 / 1024 cached tokens.
#
# Plain decode (Nq = 1, 4 real rows of a 16-row tile), new kernel:
#   128-slot blocks, 2 stages, 32 splits, >= 1 block a split   480 / 285   (the default)
#   64-slot blocks, 3 stages, 64 splits, >= 1 / 2 / 4 blocks   581 / 393, 591 / 290, 504 / 334
#   64-slot blocks, 3 stages, 32 splits, >= 4 blocks           444 / 333
#   128-slot blocks, 3 stages, 64 splits                       659 / 304
#   the old kernel + merge launch (33 splits, 64-slot blocks)  830 / 488
# A verify tree (Nq = W = 64, 256 rows a kv head), new kernel, 64-slot blocks:
#   64-row tiles, 4 warps, 3 stages, 4 splits                  712 / 448   (the default)
#   the same with 2 / 3 / 6 / 8 splits                         1041 / 526, 830 / 490, 1051 / 703, 968 / 702
#   the same with 4 stages                                     736 / 464
#   128-row tiles, 8 warps, 4 / 8 splits                       1006 / 603, 938 / 703
#   32-row tiles, 2 / 4 splits                                 1369 / 619, 1431 / 867
#   the old kernel + merge launch (9 splits)                   1104 / 838
# What costs: about 9 us a call whatever the context (285 us / 32 at 1k, where reading the K/V takes ~1
# us), the chain of dependent round trips in one program (seq_len, K/V, partial store, ticket, merge loads);
# and the single merging program reads every live split's fp32 partial, which is why a tree (64 rows of
# 128 fp32 a partial) wants few splits: past one program per SM (4 splits x 32 tiles on 132 SMs) it loses.

# The tuning table below started from those measurements; ``benchmarks/attention_bench.py --sweep`` times
# a list of launch shapes on the device and prints the TUNING entries of the best, to paste here.

# fp32 K/V is twice the bytes a tile: at most 64-slot blocks and two stages (3 x 64 KB of 64 x 128 fp32 K/V
# plus the q tile would pass the 227 KB of shared memory).
FP32_MAX_BLOCK_S = 64
FP32_MAX_STAGES = 2
# fp32 partial values the merge loads a step for four warps (64 registers a thread; twice that in flight,
# since the next step's loads are issued before this step's sums). A step holds every split of one or more
# rows: 64 splits x 128 dims is one row; plain decode's 32-split grid takes 2 of its 4 rows a step.
MERGE_ELEMS = 8192
# Cap on the split grid: programs past the live range still cost a launch slot each. With MAX_SPLITS x 128
# dims <= MERGE_ELEMS the merge loads every split of a row in one step.
MAX_SPLITS = 64


# ---------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------


class Config(NamedTuple):
    """Launch shape of one call: rows per tile, slots per block, the split grid, warps and stages."""

    block_r: int  # query rows per program (>= 16 for tl.dot)
    block_s: int  # cache slots per inner step; a split's range is a whole number of these
    num_splits: int  # programs per (request, kv head, row tile) over the cache; those past the live range exit
    min_split_blocks: int  # a live split covers at least this many blocks (fewer live splits at short contexts)
    num_warps: int
    num_stages: int
    merge_elems: int = MERGE_ELEMS  # fp32 partial values a merge step loads, per four warps
    half_partials: bool = False  # bf16 / fp16 calls store the splits' partial outputs in their own dtype
    pdl: bool = False  # programmatic dependent launch: start during the previous kernel's tail (sm_90+)
    one_loop: bool = False  # every block through the masked loop (one pipelined loop a split)
    balanced: bool = False  # split ranges of equal slot counts instead of whole blocks


class Tuning(NamedTuple):
    """One regime's launch shape, less the split count, which comes from the grid (``split_count``)."""

    max_block_r: int  # largest row tile (``row_block`` picks the tile from the rows and the grid)
    small_grid_block_r: int  # the tile when max_block_r tiles would fill under half the SMs
    block_s: int
    num_warps: int  # for tiles up to 64 rows; 128-row tiles take 8, 256-row tiles 16
    num_stages: int
    waves: float  # split programs per SM the full grid aims for (the live ranges use what the context needs)
    min_split_blocks: int = 1
    merge_elems: int = MERGE_ELEMS
    half_partials: bool = False
    pdl: bool = False
    one_loop: bool = False
    balanced: bool = False
    max_splits: int = MAX_SPLITS  # the grid's split count at most


# The chooser's table, by regime: "decode" is one 16-row tile (up to 4 query tokens at G = 4), "tree" more
# rows. Decode: 2 waves of 16-row programs (32 splits at batch 1 with 8 kv heads). Trees: one program per SM
# (a second wave lost: 6 and 8 splits above), since the single merging program reads every live split's
# fp32 partial (64 rows x 128 fp32 a partial). An sm_90 compile (Triton 3.6, the 8B shape) of these: decode
# 247 registers (the merge's peak; 196 with merge_elems 4096) and 72 KB of shared memory, two programs an
# SM; tree 255 registers and 116 KB, one program an SM (84 KB with 2 stages: two).
TUNING = {
    "decode": Tuning(16, 16, block_s=128, num_warps=4, num_stages=2, waves=2.0),
    # 128-row tiles pay once there are programs enough (batch 8, N = 64, 8k: 176 vs 212 us) but leave SMs
    # idle at batch 1, so small grids use 64 (see above for batch 1).
    # attention_bench --sweep on the H200 (3c51311, 8B shape, 64 rows, 32 layers' caches): 64-row tiles at
    # half a wave (2 splits at batch 1) took 704 / 1212 us at 1k / 4k against this table's former entry
    # (128-row tiles, one wave: 4 splits) at 1114 / 1377 us; the single merging program's fp32 partial
    # reads are what more splits cost. bf16 partials (half_partials) measured 505 / 1014 us but change the
    # verify pass's rounding, so they stay off until token forcing has judged them. Open: in the engine,
    # the rounds suite at 2f61596 (this table, and the merge of eed79f6) timed verify64 / verify1 at 1.178
    # and the tree-32 round at 14.80 ms, against 1.125 and 14.26 ms at eda5a8e (the old table and merge):
    # two changes at once across runs, so not an A/B of either (attention_engine_check_h200.json).
    # min_split_blocks 8 (512 slots a split): the grid's split count comes from the SMs, and a small model's
    # grid is tiny, so SmolLM2's verify (3 kv heads, 33 x 3 rows: 6 programs) got 11 splits and merged 5 at
    # 256 cached tokens. attention_bench --shape smollm2 --sweep on the H200 (b5e79e0, 30 layers, us a
    # step at 256 / 1k cached tokens): 64-row tiles with 11 splits 668 / 678, 1 split 193 / 383, 2 splits
    # 244 / 338, 4 splits 472 / 511. One split wins below ~5 blocks, two by 17: the rule keeps one split
    # under 16 blocks and two from there, and leaves the 8B's verify grid (2 splits from 17 blocks on) as
    # it was. max_splits 2: the merge's steps follow the grid's split count, not the live one (it loads
    # next_power_of_2(num_splits) partials a row, so fewer rows a step), and SmolLM2's verify at 1k cached
    # tokens with 2 of 11 splits live took 787 us (4b6d26a) against 338 for a grid of 2. Grids of at least
    # 23 programs (the 8B's verify at batch 1 has 24 or 32) get 2 or fewer from the waves anyway.
    "tree": Tuning(64, 64, block_s=64, num_warps=4, num_stages=3, waves=0.5, min_split_blocks=8, max_splits=2),
}
# Trees of heads of 64 dims or fewer (SmolLM2's): their own entry, so a launch shape measured on a small
# model's rounds never moves the 8B's (head_dim 128). It starts as the tree entry; the H200 A/B of SmolLM2's
# tree round (benchmarks/device/final_check.sh) decides whether it changes.
TUNING["tree_d64"] = TUNING["tree"]
# A benchmarking hook, for engine A/B runs of a regime's entry in separate processes (the entry is baked
# into compiled graphs, so one process cannot switch it): SPECPILOT_ATTENTION_TUNING="tree=128,64,64,4,3,1.0"
# (max_block_r, small_grid_block_r, block_s, num_warps, num_stages, waves, and optionally min_split_blocks
# and max_splits, which default to 1 and 64 as before that rule; ";" between regimes). Why: the
# rounds suite measured the tree round's attention 29% slower in the engine with this table and merge than
# with the former entry (tree=128,64,64,4,3,1.0) and merge, while the sweep's microbenchmark timed it faster
# (rounds_h200.json's attachments); the two changes were never separated.
TUNING_ENV = "SPECPILOT_ATTENTION_TUNING"


def _tuning_from_env(text: str) -> dict[str, Tuning]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        regime, _, vals = part.partition("=")
        if regime not in TUNING:
            raise ValueError(f"{TUNING_ENV}: unknown regime {regime!r} (use {', '.join(TUNING)})")
        try:
            r, small, bs, warps, stages, waves, *split = vals.split(",")
            if len(split) > 2:
                raise ValueError
            nums = [int(x) for x in split]
            min_blocks = nums[0] if nums else 1
            max_splits = nums[1] if len(nums) > 1 else MAX_SPLITS
            out[regime] = Tuning(int(r), int(small), block_s=int(bs), num_warps=int(warps), num_stages=int(stages),
                                 waves=float(waves), min_split_blocks=min_blocks, max_splits=max_splits)  # fmt: skip
        except ValueError:
            raise ValueError(f"{TUNING_ENV}: {part!r} is not regime=max_block_r,small_block_r,block_s,warps,"
                             "stages,waves[,min_split_blocks[,max_splits]]") from None  # fmt: skip
    return out


TUNING.update(_tuning_from_env(os.environ.get(TUNING_ENV, "")))  # after every entry is defined
# The largest row tile the launcher takes (16 warps; at head_dim 128 they spill registers on sm_90).
MAX_BLOCK_R = 256
# Used when the device is not a GPU (the interpreter): the SM count of an H100/H200.
DEFAULT_NUM_SMS = 132


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_block(
    rows: int, batch: int, num_kv_heads: int, num_sms: int, max_block_r: int = 128, small_grid_block_r: int = 64
) -> int:
    """Query rows per program: the next power of two >= 16, at most ``max_block_r``; at most
    ``small_grid_block_r`` when max_block_r tiles would give under one program per two SMs."""
    block = min(max(16, triton.next_power_of_2(rows)), max_block_r)
    if block > small_grid_block_r and batch * num_kv_heads * triton.cdiv(rows, block) < num_sms // 2:
        block = small_grid_block_r
    return block


def split_count(programs: int, capacity: int, block_s: int, num_sms: int, waves: float) -> int:
    """KV splits per program of the row grid, from static shapes only: ``waves`` x whole sets of
    ``programs`` per ``num_sms`` SMs, at most MAX_SPLITS and the cache's blocks."""
    want = int(waves * (num_sms // programs) + 1e-6)
    return max(1, min(want, MAX_SPLITS, triton.cdiv(capacity, block_s)))


def default_num_splits(
    batch: int, num_kv_heads: int, row_tiles: int, capacity: int, num_sms: int, block_s: int | None = None
) -> int:
    """Decode's KV splits (TUNING["decode"]): 32 at batch 1 with 8 kv heads on 132 SMs."""
    t = TUNING["decode"]
    return split_count(batch * num_kv_heads * row_tiles, capacity, block_s or t.block_s, num_sms, t.waves)


def pick_config(
    batch: int,
    rows: int,
    num_kv_heads: int,
    capacity: int,
    elem_size: int,
    num_sms: int,
    num_splits: int = 0,
    head_dim: int = 128,
) -> Config:
    """The launch shape from static shapes only (never seq_len: the op must stay graph-capturable).

    ``rows`` = Nq * G query rows per (request, kv head). Up to 16 rows (one tile) is the decode regime;
    more is the tree regime (``tree_d64`` for heads of 64 dims or fewer). ``num_splits`` > 0 pins the split
    count (the tests do; at most MAX_SPLITS).
    """
    t = TUNING["decode" if rows <= 16 else "tree" if head_dim > 64 else "tree_d64"]
    block_r = row_block(rows, batch, num_kv_heads, num_sms, t.max_block_r, t.small_grid_block_r)
    row_tiles = triton.cdiv(rows, block_r)
    warps = max(t.num_warps, block_r // 16)  # 8 warps for 128-row tiles, 16 for 256
    block_s, stages = t.block_s, t.num_stages
    if elem_size >= 4:
        block_s, stages = min(block_s, FP32_MAX_BLOCK_S), min(stages, FP32_MAX_STAGES)
    if num_splits <= 0:
        num_splits = min(
            split_count(batch * num_kv_heads * row_tiles, capacity, block_s, num_sms, t.waves), t.max_splits
        )
    splits = min(num_splits, MAX_SPLITS)
    extras = (t.merge_elems, t.half_partials, t.pdl, t.one_loop, t.balanced)
    return Config(block_r, block_s, splits, t.min_split_blocks, warps, stages, *extras)


# ---------------------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------------------


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
def _load_partials(
    part_lse_ptr,
    part_o_ptr,
    base,
    r0,
    num_live,
    tile_rows,
    BLOCK_R: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MERGE_SPLITS: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
):
    # The lse [MERGE_SPLITS, MERGE_ROWS] and partial outputs [.., HEAD_DIM] of rows r0 .. r0 + MERGE_ROWS - 1
    # of a tile, every live split; dead splits and rows past the tile read as lse -inf (weight 0) and 0.
    sp = tl.arange(0, MERGE_SPLITS)
    rows = r0 + tl.arange(0, MERGE_ROWS)
    ok = (sp < num_live)[:, None] & (rows < tile_rows)[None, :]
    idx = (base + sp)[:, None] * BLOCK_R + rows[None, :]
    lse = tl.load(part_lse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
    out = tl.load(
        part_o_ptr + idx[:, :, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, None, :],
        mask=ok[:, :, None],
        other=0.0,
        cache_modifier=".cg",
    )
    return lse, out.to(tl.float32)


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
    ticket_ptr,
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
    min_split_blocks,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    MERGE_SPLITS: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_PDL: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    BALANCED: tl.constexpr,
):
    # -- program id -> (request, kv head, row tile, split) ----------------------------------------------
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tile = pid % num_row_tiles
    kv_head = (pid // num_row_tiles) % num_kv_heads
    b = (pid // num_row_tiles // num_kv_heads).to(tl.int64)  # batch strides can pass 2**31 elements
    # Under torch.compile inductor passes Python floats as fp64 (or a constexpr); fp64 scores would make m_i
    # change type. Converted here, outside any branch: a branch may not change a variable's type.
    qk_scale = tl.full([], qk_scale, tl.float32)
    if USE_PDL:
        # Launched while the previous kernel finishes: wait for it (it may have written q, the window's K/V,
        # seq_len, or read what this kernel writes) before the first load or store. The next kernel may
        # launch at once (a PDL GEMV then fetches its weights during this one; kernels/pdl.py).
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()

    # -- this split's slot range, from seq_len on the device: at least min_split_blocks blocks a split, and
    # no more splits than the grid has; the splits past the live range exit here ---------------------------
    seq = tl.load(seq_len_ptr + b * stride_seq).to(tl.int32)
    # -- query rows: row r is query token r // G of query head kv_head * G + r % G. Loaded before the range
    # is known, so the two loads' latencies overlap ---------------------------------------------------------
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
    total = seq + num_win
    # As many live splits as give each at least min_split_blocks blocks (one at the least, num_splits at
    # the most), then the range cut evenly among them: a short context takes one split and no merge, a
    # long one the whole grid. With min_split_blocks 1 this is the grid's split count, capped by the blocks.
    nblocks = tl.cdiv(total, BLOCK_S)
    want = tl.maximum(tl.minimum(nblocks // min_split_blocks, num_splits), 1)
    if BALANCED:
        # Ranges of equal slot counts: every live split reads the same bytes, so the live programs finish
        # together at any context.
        per_split = tl.cdiv(total, want)
    else:
        # Ranges of whole blocks.
        per_split = tl.cdiv(nblocks, want) * BLOCK_S
    num_live = tl.cdiv(total, per_split)
    if split < num_live:
        start = split * per_split
        end = tl.minimum(start + per_split, total)
        # Blocks that end at or before seq are pure prefix: every row sees every slot, no mask needed. With
        # ONE_LOOP every block takes the masked loop instead: the split that holds the window then streams its
        # range in one pipelined loop, rather than starting the window's loads after the prefix loop ends.
        full_end = start + (tl.maximum(tl.minimum(end, seq) - start, 0) // BLOCK_S) * BLOCK_S
        if ONE_LOOP:
            full_end = start

        k_base = k_ptr + b * stride_kb + kv_head * stride_kh
        v_base = v_ptr + b * stride_vb + kv_head * stride_vh
        anc_base = anc_ptr + b * stride_ab + tok * stride_ai
        slots = tl.arange(0, BLOCK_S)

        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)

        # -- prefix blocks: unmasked loads ----------------------------------------------------------------
        for s0 in range(start, full_end, BLOCK_S):
            offs = s0 + slots
            k = tl.load(k_base + offs[:, None] * stride_ks + dims[None, :])
            v = tl.load(v_base + offs[:, None] * stride_vs + dims[None, :])
            acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k, v, None, qk_scale, False, DOT_PRECISION, UPCAST)

        # -- the prefix tail and the window: the ancestor mask decides ------------------------------------
        for s0 in range(full_end, end, BLOCK_S):
            offs = s0 + slots
            in_use = offs < end  # this split's slots only (its range ends at total, or where the next begins)
            # Masked loads (not multiply-by-zero) keep NaN garbage past the window out of the dot products.
            # Window slots a row may not see are finite (the contract), so their masked p = 0 adds nothing.
            k = tl.load(k_base + offs[:, None] * stride_ks + dims[None, :], mask=in_use[:, None], other=0.0)
            v = tl.load(v_base + offs[:, None] * stride_vs + dims[None, :], mask=in_use[:, None], other=0.0)
            rel = offs - seq
            is_win = (rel >= 0) & in_use
            anc_ptrs = anc_base[:, None] + rel[None, :] * stride_aj
            tree = tl.load(anc_ptrs, mask=row_ok[:, None] & is_win[None, :], other=0)
            allowed = (in_use & (offs < seq))[None, :] | (tree != 0)
            acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k, v, allowed, qk_scale, True, DOT_PRECISION, UPCAST)

        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_ptrs = o_ptr + b * stride_ob + tok[:, None] * stride_on + head[:, None] * stride_oh + dims[None, :]
        if num_live == 1:
            # -- one live split: the output itself ---------------------------------------------------------
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            # -- this split's normalized partial and its log-sum-exp; the last split to finish merges -------
            # A row that sees no slot of this split has m = -inf, so lse = -inf: a zero weight in the merge.
            lse = m_i + tl.math.log2(l_safe)
            local = tl.arange(0, BLOCK_R)
            base = pid.to(tl.int64) * num_splits
            tl.store(part_lse_ptr + (base + split) * BLOCK_R + local, lse, mask=row_ok)
            tl.store(
                part_o_ptr + ((base + split) * BLOCK_R + local[:, None]) * HEAD_DIM + dims[None, :],
                out.to(part_o_ptr.dtype.element_ty),
                mask=row_ok[:, None],
            )
            # The barrier orders every thread's partial stores before the ticket, which one thread takes
            # with release semantics; its acquire and the barrier Triton puts after a scalar atomic order the
            # merge's loads after it (the pattern of CUTLASS's semaphore).
            tl.debug_barrier()
            # The ticket counts the splits of this (request, kv head, row tile) that are done.
            ticket = tl.atomic_add(ticket_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if ticket == num_live - 1:
                # Merge every live split of MERGE_ROWS rows a step (the lse and the rows' outputs in one round
                # trip), in split order whichever split came last, so the result is deterministic. The next
                # step's loads are issued before this step's sums and store, so the round trips overlap (a
                # tree tile's 64 rows x 4 splits take four steps). .cg reads go to L2, past this SM's L1.
                tile_rows = tl.minimum(num_q * group - tile * BLOCK_R, BLOCK_R)
                r_off = tl.arange(0, MERGE_ROWS)
                lse_c, out_c = _load_partials(
                    part_lse_ptr, part_o_ptr, base, 0, num_live, tile_rows, BLOCK_R, HEAD_DIM, MERGE_SPLITS, MERGE_ROWS
                )
                for r0 in range(0, tile_rows, MERGE_ROWS):
                    lse_n, out_n = _load_partials(
                        part_lse_ptr,
                        part_o_ptr,
                        base,
                        r0 + MERGE_ROWS,
                        num_live,
                        tile_rows,
                        BLOCK_R,
                        HEAD_DIM,
                        MERGE_SPLITS,
                        MERGE_ROWS,
                    )
                    m = tl.max(lse_c, 0)
                    m_safe = tl.where(m == float("-inf"), 0.0, m)
                    w = tl.math.exp2(lse_c - m_safe[None, :])
                    l_sum = tl.sum(w, 0)
                    merged = tl.sum(w[:, :, None] * out_c, 0) / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
                    m_rows = tile * BLOCK_R + r0 + r_off
                    m_tok = m_rows // group
                    m_head = kv_head * group + m_rows % group
                    m_ptrs = o_ptr + b * stride_ob + m_tok[:, None] * stride_on + m_head[:, None] * stride_oh
                    tl.store(
                        m_ptrs + dims[None, :],
                        merged.to(o_ptr.dtype.element_ty),
                        mask=(r0 + r_off < tile_rows)[:, None],
                    )
                    lse_c, out_c = lse_n, out_n
                # Reset for the next call (and the next CUDA-graph replay): every live split has taken its
                # ticket by now, and the others never touch it.
                tl.atomic_xchg(ticket_ptr + pid, 0, sem="relaxed", scope="gpu")


# ---------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------

INTERPRETED = interpreted(_tree_attention_kernel)


def _launchable(kernel):
    # Interpreted kernels launch directly: wrap_triton accepts them only from torch 2.13 on.
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


# Ticket counters of the in-kernel merge, one int32 per (request, kv head, row tile), kept zero between
# calls: the merging program resets its own. One buffer per device, reused by every call and every captured
# graph; a grown buffer replaces it but the old ones stay alive, since graphs captured earlier point at them.
_TICKETS: dict[torch.device, torch.Tensor] = {}
_TICKETS_KEPT: list[torch.Tensor] = []


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    if torch.compiler.is_compiling():
        # A traced graph cannot hold on to a module-level buffer; a fresh zeroed one costs one fill.
        return torch.zeros(n, dtype=torch.int32, device=device)
    t = _TICKETS.get(device)
    if t is None or t.numel() < n:
        t = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _TICKETS[device] = t
        _TICKETS_KEPT.append(t)
    return t


def _launch(
    q, k_cache, v_cache, seq_len, anc, tickets, scale: float, cfg: Config, compile_only: bool = False
) -> torch.Tensor:
    # compile_only: compile the kernel these arguments launch, without launching it (the benchmark's sweep
    # compiles its shapes at once under triton.AsyncCompileMode); GPU only.
    B, Nq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    W = anc.shape[-1]
    G = Hq // Hkv
    row_tiles = triton.cdiv(Nq * G, cfg.block_r)
    programs = B * Hkv * row_tiles
    assert 16 <= cfg.block_r <= MAX_BLOCK_R and cfg.block_r & (cfg.block_r - 1) == 0, cfg
    assert 1 <= cfg.num_splits <= MAX_SPLITS, cfg
    assert tickets.numel() >= programs and tickets.dtype == torch.int32
    # anc goes in as bool: Triton reads it through an i1 pointer, one byte each. A uint8 view would do as
    # well in eager mode, but inductor cannot lower a bool -> uint8 view (torch 2.11).
    stride_ab = anc.stride(0) if anc.dim() == 3 else 0  # a shared [Nq, W] mask: every request reads it
    o = torch.empty_like(q)
    if cfg.num_splits == 1:
        # Unused (one live split writes o directly); distinct buffers so no argument aliases another.
        part_o = torch.empty(1, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(1, device=q.device, dtype=torch.float32)
    else:
        # fp32 partials unless the config asks for half ones (half the merge's bytes; a half-precision call only).
        part_dtype = q.dtype if cfg.half_partials and q.element_size() == 2 else torch.float32
        part_o = torch.empty((programs, cfg.num_splits, cfg.block_r, D), device=q.device, dtype=part_dtype)
        part_lse = torch.empty((programs, cfg.num_splits, cfg.block_r), device=q.device, dtype=torch.float32)
    # The merge loads every live split of as many of the tile's real rows a step as keep it at merge_elems
    # fp32 values a thread group of four warps (one row at the least).
    merge_splits = triton.next_power_of_2(cfg.num_splits)
    fit = cfg.merge_elems * cfg.num_warps // 4 // (merge_splits * D)
    merge_rows = min(cfg.block_r, triton.next_power_of_2(Nq * G), 1 << max(0, fit.bit_length() - 1))
    # fp32 models are the lossless reference runs: keep the dots in IEEE fp32, not TF32.
    upcast = INTERPRETED and q.dtype == torch.bfloat16
    dot_precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    # PDL in eager calls and CUDA graphs only: inductor's user-kernel path does not take launch_pdl.
    use_pdl = cfg.pdl and not INTERPRETED and not torch.compiler.is_compiling()
    grid = (programs, cfg.num_splits)
    kernel = _tree_attention_kernel.warmup if compile_only else _launchable(_tree_attention_kernel)[grid]
    kernel(
        q,
        k_cache,
        v_cache,
        seq_len,
        anc,
        o,
        part_o,
        part_lse,
        tickets,
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
        cfg.num_splits,
        cfg.min_split_blocks,
        scale * math.log2(math.e),
        HEAD_DIM=D,
        BLOCK_R=cfg.block_r,
        BLOCK_S=cfg.block_s,
        MERGE_SPLITS=merge_splits,
        MERGE_ROWS=merge_rows,
        DOT_PRECISION=dot_precision,
        UPCAST=upcast,
        USE_PDL=use_pdl,
        ONE_LOOP=cfg.one_loop,
        BALANCED=cfg.balanced,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"launch_pdl": True} if use_pdl else {}),
        **({"grid": grid} if compile_only else {}),
    )
    return o


@torch.library.triton_op("specpilot::tree_attention", mutates_args=())
def _tree_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    tickets: torch.Tensor,
    scale: float,
    num_splits: int,
) -> torch.Tensor:
    # tickets is written but left as it came (all zero): no mutation to declare. Under torch.compile the
    # kernel's writes are found anyway (wrap_triton's analysis) and the buffer is a fresh one (_tickets).
    return _launch(q, k_cache, v_cache, seq_len, anc, tickets, scale, _call_config(q, k_cache, num_splits))


def _call_config(q: torch.Tensor, k_cache: torch.Tensor, num_splits: int) -> Config:
    B, Nq, Hq, _ = q.shape
    Hkv = k_cache.shape[2]
    return pick_config(
        B, Nq * (Hq // Hkv), Hkv, k_cache.shape[1], q.element_size(), _num_sms(q.device), num_splits, q.shape[-1]
    )


# The PDL launch (kernels/pdl.py) as an opaque op: under torch.compile the triton_op above is traced into
# inductor's own launch, which drops the launch attribute. Same arguments, same kernel, same result.
@torch.library.custom_op("specpilot::tree_attention_pdl", mutates_args=())
def _tree_attention_pdl_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    tickets: torch.Tensor,
    scale: float,
    num_splits: int,
) -> torch.Tensor:
    cfg = _call_config(q, k_cache, num_splits)._replace(pdl=True)
    return _launch(q, k_cache, v_cache, seq_len, anc, tickets, scale, cfg)


@_tree_attention_pdl_op.register_fake
def _(q, k_cache, v_cache, seq_len, anc, tickets, scale, num_splits):
    return torch.empty_like(q)


def num_tickets(batch: int, num_q: int, num_heads: int, num_kv_heads: int) -> int:
    """Ticket counters a call needs: one per (request, kv head, row tile) of the smallest row tile (16 rows),
    whatever tile the config picks."""
    return batch * num_kv_heads * triton.cdiv(num_q * (num_heads // num_kv_heads), 16)


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    anc: torch.Tensor,
    scale: float | None = None,
    num_splits: int | None = None,
    tickets: torch.Tensor | None = None,
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
    tickets : optional zeroed int32 counters for the in-kernel merge, at least ``num_tickets(...)`` of them
        (``kernels/rope_cache`` zeroes them in its launch); None takes the per-device buffer (a fresh zeroed
        one under torch.compile)

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
    n = num_tickets(B, Nq, Hq, k_cache.shape[2])
    if tickets is None:
        tickets = _tickets(q.device, n)
    elif tickets.dtype != torch.int32 or tickets.numel() < n:
        raise ValueError(f"tickets: {n} int32 counters needed, got {tickets.numel()} {tickets.dtype}")
    op = _tree_attention_pdl_op if uses_pdl(q, INTERPRETED) else _tree_attention_op
    return op(q, k_cache, v_cache, seq_len, anc, tickets, float(scale), num_splits or 0)


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
