"""The gated delta rule in plain PyTorch: the recurrent step and the WY (chunked / tree) form.

Per value head, with state S in R^{d_k x d_v}, log-decay g_t <= 0 (alpha_t = exp(g_t)), write strength
beta_t in (0, 1), L2-normalised key k_t and query q_t (q already scaled by d_k^-1/2):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,        o_t = S_t^T q_t

(Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule"). Writing
u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t), S_t = alpha_t S_{t-1} + k_t u_t^T, and unrolling from S_0 with
gamma_t = prod_{r <= t} alpha_r:

    S_t = gamma_t S_0 + sum_{s <= t} (gamma_t / gamma_s) k_s u_s^T
    u_t = beta_t (v_t - gamma_t S_0^T k_t - sum_{s < t} (gamma_t / gamma_s) (k_t . k_s) u_s)
    o_t = gamma_t S_0^T q_t + sum_{s <= t} (gamma_t / gamma_s) (q_t . k_s) u_s

so U = (I + A)^{-1} R with A[t, s] = beta_t (gamma_t / gamma_s) (k_t . k_s) for s < t, unit lower
triangular: the WY representation of the chunk. Nothing above uses "s < t" except through the path
from S_0 to t, so on a tree (TreeWY) the same formulas hold with "s < t" read as "s is a strict ancestor
of t" and gamma_t the product along t's root path: the u of a shared prefix is the same for every path
through it, so one triangular solve serves all root paths at once. ``anc`` = tril gives the chunked
prefill form; ``anc`` = the ancestor mask gives tree verification.

Shapes: q, k [B, T, H, d_k]; v [B, T, H, d_v]; g, beta [B, T, H]; S [B, H, d_k, d_v]. Math in the
inputs' dtype (the callers run float32, tests float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # Qwen3-Next's in-kernel q/k norm: x / sqrt(sum x^2 + eps), no learned scale.
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def recurrent_step(q, k, v, g, beta, S):
    """One token per row: q, k [B, H, d_k], v [B, H, d_v], g, beta [B, H], S [B, H, d_k, d_v] -> (o, S')."""
    S = S * g.exp()[..., None, None]
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[..., :, None] * u[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


def recurrent(q, k, v, g, beta, S0):
    """The reference: T recurrent steps. Returns (o [B, T, H, d_v], states [B, T, H, d_k, d_v])."""
    outs, states, S = [], [], S0
    for t in range(q.shape[1]):
        o, S = recurrent_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S)
        outs.append(o)
        states.append(S)
    return torch.stack(outs, 1), torch.stack(states, 1)


def tree_wy(q, k, v, g, beta, S0, anc):
    """All root paths of a block at once (see the module docstring).

    anc : [T, T] or [B, T, T] bool, anc[t, s] = s is an ancestor of t or t itself, in a topological order
    (so anc is lower triangular). Returns (o [B, T, H, d_v], u [B, T, H, d_v], G [B, T, H]) where
    G_t = log gamma_t, the log-decay summed along t's root path; ``state_at`` rebuilds any node's state.
    """
    B, T, H, _ = q.shape
    a = anc.expand(B, T, T).to(q.dtype)
    G = torch.einsum("bts,bsh->bth", a, g)  # log gamma along each root path
    Gh = G.transpose(1, 2)  # [B, H, T]
    # log(gamma_t / gamma_s) <= 0 on ancestors; masked before exp so off-path entries never overflow.
    on_path = anc.expand(B, T, T)[:, None]
    decay = torch.where(on_path, Gh[..., :, None] - Gh[..., None, :], float("-inf")).exp()  # [B, H, T, T]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, d]
    bh = beta.transpose(1, 2)[..., None]  # [B, H, T, 1]
    strict = decay * (1 - torch.eye(T, dtype=q.dtype, device=q.device))
    A = bh * strict * (kh @ kh.transpose(-1, -2))
    rhs = bh * (vh - Gh.exp()[..., None] * (kh @ S0))
    eye = torch.eye(T, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = Gh.exp()[..., None] * (qh @ S0) + (decay * (qh @ kh.transpose(-1, -2))) @ u
    return o.transpose(1, 2), u.transpose(1, 2), G


def state_at(k, u, G, S0, anc_row):
    """The state after node t of a ``tree_wy`` block, one t per row: anc_row [B, T] bool (t's ancestors
    and t), G_t read off where anc_row is last set. S_t = gamma_t S_0 + sum_{s anc t} (gamma_t/gamma_s) k_s u_s^T."""
    B, T, H = G.shape
    # In a topological order t is the last entry of its own ancestor row.
    last = (anc_row.long() * torch.arange(T, device=G.device)).argmax(1)
    Gt = G.gather(1, last[:, None, None].expand(B, 1, H))[:, 0]  # [B, H]
    w = torch.where(anc_row[..., None], (Gt[:, None] - G), float("-inf")).exp()  # [B, T, H]
    return Gt.exp()[..., None, None] * S0 + torch.einsum("bth,bthk,bthv->bhkv", w, k, u)


def chunked(q, k, v, g, beta, S0, chunk: int = 64, solve=None):
    """Chunked prefill: ``tree_wy`` with a causal mask per chunk, the state carried between chunks.
    Returns (o [B, T, H, d_v], S_T). Tokens to skip (padding) are given g = 0 and beta = 0: the identity.
    ``solve`` replaces ``tree_wy`` (same arguments and results): the engine passes the Triton kernel."""
    solve = solve or tree_wy
    T = q.shape[1]
    outs, S = [], S0
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        n = sl.stop - c0
        anc = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        o, u, G = solve(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], S, anc)
        S = state_at(k[:, sl], u, G, S, anc[-1].expand(q.shape[0], n))
        outs.append(o)
    return torch.cat(outs, 1), S


def causal_conv(xw: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Short depthwise causal convolution + SiLU over gathered windows: xw [B, T, K, C] (oldest first,
    the token itself last), weight [C, K] (the Conv1d weight [C, 1, K] squeezed) -> [B, T, C]."""
    return F.silu(torch.einsum("btkc,ck->btc", xw, weight))
