"""The error every loader raises for a bad checkpoint, and the tensor-set check they all share."""

from __future__ import annotations

import torch

from sglang_specpilot.models.config import ModelConfig


class CheckpointError(ValueError):
    """A model file or folder that cannot be loaded; the message names the path and what is wrong."""


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` must hold, by Hugging Face name, in HF ([out, in]) shape."""
    h, i, v, d = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if config.is_gdn_layer(n):  # a hybrid's Gated DeltaNet layer: Qwen3-Next's linear_attn tensors
            from sglang_specpilot.models.gdn import gdn_hf_shapes

            shapes |= gdn_hf_shapes(config, p)
            shapes |= {p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h)}
            shapes[p + "mlp.down_proj.weight"] = (h, i)
            continue
        shapes[p + "self_attn.q_proj.weight"] = (config.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (config.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (config.kv_size, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, config.q_size)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (config.kv_size,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
    return shapes


def check_state_dict(config: ModelConfig, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` naming ``source`` if a tensor is missing or has the wrong shape.

    Extra tensors are allowed (the decoder ignores them); ``lm_head.weight`` may be present when tied.
    """
    expected = expected_shapes(config)
    missing = [name for name in expected if name not in state_dict]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"{source}: missing {len(missing)} tensor(s): {shown}")
    wrong = [
        f"{name} has shape {tuple(state_dict[name].shape)}, config expects {shape}"
        for name, shape in expected.items()
        if tuple(state_dict[name].shape) != shape
    ]
    if wrong:
        shown = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise CheckpointError(f"{source}: tensor shapes do not match the config: {shown}")
