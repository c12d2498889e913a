"""Cross-model interleaved GEMM: output tiles of unrelated GEMMs, from both models, in one launch.

The idea (Conjugate Compilation, interleaved kernels). A small draft GEMM (Llama-3.2-1B: 1.4-3.5 TB/s on
the H200, see DEVICE.md) leaves most SMs idle and its last wave partial; running its tiles in the same
launch as a target GEMM fills that capacity. Each member ``y_k = x_k @ w_k^T (+ b_k)`` is cut into units of
one (BLOCK_M x BLOCK_N) output tile and one reduction slice ``[k_lo, k_hi)``. A descriptor table, one
row per unit, says which member the unit belongs to, its tile, its slice and the member's operand
addresses and strides, so members of any shape, stored anywhere, share the kernel. A unit reads and
accumulates only its own member's data: every member's mathematics is unchanged.

Units are ordered so that every stretch of the launch carries each member's work in proportion to its
share of the group's arithmetic (``pi_k = F_k / sum F``): unit i of member k gets the key
``(i + 0.5) / units_k``, and keys are merged in order. Members with several reduction slices accumulate
their fp32 partial tiles atomically into a workspace that the launcher casts into the output (the order
of the atomic adds is not fixed, so such members are deterministic only up to fp32 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..kernels.launch import interpreted

# Descriptor row layout (int64): one row per unit.
D_MEMBER, D_TILE_M, D_TILE_N, D_K_LO, D_K_HI = 0, 1, 2, 3, 4
D_X, D_W, D_Y, D_BIAS = 5, 6, 7, 8
D_M, D_N, D_K = 9, 10, 11
D_STRIDE_X, D_STRIDE_W, D_STRIDE_Y = 12, 13, 14
D_FLAGS = 15
DESC_WIDTH = 16
FLAG_BIAS, FLAG_ATOMIC = 1, 2


@dataclass
class GemmMember:
    """One GEMM of a group: ``y = x @ w^T + bias``; x [M, K], w [N, K] (nn.Linear layout), y [M, N]."""

    x: torch.Tensor
    w: torch.Tensor
    bias: torch.Tensor | None = None
    split_k: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.x.shape[0] * self.w.shape[0] * self.w.shape[1]


def gemm_ref(members: list[GemmMember]) -> list[torch.Tensor]:
    """The separate kernels: one ``F.linear`` per member, exactly what the model's layers run."""
    return [torch.nn.functional.linear(m.x, m.w, m.bias) for m in members]


def interleave_order(units_per_member: list[int]) -> list[tuple[int, int]]:
    """(member, local unit index) in launch order: each member's units spread evenly over the launch."""
    keys = [((i + 0.5) / n, k, i) for k, n in enumerate(units_per_member) for i in range(n)]
    return [(k, i) for _, k, i in sorted(keys)]


def proportions(flops: list[int]) -> list[float]:
    """Interleaving proportions pi_k = F_k / sum_j F_j (derived from the group, never searched)."""
    total = float(sum(flops))
    return [f / total for f in flops]


