"""Real architectures (shapes from their published config.json files) for timing with synthetic weights.

Synthetic weights are drawn where the model runs, N(0, std) for matrices and 1 + N(0, std) for norm
scales (never zeros, never a constant), and every model built from them says ``synthetic`` in its name.
"""

from __future__ import annotations

import torch

from .config import ModelConfig

_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA32_ROPE = {**_LLAMA31_ROPE, "factor": 32.0}
_LLAMA3 = dict(
    arch="llama",
    vocab_size=128256,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_ids=[128001, 128008, 128009],
)
_QWEN3 = dict(
    arch="qwen3",
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    head_dim=128,
    max_position_embeddings=40960,
    bos_token_id=None,
    eos_token_ids=[151645, 151643],
)

# Qwen3-Next's Gated DeltaNet shapes (16 key heads, 32 value heads of 128, conv of 4 taps, one full
# attention layer in 4), on an 8B-class dense body: timing only (models/hybrid.py lists what differs).
_QWEN3_NEXT_GDN = dict(
    full_attention_interval=4,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)

PRESETS: dict[str, dict] = {
    "llama-3.1-8b": dict(
        _LLAMA3,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        rope_scaling=_LLAMA31_ROPE,
    ),
    "llama-3.1-70b": dict(
        _LLAMA3,
        hidden_size=8192,
        intermediate_size=28672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        rope_scaling=_LLAMA31_ROPE,
    ),
    "llama-3.2-1b": dict(
        _LLAMA3,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_scaling=_LLAMA32_ROPE,
        tie_word_embeddings=True,
    ),
    "llama-3.2-3b": dict(
        _LLAMA3,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        rope_scaling=_LLAMA32_ROPE,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        _QWEN3,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": dict(
        _QWEN3,
        hidden_size=2560,
        intermediate_size=9728,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8),
    "qwen3-14b": dict(_QWEN3, hidden_size=5120, intermediate_size=17408, num_layers=40, num_heads=40, num_kv_heads=8),
    "smollm2-135m": dict(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=[2],
    ),
    "qwen3-next-8b-like": dict(
        _QWEN3,
        **_QWEN3_NEXT_GDN,
        arch="qwen3_next",
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        rope_theta=10000000.0,
    ),
    # Small shapes for CPU tests; every architecture variant is covered by one of them.
    "tiny-llama": dict(
        arch="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=1024,
        eos_token_ids=[1],
        rope_theta=10000.0,
        rope_scaling={**_LLAMA31_ROPE, "original_max_position_embeddings": 256},
    ),
    "tiny-qwen2": dict(
        arch="qwen2",
        vocab_size=384,
        hidden_size=48,
        intermediate_size=96,
        num_layers=3,
        num_heads=6,
        num_kv_heads=2,
        max_position_embeddings=1024,
        eos_token_ids=[1],
        tie_word_embeddings=True,
    ),
    "tiny-qwen3": dict(
        arch="qwen3",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=4,
        head_dim=32,
        max_position_embeddings=1024,
        eos_token_ids=[1],
    ),
    # Hybrids: 3 GDN layers then 1 attention layer; value heads sharing a key head (r = 2) and not (r = 1).
    "tiny-hybrid": dict(
        arch="qwen3_next",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        eos_token_ids=[1],
        full_attention_interval=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    ),
    "tiny-hybrid-8": dict(
        arch="qwen3_next",
        vocab_size=384,
        hidden_size=48,
        intermediate_size=96,
        num_layers=8,
        num_heads=4,
        num_kv_heads=4,
        head_dim=12,
        max_position_embeddings=1024,
        eos_token_ids=[1],
        full_attention_interval=4,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=8,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=3,
    ),
}


def preset_config(name: str) -> ModelConfig:
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return ModelConfig(**PRESETS[key], name=f"{key} (synthetic weights)")


def synthetic_state_dict(
    cfg: ModelConfig, *, seed: int = 0, std: float = 0.02, device="cpu", dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """Hugging Face-named synthetic weights for ``cfg`` (the same draw ``build_model`` makes)."""
    from .build import build_model

    model = build_model(cfg, device=device, dtype=dtype, synthetic_seed=seed, synthetic_std=std, max_positions=1)
    return model.hf_state_dict()
