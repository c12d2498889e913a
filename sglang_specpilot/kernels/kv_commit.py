"""Move a tree round's accepted K/V into place, for every layer in one launch (Triton), and its reference.

Why: ``KVCache.commit`` gathered every layer's K and V at all D + 1 path entries of every row and scattered
them back, moved or not: the lifted 8B's commit at 16 rows ran four index kernels of ~22 us (90 us of the
(6, 8) tree round's 9.9 ms, H100, ``round_profile_b16`` in batched_h100.json at 937d7ec), though a row
accepts ~2 nodes and an accepted node already in its slot (the first child each depth) needs no move. Here
one program per (row, layer and K or V, block of a slot's values) walks its row's path in order and moves
only entries up to the accepted length whose node is not already in place.

Order: node ``path[t]`` moves from slot ``seq + path[t]`` to ``seq + t``. A path is increasing with
``path[t] >= t``, so walking t upwards reads each source before any write can land on it (a write to slot
``seq + t'`` with t' < t never equals ``seq + path[t]`` >= ``seq + t``), and programs share no slots.

``kv_commit_ref`` is the reference: every entry gathered first, then scattered (the PyTorch path).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs without triton: the reference only
    triton = None

from .launch import runs_on


def kv_commit_ref(storage: torch.Tensor, seq_len: torch.Tensor, path: torch.Tensor) -> None:
    """storage [L, 2, B_max, S, H, D]; seq_len [B]; path [B, A]: node ``path[b, t]``'s K/V moves from slot
    ``seq_len[b] + path[b, t]`` to ``seq_len[b] + t`` in every layer, sources all read before any write."""
    B, A = path.shape
    b = torch.arange(B, device=path.device)[:, None]
    src = seq_len[:, None] + path
    dst = seq_len[:, None] + torch.arange(A, device=path.device)
    kv = storage[:, :, :B]
    moved = kv[:, :, b, src]
    kv[:, :, b, dst] = moved


if triton is not None:

    @triton.jit
    def _kv_commit_kernel(
        kv_ptr,
        seq_ptr,
        path_ptr,
        n_ptr,
        stride_lk,
        stride_b,
        stride_s,
        ROW: tl.constexpr,
        A: tl.constexpr,
        BLOCK: tl.constexpr,
        HAS_N: tl.constexpr,
    ):
        b = tl.program_id(0)
        lk = tl.program_id(1)  # layer * 2 + (0: K, 1: V)
        offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < ROW
        seq = tl.load(seq_ptr + b).to(tl.int64)
        if HAS_N:
            last = tl.load(n_ptr + b)  # entries 0 .. n (the root and n accepted nodes); the rest are padding
        else:
            last = tl.full([], A - 1, tl.int32)
        base = kv_ptr + lk.to(tl.int64) * stride_lk + b.to(tl.int64) * stride_b
        for t in tl.static_range(A):
            p = tl.load(path_ptr + b * A + t).to(tl.int64)
            if (p != t) & (t <= last):
                v = tl.load(base + (seq + p) * stride_s + offs, mask=ok)
                tl.store(base + (seq + t) * stride_s + offs, v, mask=ok)

else:  # pragma: no cover
    _kv_commit_kernel = None

BLOCK = 1024  # a slot's values a program moves: the lifted 8B's 8 K/V heads of 128 in one program


def kv_commit(storage: torch.Tensor, seq_len: torch.Tensor, path: torch.Tensor, n: torch.Tensor | None = None) -> None:
    """``kv_commit_ref``, moving only entries ``t <= n[b]`` (when ``n``, the accepted lengths [B], is given)
    whose node is not already in place; the reference where the kernel cannot run (CPU without the
    interpreter). Entries past ``n`` land past the new sequence end, where nothing reads them, so skipping them
    changes nothing that is read."""
    if not runs_on(storage, _kv_commit_kernel) or storage.stride(-1) != 1 or storage.stride(-2) != storage.shape[-1]:
        kv_commit_ref(storage, seq_len, path)
        return
    L2 = storage.shape[0] * storage.shape[1]
    B, A = path.shape
    row = storage.shape[-2] * storage.shape[-1]
    flat = storage.view(L2, *storage.shape[2:])  # [L * 2, B_max, S, H, D]: layers and K/V, one stride
    path = path.contiguous()
    seq = seq_len.contiguous()
    n_arg = n.to(torch.int32).contiguous() if n is not None else seq
    _kv_commit_kernel[(B, L2, triton.cdiv(row, BLOCK))](
        flat, seq, path, n_arg, flat.stride(0), flat.stride(1), flat.stride(2),
        ROW=row, A=A, BLOCK=BLOCK, HAS_N=n is not None, num_warps=4,
    )  # fmt: skip