def build_descriptors(
    members: list[GemmMember], outs: list[torch.Tensor], block_m: int, block_n: int, block_k: int
) -> torch.Tensor:
    """The descriptor table [units, DESC_WIDTH] int64 on the members' device (host-built, static shapes)."""
    per_member: list[list[list[int]]] = []
    for k, (m, y) in enumerate(zip(members, outs, strict=True)):
        M, K = m.x.shape
        N = m.w.shape[0]
        # Slices are whole BLOCK_K steps so a slice boundary never cuts a K tile.
        k_steps = triton.cdiv(K, block_k)
        split = max(1, min(m.split_k, k_steps))
        per = triton.cdiv(k_steps, split)
        flags = (FLAG_BIAS if m.bias is not None else 0) | (FLAG_ATOMIC if split > 1 else 0)
        bias_addr = m.bias.data_ptr() if m.bias is not None else 0
        rows = []
        for tm in range(triton.cdiv(M, block_m)):
            for tn in range(triton.cdiv(N, block_n)):
                for s in range(split):
                    lo, hi = s * per * block_k, min(K, (s + 1) * per * block_k)
                    if lo >= hi:
                        continue
                    row = [0] * DESC_WIDTH
                    row[D_MEMBER], row[D_TILE_M], row[D_TILE_N], row[D_K_LO], row[D_K_HI] = k, tm, tn, lo, hi
                    row[D_X], row[D_W], row[D_Y], row[D_BIAS] = m.x.data_ptr(), m.w.data_ptr(), y.data_ptr(), bias_addr
                    row[D_M], row[D_N], row[D_K] = M, N, K
                    row[D_STRIDE_X], row[D_STRIDE_W], row[D_STRIDE_Y] = m.x.stride(0), m.w.stride(0), y.stride(0)
                    # Bias is added by the first slice only, or atomically summed slices would repeat it.
                    row[D_FLAGS] = flags if s == 0 else flags & ~FLAG_BIAS
                    rows.append(row)
        per_member.append(rows)
    order = interleave_order([len(r) for r in per_member])
    table = [per_member[k][i] for k, i in order]
    return torch.tensor(table, dtype=torch.int64, device=members[0].x.device)


@triton.jit
def _grouped_gemm_kernel(
    desc_ptr,
    ELEM: tl.constexpr,
    OUT_ELEM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DESC_W: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # -- this unit's descriptor ------------------------------------------------------------------------
    row = desc_ptr + tl.program_id(0).to(tl.int64) * DESC_W
    tile_m = tl.load(row + 1)
    tile_n = tl.load(row + 2)
    k_lo = tl.load(row + 3)
    k_hi = tl.load(row + 4)
    x_ptr = tl.load(row + 5).to(tl.pointer_type(ELEM))
    w_ptr = tl.load(row + 6).to(tl.pointer_type(ELEM))
    M = tl.load(row + 9)
    N = tl.load(row + 10)
    stride_x = tl.load(row + 12)
    stride_w = tl.load(row + 13)
    stride_y = tl.load(row + 14)
    flags = tl.load(row + 15)

    # -- pointers of the first K tile --------------------------------------------------------------------
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    # -- the reduction slice [k_lo, k_hi) ---------------------------------------------------------------
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < k_hi
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_w + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if UPCAST:
            # Interpreter only: its bf16 tl.dot multiplies raw bit patterns (see kernels/tree_attention.py);
            # bf16 x bf16 products are exact in fp32, which is what the tensor cores compute.
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)

    # -- bias, then a plain store or an atomic accumulation into the fp32 workspace ---------------------
    if flags & 1:
        b_ptr = tl.load(row + 8).to(tl.pointer_type(ELEM))
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if flags & 2:
        acc_ptr = tl.load(row + 7).to(tl.pointer_type(tl.float32))
        tl.atomic_add(acc_ptr + offs_m[:, None] * stride_y + offs_n[None, :], acc, mask=mask)
    else:
        y_ptr = tl.load(row + 7).to(tl.pointer_type(OUT_ELEM))
        tl.store(y_ptr + offs_m[:, None] * stride_y + offs_n[None, :], acc.to(OUT_ELEM), mask=mask)


INTERPRETED = interpreted(_grouped_gemm_kernel)
_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def kernel_available(device: torch.device) -> bool:
    """The Triton kernel runs on CUDA, or on the CPU under TRITON_INTERPRET=1; elsewhere the reference."""
    return device.type == "cuda" or INTERPRETED


