"""Llama-family decoder (Llama 3.x, Qwen2/2.5, Qwen3, SmolLM2) in plain PyTorch.

One forward serves prefill, decode and tree verification: the caller passes the new tokens, where
their KV goes in the static cache (``slots``), their rope positions, and a boolean attention mask over
the whole cache (see ``engine/attn_meta.py``). The forward has no host syncs and fixed shapes, so it
can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import launch as _launch
from . import linear as _linear
from .config import ModelConfig
from .linear import Linear, fused_down_projection, fuses_norm, normed_linear, residual_linear, swiglu_linear

try:  # Triton is optional on CPU-only installs; the engine then keeps SDPA everywhere.
    from ..kernels.rope_cache import rope_cache_write
    from ..kernels.tree_attention import num_tickets, tree_attention
except ImportError:  # pragma: no cover - exercised only where triton is missing
    tree_attention = None
from .rope import apply_rope, rope_table

FUSED_HEAD_DIMS = (32, 64, 128)  # head sizes the fused tree-attention kernel is built for
# A benchmarking hook, for A/B runs in separate processes (the choice is baked into compiled blocks and
# captured graphs): SPECPILOT_FUSED_ROPE=0 runs rope and the cache writes as torch ops (three kernels under
# torch.compile) instead of kernels/rope_cache.py; SPECPILOT_FUSED_DECODE=0 turns it off too.
FUSED_ROPE = os.environ.get("SPECPILOT_FUSED_ROPE", "1") != "0"


def fused_attention_supported(cfg: ModelConfig) -> bool:
    """Whether the fused tree-attention kernel can serve this model (Triton present, a head size it has)."""
    return tree_attention is not None and cfg.head_dim in FUSED_HEAD_DIMS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as Hugging Face: normalize in float32, cast back, then scale.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def eager_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm outside the compiled blocks (the target's final norm, the EAGLE-3 head's): eight eager kernels,
    or one under SPECPILOT_ROUND_KERNELS=1 (kernels/rms_norm.py: the same two roundings, the mean's sum in
    another order), in every pass."""
    if not _launch.ROUND_KERNELS:
        return norm(x)
    from ..kernels.rms_norm import rms_norm as fused_rms_norm  # here: kernels/rms_norm.py imports this module

    return fused_rms_norm(x, norm.weight, norm.eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wqkv = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.wo = Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc) -> torch.Tensor:
        return self.wo(self.core(self.wqkv(x), cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc))

    def split_heads(self, qkv, cos, sin):
        """q [B, N, H, D], k and v [B, N, H_kv, D] of the fused projection's output, norms and rope applied."""
        cfg = self.cfg
        B, N, _ = qkv.shape
        q, kv = qkv.split([cfg.q_size, 2 * cfg.kv_size], dim=-1)
        q = q.view(B, N, cfg.num_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = self.q_norm(q)
        return (apply_rope(q, cos, sin), *self.kv_heads(kv, cos, sin))

    def kv_heads(self, kv, cos, sin):
        """k and v [B, N, H_kv, D] of the fused projection's K/V columns, k's norm and rope applied."""
        cfg = self.cfg
        B, N, _ = kv.shape
        k, v = kv.split(cfg.kv_size, dim=-1)
        k = k.view(B, N, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), v.view(B, N, cfg.num_kv_heads, cfg.head_dim)

    def core(self, qkv, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc) -> torch.Tensor:
        # Everything between the two projections (rope, cache write, attention), [B, N, q_size] out; a
        # method of its own so colocate/ can run the projections as separate (groupable) operations.
        cfg = self.cfg
        B, N, _ = qkv.shape
        if mask is None and qkv.is_cuda and not cfg.qk_norm and FUSED_ROPE and _linear.FUSED_DECODE:
            # One launch for rope, both cache writes and the attention's zeroed tickets (kernels/rope_cache.py)
            # where torch.compile made three; batch_idx is arange(B) for every caller, the kernel's row b.
            n = num_tickets(B, N, cfg.num_heads, cfg.num_kv_heads)
            q, tickets = rope_cache_write(
                qkv, cos, sin, k_cache, v_cache, slots, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, n
            )
            return tree_attention(q, k_cache, v_cache, seq_len, anc, tickets=tickets).reshape(B, N, cfg.q_size)
        q, k, v = self.split_heads(qkv, cos, sin)
        k_cache[batch_idx, slots] = k
        v_cache[batch_idx, slots] = v
        if mask is None:
            # Fused kernel: reads only each row's seq_len + N slots, applies the tree mask itself.
            return tree_attention(q, k_cache, v_cache, seq_len, anc).reshape(B, N, cfg.q_size)
        # Grouped-query attention without copying the cache: fold the G query heads that share a KV
        # head into the query axis (row n * G + g), so SDPA sees Hkv heads of N * G queries each.
        G = cfg.num_heads // cfg.num_kv_heads
        kv_len = mask.shape[-1]
        qf = q.view(B, N, cfg.num_kv_heads, G, cfg.head_dim).transpose(1, 2).reshape(B, cfg.num_kv_heads, N * G, -1)
        kf = k_cache[:B, :kv_len].transpose(1, 2)
        vf = v_cache[:B, :kv_len].transpose(1, 2)
        o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
        return o.view(B, cfg.num_kv_heads, N, G, cfg.head_dim).transpose(1, 2).reshape(B, N, cfg.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13 = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu_mul(self.w13(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc) -> torch.Tensor:
        # The MLP written through its projections so that a one-row decode step runs silu_mul in the down
        # GEMV's prologue and the residual add in its epilogue (models/linear.py): one launch for three.
        # Where the norms stay kernels of their own (the 8B's 4096 features take four GEMV tiles, where a
        # norm prologue measured slower: kernels/gemv.py), inductor fuses the add after the attention into
        # mlp_norm's kernel.
        a = self.attn
        if fuses_norm(a.wqkv, self.attn_norm, x) and fuses_norm(self.mlp.w13, self.mlp_norm, x):
            # A small model's one-row step (its hidden size fits one GEMV tile): both norms in the GEMVs'
            # prologues and the add after the attention in the o projection's epilogue, so a layer is six
            # launches (qkv, rope + cache, attention, o, gate_up, down) instead of ten.
            qkv = normed_linear(a.wqkv, self.attn_norm, x)
            o = a.core(qkv, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)
            h = residual_linear(a.wo, o, x)
            gate_up = normed_linear(self.mlp.w13, self.mlp_norm, h)
        else:
            h = x + a(self.attn_norm(x), cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)
            xn = self.mlp_norm(h)
            # A verify pass on the verify GEMM (small models): silu_mul in gate_up's epilogue and the add in
            # down's, so a layer is eight launches instead of ten.
            act = swiglu_linear(self.mlp.w13, xn)
            if act is not None:
                return residual_linear(self.mlp.w2, act, h)
            gate_up = self.mlp.w13(xn)
        fused = fused_down_projection(self.mlp.w2, gate_up, h)
        return fused if fused is not None else h + self.mlp.w2(silu_mul(gate_up))


def run_block(layer: Block, x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc) -> torch.Tensor:
    # A free function of the layer, so one torch.compile of it serves every layer of every model with
    # the same shapes (parameters become graph inputs) instead of compiling the unrolled model.
    return layer(x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)


class Transformer(nn.Module):
    """Decoder with fused qkv and gate/up projections; weights come in with Hugging Face names."""

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        n_pos = max_positions or cfg.max_position_embeddings
        table = rope_table(n_pos, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope", table, persistent=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        logit_rows: torch.Tensor | None = None,
        layer_fn=None,
        seq_len: torch.Tensor | None = None,
        anc: torch.Tensor | None = None,
        feature_layers: tuple[int, ...] | None = None,
        gate=None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run N new tokens per request through the decoder and return their logits.

        Parameters
        ----------
        tokens : [B, N] int64
        positions : [B, N] int64, rope positions (prefix length + depth for tree nodes)
        slots : [B, N] int64, cache slots the new tokens' K/V are written to
        mask : [B, 1, N * G, S] bool, True where a query row may attend to a cache slot
            (G = num_heads // num_kv_heads; row n * G + g belongs to token n); None = use the fused
            ``tree_attention`` kernel, which needs ``seq_len`` [B] and ``anc`` [N, N] / [B, N, N] instead
        kv : per layer (k_cache, v_cache), each [B_max, S_max, num_kv_heads, head_dim]
        logit_rows : optional [B, R] int64; only those rows of each request get logits
        layer_fn : optional ``fn(layer, x, ...)`` that runs one block, e.g. a compiled ``run_block``
        feature_layers : optional layer indices whose outputs are also returned, concatenated, for every
            one of the N tokens (an EAGLE-3 drafter reads them; ``drafters.eagle3``)
        gate : optional ``fn(i)`` called before layer i (a captured round's waits while a prefill overtakes
            it: ``ModelRunner.hold``)

        Returns
        -------
        logits : [B, N, vocab] (or [B, R, vocab]) in the model dtype; with ``feature_layers``, the pair
            (logits, features [B, N, len(feature_layers) * hidden])
        """
        B = tokens.shape[0]
        if _launch.ROUND_KERNELS:  # the gathers and the cast in one launch (kernels/embed_rope.py)
            from ..kernels.embed_rope import embed_rope

            x, cs = embed_rope(tokens, positions, self.embed.weight, self.rope)
        else:
            x = self.embed(tokens)
            cs = self.rope[positions].to(x.dtype)  # [B, N, 2, D]
        cos, sin = cs[:, :, 0, None], cs[:, :, 1, None]
        batch_idx = torch.arange(B, device=tokens.device)[:, None]
        run = layer_fn or run_block
        feats = []
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv, strict=True)):
            if gate is not None:
                gate(i)
            x = run(layer, x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)
            if feature_layers is not None and i in feature_layers:
                feats.append(x)
        if logit_rows is not None:
            x = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(eager_norm(self.norm, x))
        if feature_layers is None:
            return logits
        return logits, torch.cat(feats, -1)

    # ---- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up. Missing or extra names raise."""
        cfg = self.cfg
        used: set[str] = set()

        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"checkpoint has no tensor {name!r}")
            used.add(name)
            return sd[name]

        def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(value.shape)} != model shape {tuple(param.shape)}")
            param.copy_(value)

        put(self.embed.weight, take("model.embed_tokens.weight"), "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qkv = torch.cat([take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight")])
            put(layer.attn.wqkv.weight, qkv, a + "qkv_proj.weight")
            if cfg.attention_bias:
                b = torch.cat([take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")])
                put(layer.attn.wqkv.bias, b, a + "qkv_proj.bias")
            put(layer.attn.wo.weight, take(a + "o_proj.weight"), a + "o_proj.weight")
            if cfg.qk_norm:
                put(layer.attn.q_norm.weight, take(a + "q_norm.weight"), a + "q_norm.weight")
                put(layer.attn.k_norm.weight, take(a + "k_norm.weight"), a + "k_norm.weight")
            m = p + "mlp."
            gu = torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
            put(layer.mlp.w13.weight, gu, m + "gate_up_proj.weight")
            put(layer.mlp.w2.weight, take(m + "down_proj.weight"), m + "down_proj.weight")
            put(layer.attn_norm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm.weight")
            put(
                layer.mlp_norm.weight,
                take(p + "post_attention_layernorm.weight"),
                p + "post_attention_layernorm.weight",
            )
        put(self.norm.weight, take("model.norm.weight"), "model.norm.weight")
        if not cfg.tie_word_embeddings:
            put(self.lm_head.weight, take("lm_head.weight"), "lm_head.weight")
        extra = set(sd) - used - {"lm_head.weight"}
        extra = {n for n in extra if "rotary_emb" not in n}
        if extra:
            raise KeyError(f"checkpoint has tensors the model does not use: {sorted(extra)[:5]}")

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The inverse of ``load_hf_state_dict`` (unfused Hugging Face names)."""
        cfg = self.cfg
        sd = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm.weight}
        if not cfg.tie_word_embeddings:
            sd["lm_head.weight"] = self.lm_head.weight
        for i, layer in enumerate(self.layers):
            p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            q, k, v = layer.attn.wqkv.weight.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
            sd |= {a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v}
            if cfg.attention_bias:
                qb, kb, vb = layer.attn.wqkv.bias.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
                sd |= {a + "q_proj.bias": qb, a + "k_proj.bias": kb, a + "v_proj.bias": vb}
            if cfg.qk_norm:
                sd |= {a + "q_norm.weight": layer.attn.q_norm.weight, a + "k_norm.weight": layer.attn.k_norm.weight}
            g, u = layer.mlp.w13.weight.chunk(2)
            sd |= {a + "o_proj.weight": layer.attn.wo.weight, m + "gate_proj.weight": g, m + "up_proj.weight": u}
            sd[m + "down_proj.weight"] = layer.mlp.w2.weight
            sd[p + "input_layernorm.weight"] = layer.attn_norm.weight
            sd[p + "post_attention_layernorm.weight"] = layer.mlp_norm.weight
        return {n: t.detach().contiguous() for n, t in sd.items()}

    def truncated(self, num_layers: int) -> Transformer:
        """A drafter made of this model's first ``num_layers`` layers, sharing every tensor (no copy)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"draft layers must be in 1..{self.num_layers}, got {num_layers}")
        cfg = ModelConfig(**{**self.cfg.to_dict(), "num_layers": num_layers, "name": f"{self.cfg.name}[:{num_layers}]"})
        draft = Transformer.__new__(Transformer)
        nn.Module.__init__(draft)
        draft.cfg = cfg
        draft.embed, draft.norm, draft.lm_head = self.embed, self.norm, self.lm_head
        draft.layers = nn.ModuleList(self.layers[:num_layers])
        draft.register_buffer("rope", self.rope, persistent=False)
        return draft
