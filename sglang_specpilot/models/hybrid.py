"""A hybrid decoder (Qwen3-Next layout): Gated DeltaNet blocks with a full-attention block every
``full_attention_interval`` layers.

The attention blocks are ``llama.Block`` unchanged and use the static KV cache as before (the cache keeps
an entry for every layer; the GDN layers leave theirs unused). The GDN blocks read and write recurrent
and convolution state through the ``rec`` object the runner passes (``engine/gdn_state.py``).

Simplifications against the published Qwen3-Next (this model is for synthetic-weight timing and
lossless tests, not for loading Qwen3-Next checkpoints): a dense SwiGLU MLP instead of the MoE, no
output gate on the attention layers, full rotary embedding, and plain (not zero-centred, 1 + w) RMSNorm
scales. The GDN layers follow Qwen3-Next exactly, Hugging Face tensor names included.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .config import ModelConfig
from .gdn import GDNBlock
from .llama import Block, Transformer, run_block

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _renumber(sd: dict[str, torch.Tensor], index: dict[int, int]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in sd.items():
        m = _LAYER.match(name)
        if m:
            name = f"model.layers.{index[int(m.group(1))]}." + name[m.end() :]
        out[name] = t
    return out


class HybridTransformer(Transformer):
    """``Transformer`` whose GDN layers are ``GDNBlock``s; ``forward`` takes ``rec`` (required)."""

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__(cfg, max_positions)
        slots = {i: s for s, i in enumerate(cfg.gdn_layers)}
        self.layers = nn.ModuleList(
            GDNBlock(cfg, slots[i]) if i in slots else Block(cfg) for i in range(cfg.num_layers)
        )

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.cfg.num_layers) if not self.cfg.is_gdn_layer(i)]

    def forward(
        self,
        tokens,
        positions,
        slots,
        mask,
        kv,
        logit_rows=None,
        layer_fn=None,
        seq_len=None,
        anc=None,
        feature_layers=None,
        rec=None,
    ):
        """As ``Transformer.forward``, plus ``rec``: the recurrent-state step of this forward."""
        if rec is None:
            raise ValueError("a hybrid (GDN) model runs only with recurrent state: pass rec (engine/gdn_state.py)")
        B = tokens.shape[0]
        x = self.embed(tokens)
        cs = self.rope[positions].to(x.dtype)
        cos, sin = cs[:, :, 0, None], cs[:, :, 1, None]
        batch_idx = torch.arange(B, device=tokens.device)[:, None]
        run = layer_fn or run_block
        feats = []
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv, strict=True)):
            if isinstance(layer, GDNBlock):
                x = layer(x, rec)
            else:
                x = run(layer, x, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)
            if feature_layers is not None and i in feature_layers:
                feats.append(x)
        if logit_rows is not None:
            x = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.norm(x))
        return logits if feature_layers is None else (logits, torch.cat(feats, -1))

    def attention_only(self) -> Transformer:
        """A plain decoder of this model's attention layers, embeddings and head, sharing every tensor:
        a drafter for tests (close to the target where the GDN residuals are small) and the view the
        attention half of the weights loads through."""
        layers = self.attention_layers
        base = {**self.cfg.to_dict(), "num_layers": len(layers), "arch": "qwen3", "full_attention_interval": 0}
        cfg = ModelConfig(**{**base, "name": f"{self.cfg.name}[attention]"})
        view = Transformer.__new__(Transformer)
        nn.Module.__init__(view)
        view.cfg = cfg
        view.embed, view.norm, view.lm_head = self.embed, self.norm, self.lm_head
        view.layers = nn.ModuleList(self.layers[i] for i in layers)
        view.register_buffer("rope", self.rope, persistent=False)
        return view

    def truncated(self, num_layers: int) -> Transformer:
        raise ValueError("a hybrid target has no truncated drafter (its GDN layers need recurrent state)")

    # ---- weights -------------------------------------------------------------------------------
    def _gdn_pairs(self):
        # (HF name, parameter) of every GDN layer's tensors, norms and MLP included.
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, GDNBlock):
                continue
            p, g = f"model.layers.{i}.", layer.linear_attn
            a, m = p + "linear_attn.", p + "mlp."
            gate, up = layer.mlp.w13.weight.chunk(2)
            yield from (
                (a + "in_proj_qkvz.weight", g.in_proj_qkvz.weight),
                (a + "in_proj_ba.weight", g.in_proj_ba.weight),
                (a + "conv1d.weight", g.conv1d),
                (a + "dt_bias", g.dt_bias),
                (a + "A_log", g.A_log),
                (a + "norm.weight", g.norm.weight),
                (a + "out_proj.weight", g.out_proj.weight),
                (m + "gate_proj.weight", gate),
                (m + "up_proj.weight", up),
                (m + "down_proj.weight", layer.mlp.w2.weight),
                (p + "input_layernorm.weight", layer.attn_norm.weight),
                (p + "post_attention_layernorm.weight", layer.mlp_norm.weight),
            )

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """GDN layers by Qwen3-Next's names; everything else through ``attention_only`` (shared tensors)."""
        rest = dict(sd)
        for name, param in self._gdn_pairs():
            if name not in rest:
                raise KeyError(f"checkpoint has no tensor {name!r}")
            value = rest.pop(name)
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(value.shape)} != model shape {tuple(param.shape)}")
            param.copy_(value)  # gate/up are views of w13: the copy lands in the fused weight
        to_view = {real: j for j, real in enumerate(self.attention_layers)}
        stray = [n for n in rest if (m := _LAYER.match(n)) and int(m.group(1)) not in to_view]
        if stray:
            raise KeyError(f"checkpoint has tensors the model does not use: {sorted(stray)[:5]}")
        self.attention_only().load_hf_state_dict(_renumber(rest, to_view))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        back = dict(enumerate(self.attention_layers))
        sd = _renumber(self.attention_only().hf_state_dict(), back)
        sd |= {name: t.detach().contiguous() for name, t in self._gdn_pairs()}
        return sd
