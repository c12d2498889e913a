"""A Gated DeltaNet layer as Qwen3-Next configures it, and the decoder block around it.

Per token x (hidden size h), with key heads H_k of size d_k and value heads H_v of size d_v
(r = H_v / H_k value heads share a key head):

    q, k, v, z = in_proj_qkvz(x)             (Hugging Face layout: per key head [q, k, v_r, z_r])
    b, a       = in_proj_ba(x)
    q, k, v    = silu(causal_conv1d([q, k, v]))    a depthwise conv of K taps along the token's path
    q, k       = l2norm(q) * d_k^-1/2, l2norm(k); repeated r times to the value heads
    beta       = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)       (log decay, <= 0)
    o          = the gated delta rule (gdn_ops.py) over per-head states [d_k, d_v]
    y          = out_proj(rms_norm(o) * norm.weight * silu(z))              (per value head)

The recurrence and the convolution carry state from token to token, so the layer cannot run alone: it
is given a ``rec`` object (``engine/gdn_state.py``) that knows the step (prefill chunk, decode token, or
verify tree), holds the per-row states, and does the two stateful parts:

    rec.conv(slot, mixed [B, T, C], weight [C, K]) -> [B, T, C]   the convolution along each token's path
    rec.mix(slot, q, k, v, g, beta) -> o [B, T, H_v, d_v]         the delta rule, >= float32

``slot`` is the layer's index among the model's GDN layers (its row in the state tensors).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .gdn_ops import l2norm
from .llama import MLP, RMSNorm


def gdn_dims(cfg: ModelConfig) -> dict[str, int]:
    """Head counts and widths of a GDN layer: key_dim, value_dim, conv_dim (the convolved q, k, v)."""
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    return dict(key_dim=kd, value_dim=vd, conv_dim=2 * kd + vd, qkvz=2 * kd + 2 * vd, ba=2 * cfg.linear_num_value_heads)


def gdn_hf_shapes(cfg: ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """Qwen3-Next's Hugging Face tensors of one GDN layer (``prefix`` = ``model.layers.{i}.``), HF shapes."""
    d, h, a = gdn_dims(cfg), cfg.hidden_size, prefix + "linear_attn."
    nv = cfg.linear_num_value_heads
    return {
        a + "in_proj_qkvz.weight": (d["qkvz"], h),
        a + "in_proj_ba.weight": (d["ba"], h),
        a + "conv1d.weight": (d["conv_dim"], 1, cfg.linear_conv_kernel_dim),
        a + "dt_bias": (nv,),
        a + "A_log": (nv,),
        a + "norm.weight": (cfg.linear_value_head_dim,),
        a + "out_proj.weight": (h, d["value_dim"]),
    }


def _acc(t: torch.Tensor) -> torch.Tensor:
    """The recurrence's precision: float32, or the model's when wider (float64 tests)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, slot: int):
        super().__init__()
        self.cfg, self.slot = cfg, slot
        d = gdn_dims(cfg)
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = d["key_dim"], d["value_dim"]
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, d["qkvz"], bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, d["ba"], bias=False)
        self.conv1d = nn.Parameter(torch.zeros(d["conv_dim"], 1, cfg.linear_conv_kernel_dim))
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = RMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)

    def split(self, x: torch.Tensor):
        """Projections in Qwen3-Next's grouped layout -> mixed [B, T, conv_dim] = [q | k | v] flat,
        z [B, T, H_v, d_v], b, a [B, T, H_v]."""
        B, T, _ = x.shape
        r = self.nv // self.nk
        qkvz = self.in_proj_qkvz(x).view(B, T, self.nk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, self.nk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
        return mixed, z.reshape(B, T, self.nv, self.dv), b.reshape(B, T, self.nv), a.reshape(B, T, self.nv)

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # At least float32 like the reference kernels: g feeds exp() of sums along a path.
        g = -_acc(self.A_log).exp() * F.softplus(_acc(a) + _acc(self.dt_bias))
        return g, _acc(b).sigmoid()

    def qkv(self, conv: torch.Tensor):
        """Convolved [q | k | v] -> q (normalised, scaled), k (normalised) at the value heads, v (>= float32)."""
        B, T, _ = conv.shape
        r = self.nv // self.nk
        q, k, v = _acc(conv).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.view(B, T, self.nk, self.dk)) * self.dk**-0.5
        k = l2norm(k.view(B, T, self.nk, self.dk))
        if r > 1:
            q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
        return q, k, v.view(B, T, self.nv, self.dv)

    def forward(self, x: torch.Tensor, rec) -> torch.Tensor:
        mixed, z, b, a = self.split(x)
        conv = rec.conv(self.slot, mixed, self.conv1d[:, 0])
        q, k, v = self.qkv(conv)
        g, beta = self.gates(b, a)
        o = rec.mix(self.slot, q, k, v, g, beta)
        return self.out_proj(self.gated_norm(o, z).flatten(2))

    def gated_norm(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # Qwen3-Next's RMSNormGated: normalise in float32, scale in the model dtype, gate in float32.
        dt = z.dtype
        of = _acc(o)
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.norm.eps)
        return (self.norm.weight * of.to(dt) * F.silu(_acc(z))).to(dt)


class GDNBlock(nn.Module):
    """Pre-norm residual block with a GDN mixer instead of attention (same norms and MLP as ``Block``)."""

    def __init__(self, cfg: ModelConfig, slot: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.linear_attn = GatedDeltaNet(cfg, slot)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rec) -> torch.Tensor:
        h = x + self.linear_attn(self.attn_norm(x), rec)
        return h + self.mlp(self.mlp_norm(h))
