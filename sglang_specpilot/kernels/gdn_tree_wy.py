"""TreeWY verify: the gated delta rule over every root path of a verify tree in one launch, on tensor cores.

The math is ``models/gdn_ops.tree_wy`` (its docstring derives it). Per (request, value head), with the
block's T nodes in a topological order, anc[t, s] = s is an ancestor of t or t itself, and the path
log-decay G_t = sum_{s anc t} g_s:

    A[t, s] = beta_t exp(G_t - G_s) (k_t . k_s)                 s a strict ancestor of t, else 0
    u       = (I + A)^{-1} beta (v - exp(G) (k S_0))            [T, d_v]: one solve for all paths
    o       = exp(G) (q S_0) + (exp(G_t - G_s) (q_t . k_s))_{s anc t} u

The u of a shared prefix node is computed once and serves every path through it (TreeWY's point: no
state per node, T (d_k + d_v + 1) numbers kept per head instead of T d_k d_v).

The solve on tensor cores. A is nonzero only from a node to its strict ancestors, so a product of j
factors A needs an ancestor chain of j + 1 nodes: A^L = 0 when the tree has L levels (depths 0 .. L-1).
(I + A)^{-1} is then the finite Neumann series sum_{j < L} (-A)^j, which telescopes into
ceil(log2 L) factors,

    (I + A)^{-1} = (I - A)(I + A^2)(I + A^4) ... (I + A^(2^(m-1))),     2^m >= L,

so the inverse is 2m - 2 [T, T] x [T, T] products (m = 3 for a depth-7 tree), where the forward
substitution of a chunked WY kernel would walk T rows one after another. Every product here is a
``tl.dot``: k k^T, q k^T, k S_0, q S_0, the squarings, and the two [T, T] x [T, BV] products. On the GPU
the fp32 dots run as 3xTF32 (``tf32x3``: fp32-level accuracy on the tensor cores, the "within one bf16
ulp of the exact path recurrence" promise needs more than plain TF32's 10 bits); in the interpreter they
are IEEE fp32.

The grid is (d_v / BV, B * H): a program owns BV value columns of one head. It first streams d_k in
chunks, accumulating k k^T, q k^T, k S_0 and q S_0, then builds A, inverts it and finishes in registers.
A and its inverse depend on k, beta and g only, so each value block recomputes them ([T, T] work against
the [T, d_k] x [d_k, BV] products; a second launch through global memory would cost more here). Nothing
is read on the host and the outputs come from ``torch.empty`` (inside a capture: the graph's pool), so
the op is capturable in a CUDA graph. T, d_k and d_v need not be powers of two: blocks are padded and
masked (padded nodes have no ancestors and zero k, v, so they stay zero).

``gdn_tree_wy`` is a ``torch.library.triton_op`` (``specpilot::gdn_tree_wy``). On the CPU it runs the
PyTorch reference unless ``TRITON_INTERPRET=1`` was set before triton was imported.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..models.gdn_ops import tree_wy
from .launch import interpreted

# The largest block the kernel takes: the verify tree (budget + 1 nodes) padded to a power of two. At 64
# nodes the [T, T] work already fills one program's registers (the notes below); larger trees take the
# PyTorch form.
MAX_NODES = 64
MAX_HEAD_DIM = 128
# Used when the device is not a GPU (the interpreter): the SM count of an H100/H200.
DEFAULT_NUM_SMS = 132
# sm_90 builds (Triton 3.6, d_k = d_v = 128, depth-6 tree, 3xTF32; registers / bytes spilled a thread):
#   T = 33 (64-row block), 8 warps, BV 32: d_k chunks of 16 / 32 / 64 / 128 -> 255 / 80, 120, 816, 2232;
#     BV 64 -> 488 at chunks of 16; 16 warps (128 registers) -> 960 at chunks of 32; one stage -> 280
#   T = 32 and 17 (32-row block), 4 warps, chunks of 16: 255 / 0 (BV 32 or 64); T = 7: 118 / 0
#   a prefill chunk (T = 64, 64 levels: six squarings), 8 warps, BV 32, chunks of 16: 255 / 312
# What spills at T = 64 is the [T, T] work after the loop (mask, decays, A, its powers, the inverse): the
# same build with one squaring (levels <= 2) spills 8 bytes. Chunks of 16 it is, and BV <= 32 there.
CHUNK_K = 16
NUM_STAGES = 2


# ---------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------


class Config(NamedTuple):
    block_t: int  # nodes, padded to a power of two >= 16 (tl.dot's smallest tile)
    chunk_k: int  # d_k columns per step of the products' loop
    block_v: int  # value columns per program
    squarings: int  # m with 2^m >= the tree's levels (see the module docstring)
    num_warps: int
    num_stages: int


def squarings_for(levels: int) -> int:
    """m = ceil(log2 levels), at least 1: the factors of the telescoped inverse."""
    return max(1, math.ceil(math.log2(max(1, levels))))


def pick_config(batch: int, heads: int, nodes: int, dk: int, dv: int, levels: int, num_sms: int) -> Config:
    """The launch shape from static shapes only. BV: the widest of 64 / 32 / 16 value columns whose grid
    reaches half the SMs (B H = 32 heads at batch 1 on 132 SMs: BV = 32, 128 programs; narrower blocks
    would only repeat each head's [T, T] solve more often). Untimed: no H200 sweep has run yet; the
    chunk, warps and stages come from sm_90 compiles (the notes above ``CHUNK_K``)."""
    block_t = max(16, triton.next_power_of_2(nodes))
    dv_pad = max(16, triton.next_power_of_2(dv))
    block_v = min(64 if block_t < 64 else 32, dv_pad)
    while block_v > 16 and batch * heads * triton.cdiv(dv, block_v) < num_sms // 2:
        block_v //= 2
    chunk_k = min(CHUNK_K, max(16, triton.next_power_of_2(dk)))
    warps = 8 if block_t >= 64 else 4
    return Config(block_t, chunk_k, block_v, squarings_for(levels), warps, NUM_STAGES)


# ---------------------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _gdn_tree_wy_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    s0_ptr,
    anc_ptr,
    o_ptr,
    u_ptr,
    G_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_gb,
    stride_gt,
    stride_gh,
    stride_bb,
    stride_bt,
    stride_bh,
    stride_sb,
    stride_sh,
    stride_sk,
    stride_sv,
    stride_ab,
    stride_ai,
    stride_aj,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_Gb,
    stride_Gt,
    num_nodes,
    num_heads,
    dk,
    dv,
    BLOCK_T: tl.constexpr,
    CHUNK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SQUARINGS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # -- program id -> (request, head, value block) --------------------------------------------------------
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    t = tl.arange(0, BLOCK_T)
    vv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_ok = t < num_nodes
    v_ok = vv < dv

    # -- the four products over d_k, CHUNK_K columns at a time: k k^T, q k^T [T, T]; k S_0, q S_0 [T, BV].
    # Chunks, not whole [T, d_k] tiles: at T = 64, d_k = 128 the whole q and k tiles (and 3xTF32's split
    # copies of them) took all 255 registers and spilled 1.4 KB a thread on sm_90 ---------------------------
    q_base = q_ptr + b * stride_qb + h * stride_qh + t[:, None] * stride_qt
    k_base = k_ptr + b * stride_kb + h * stride_kh + t[:, None] * stride_kt
    s_base = s0_ptr + b * stride_sb + h * stride_sh + vv[None, :] * stride_sv
    kk_acc = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
    qk_acc = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
    ks_acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
    qs_acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
    for c0 in range(0, dk, CHUNK_K):
        kc = c0 + tl.arange(0, CHUNK_K)
        c_ok = kc < dk
        tk_mask = t_ok[:, None] & c_ok[None, :]
        q = tl.load(q_base + kc[None, :] * stride_qd, mask=tk_mask, other=0.0)
        k = tl.load(k_base + kc[None, :] * stride_kd, mask=tk_mask, other=0.0)
        s0 = tl.load(s_base + kc[:, None] * stride_sk, mask=c_ok[:, None] & v_ok[None, :], other=0.0)
        kt = tl.trans(k)
        kk_acc = tl.dot(k, kt, kk_acc, input_precision=DOT_PRECISION)
        qk_acc = tl.dot(q, kt, qk_acc, input_precision=DOT_PRECISION)
        ks_acc = tl.dot(k, s0, ks_acc, input_precision=DOT_PRECISION)
        qs_acc = tl.dot(q, s0, qs_acc, input_precision=DOT_PRECISION)

    # -- the tree: ancestor mask, path log-decays G_t = sum_{s anc t} g_s ---------------------------------
    anc = tl.load(
        anc_ptr + b * stride_ab + t[:, None] * stride_ai + t[None, :] * stride_aj,
        mask=t_ok[:, None] & t_ok[None, :],
        other=0,
    )
    anc = anc != 0
    g = tl.load(g_ptr + b * stride_gb + t * stride_gt + h * stride_gh, mask=t_ok, other=0.0)
    beta = tl.load(beta_ptr + b * stride_bb + t * stride_bt + h * stride_bh, mask=t_ok, other=0.0)
    G = tl.sum(tl.where(anc, g[None, :], 0.0), 1)
    # exp(G_t - G_s) <= 1 on ancestors (g <= 0); masked before exp so off-path entries never overflow.
    decay = tl.exp(tl.where(anc, G[:, None] - G[None, :], float("-inf")))
    gamma = tl.exp(G)
    diag = t[:, None] == t[None, :]
    strict = anc & (t[:, None] != t[None, :])
    A = tl.where(strict, beta[:, None] * decay * kk_acc, 0.0)
    qk = tl.where(anc, decay * qk_acc, 0.0)

    # -- (I + A)^{-1} = (I - A)(I + A^2)(I + A^4)..., exact once 2^SQUARINGS >= the tree's levels -----------
    # inv (I + P) as inv + P inv (the factors are polynomials in A, so they commute): P inv accumulates
    # straight into inv, and no [T, T] identity or I + P stays live (sm_90, T = 64: 168 -> 8 bytes spilled).
    inv = tl.where(diag, 1.0, 0.0) - A
    power = A
    for _ in tl.static_range(SQUARINGS - 1):
        power = tl.dot(power, power, input_precision=DOT_PRECISION)
        inv = tl.dot(power, inv, inv, input_precision=DOT_PRECISION)

    # -- this program's value columns: v [BLOCK_T, BLOCK_V], then u and o ------------------------------------
    tv_mask = t_ok[:, None] & v_ok[None, :]
    v = tl.load(
        v_ptr + b * stride_vb + t[:, None] * stride_vt + h * stride_vh + vv[None, :] * stride_vd,
        mask=tv_mask,
        other=0.0,
    )
    rhs = beta[:, None] * (v - gamma[:, None] * ks_acc)
    u = tl.dot(inv, rhs, input_precision=DOT_PRECISION)
    o = tl.dot(qk, u, gamma[:, None] * qs_acc, input_precision=DOT_PRECISION)

    # -- stores: o and u share a layout [B, T, H, d_v]; G once per head -----------------------------------
    out_off = b * stride_ob + t[:, None] * stride_ot + h * stride_oh + vv[None, :]
    tl.store(o_ptr + out_off, o, mask=tv_mask)
    tl.store(u_ptr + out_off, u, mask=tv_mask)
    if pid_v == 0:
        tl.store(G_ptr + b * stride_Gb + t * stride_Gt + h, G, mask=t_ok)


# ---------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------

INTERPRETED = interpreted(_gdn_tree_wy_kernel)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launchable(kernel):
    # Interpreted kernels launch directly: wrap_triton accepts them only from torch 2.13 on.
    return kernel if INTERPRETED else torch.library.wrap_triton(kernel)


def _launch(q, k, v, g, beta, S0, anc, cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The op's body with the launch shape given: the hybrid suite's --sweep times configs through it.
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    o = torch.empty(B, T, H, dv, device=q.device, dtype=torch.float32)
    u = torch.empty_like(o)
    G = torch.empty(B, T, H, device=q.device, dtype=torch.float32)
    stride_ab = anc.stride(0) if anc.dim() == 3 else 0  # a shared [T, T] mask: every request reads it
    grid = (triton.cdiv(dv, cfg.block_v), B * H)
    _launchable(_gdn_tree_wy_kernel)[grid](
        q,
        k,
        v,
        g,
        beta,
        S0,
        anc,
        o,
        u,
        G,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *g.stride(),
        *beta.stride(),
        *S0.stride(),
        stride_ab,
        anc.stride(-2),
        anc.stride(-1),
        *o.stride()[:3],
        G.stride(0),
        G.stride(1),
        T,
        H,
        dk,
        dv,
        BLOCK_T=cfg.block_t,
        CHUNK_K=cfg.chunk_k,
        BLOCK_V=cfg.block_v,
        SQUARINGS=cfg.squarings,
        DOT_PRECISION="ieee" if INTERPRETED else "tf32x3",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return o, u, G


@torch.library.triton_op("specpilot::gdn_tree_wy", mutates_args=())
def _gdn_tree_wy_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    S0: torch.Tensor,
    anc: torch.Tensor,
    levels: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H, dk = q.shape
    cfg = pick_config(B, H, T, dk, v.shape[-1], levels, _num_sms(q.device))
    return _launch(q, k, v, g, beta, S0, anc, cfg)


def supported(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel takes these inputs here: fp32, T <= MAX_NODES, head dims <= MAX_HEAD_DIM, on a GPU
    or under the interpreter. Elsewhere ``gdn_tree_wy`` runs the PyTorch reference."""
    native = q.device.type == "cuda" or (INTERPRETED and q.device.type == "cpu")
    return (
        native
        and q.dtype == torch.float32
        and q.shape[1] <= MAX_NODES
        and q.shape[-1] <= MAX_HEAD_DIM
        and v.shape[-1] <= MAX_HEAD_DIM
    )


def gdn_tree_wy(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    S0: torch.Tensor,
    anc: torch.Tensor,
    levels: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gated delta rule along every root path of a verify block (``gdn_ops.tree_wy``'s contract).

    Parameters
    ----------
    q, k : [B, T, H, d_k] float32, any strides (q scaled by d_k^-1/2, both L2-normalised)
    v : [B, T, H, d_v] float32, any strides (the layer's convolution output is time-major)
    g, beta : [B, T, H] float32; g <= 0 the log decay, beta the write strength
    S0 : [B, H, d_k, d_v] float32: each row's committed state
    anc : [T, T] or [B, T, T] bool, anc[t, s] = s is an ancestor of t or t itself, topological order
    levels : an upper bound on the tree's depth + 1 (default T, always safe); the solve is exact only if
        no root path is longer. Static: it picks the kernel's unrolled squarings.

    Returns
    -------
    o : [B, T, H, d_v] float32, o_t = S_t^T q_t with S_t the state along t's root path
    u : [B, T, H, d_v] float32, the WY pseudo-values (``gdn_ops.state_at`` rebuilds any node's state)
    G : [B, T, H] float32, log gamma_t along t's root path
    """
    B, T, H, dk = q.shape
    levels = T if levels is None else min(levels, T)
    if not supported(q, v):
        return tree_wy(q, k, v, g, beta, S0, anc)
    assert k.shape == q.shape and v.shape[:3] == (B, T, H), "q, k: [B, T, H, d_k]; v: [B, T, H, d_v]"
    assert g.shape == (B, T, H) and beta.shape == (B, T, H), "g, beta: [B, T, H]"
    assert S0.shape == (B, H, dk, v.shape[-1]), "S0: [B, H, d_k, d_v]"
    assert anc.dtype == torch.bool and anc.shape[-2:] == (T, T), "anc: [T, T] or [B, T, T] bool"
    assert all(x.dtype == torch.float32 for x in (k, v, g, beta, S0)), "float32 inputs"
    return _gdn_tree_wy_op(q, k, v, g, beta, S0, anc, levels)


# ---------------------------------------------------------------------------------------------------------
# Reference and accuracy
# ---------------------------------------------------------------------------------------------------------

# The kernel's reference is the path recurrence (``engine/gdn_verify.PathRecompute``: every node stepped
# from its parent's state, level by level); ``gdn_ops.tree_wy`` is the same math as this kernel in PyTorch.
gdn_tree_wy_ref = tree_wy


def bf16_ulps_at_scale(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|a - ref| in bf16 ulps of max(|ref|, the RMS of ref's last dim), as float64 (not rounded).

    Elements at or above their vector's RMS are held to their own ulp; smaller ones to the RMS's, since an
    element's own ulp near zero says nothing: the fp32 path recurrence itself is up to 164 elementwise bf16
    ulps from a float64 solve at the Qwen3-Next shapes (a 1e-7 difference on an element of 1e-6), while
    0.01 at this scale. It is also the scale the layer's gated RMSNorm divides by, per head vector."""
    r = ref.double()
    rms = r.pow(2).mean(-1, keepdim=True).sqrt()
    scale = torch.maximum(r.abs(), rms).clamp_min(torch.finfo(torch.bfloat16).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)  # bf16 keeps 7 explicit mantissa bits
    return (a.double() - r).abs() / ulp


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance between a and b rounded to bfloat16, in bf16 steps (0: the same bf16 value,
    1: neighbours). Bit patterns are mapped to a monotonic integer line, so the distance crosses zero."""

    def line(x):
        i = x.to(torch.bfloat16).view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)  # sign-magnitude -> two's complement order; -0 = +0

    return (line(a) - line(b)).abs()