class GroupedGemm:
    """A grouped GEMM bound to fixed operands: the descriptor table is built once, so every call is one
    launch with no host work and the call can be captured in a CUDA graph (addresses must not change).

    Parameters
    ----------
    members : list of GemmMember
        Same dtype and device; x_k and w_k contiguous along K (stride 1).
    outs : list of torch.Tensor
        y_k [M_k, N_k] in the members' dtype, written by every call.
    block_m, block_n, block_k : int
        Tile sizes (powers of two, >= 16 for ``tl.dot``).
    """

    def __init__(
        self,
        members: list[GemmMember],
        outs: list[torch.Tensor],
        *,
        block_m: int = 16,
        block_n: int = 64,
        block_k: int = 64,
        num_warps: int = 4,
        num_stages: int = 3,
    ):
        if not members:
            raise ValueError("a grouped GEMM needs at least one member")
        dtype, dev = members[0].x.dtype, members[0].x.device
        for m, y in zip(members, outs, strict=True):
            if m.x.dim() != 2 or m.w.dim() != 2 or m.x.shape[1] != m.w.shape[1]:
                raise ValueError(f"member shapes x {tuple(m.x.shape)} w {tuple(m.w.shape)} do not multiply")
            if {m.x.dtype, m.w.dtype, y.dtype} != {dtype} or {m.x.device, m.w.device, y.device} != {dev}:
                raise ValueError("members of one grouped GEMM share dtype and device")
            if m.x.stride(1) != 1 or m.w.stride(1) != 1 or y.stride(1) != 1:
                raise ValueError("x, w and y must be contiguous along their last dimension")
            if tuple(y.shape) != (m.x.shape[0], m.w.shape[0]):
                raise ValueError(f"output shape {tuple(y.shape)} != {(m.x.shape[0], m.w.shape[0])}")
        for b in (block_m, block_n, block_k):
            if b < 16 or b & (b - 1):
                raise ValueError(f"block sizes must be powers of two >= 16, got {b}")
        self.members, self.outs, self.dtype, self.device = members, outs, dtype, dev
        self.blocks = (block_m, block_n, block_k)
        self.launch = {} if INTERPRETED else {"num_warps": num_warps, "num_stages": num_stages}
        self.use_kernel = kernel_available(dev)
        self.desc = None
        if self.use_kernel:
            # Members cut into several reduction slices accumulate in fp32 workspaces, cast back after.
            self.work = [
                torch.zeros(y.shape, dtype=torch.float32, device=dev) if m.split_k > 1 else None
                for m, y in zip(members, outs, strict=True)
            ]
            targets = [w if w is not None else y for w, y in zip(self.work, outs, strict=True)]
            self.desc = build_descriptors(members, targets, block_m, block_n, block_k)

    @property
    def units(self) -> int:
        return 0 if self.desc is None else int(self.desc.shape[0])

    def __call__(self) -> list[torch.Tensor]:
        if not self.use_kernel:
            for y, r in zip(self.outs, gemm_ref(self.members), strict=True):
                y.copy_(r)
            return self.outs
        for w in self.work:
            if w is not None:
                w.zero_()
        upcast = INTERPRETED and self.dtype != torch.float32
        # fp32 members are reference runs: IEEE fp32 dots, not TF32.
        precision = "ieee" if self.dtype == torch.float32 or upcast else "tf32"
        bm, bn, bk = self.blocks
        _grouped_gemm_kernel[(self.units,)](
            self.desc,
            ELEM=_TL_DTYPE[self.dtype],
            OUT_ELEM=_TL_DTYPE[self.dtype],
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            DESC_W=DESC_WIDTH,
            DOT_PRECISION=precision,
            UPCAST=upcast,
            **self.launch,
        )
        for y, w in zip(self.outs, self.work, strict=True):
            if w is not None:
                y.copy_(w)
        return self.outs


def grouped_gemm(
    members: list[GemmMember], *, block_m: int = 16, block_n: int = 64, block_k: int = 64
) -> list[torch.Tensor]:
    """One-shot grouped GEMM: returns ``[x_k @ w_k^T + b_k]`` computed in one launch (see GroupedGemm)."""
    outs = [torch.empty(m.x.shape[0], m.w.shape[0], dtype=m.x.dtype, device=m.x.device) for m in members]
    return GroupedGemm(members, outs, block_m=block_m, block_n=block_n, block_k=block_k)()
