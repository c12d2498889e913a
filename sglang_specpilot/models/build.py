"""Build a ``Transformer`` on a device from a checkpoint's tensors or from synthetic weights."""

from __future__ import annotations

import torch

from .config import ModelConfig
from .hybrid import HybridTransformer
from .llama import Transformer
from .rope import rope_table


@torch.no_grad()
def build_model(
    cfg: ModelConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    state_dict: dict[str, torch.Tensor] | None = None,
    synthetic_seed: int | None = None,
    synthetic_std: float = 0.02,
    max_positions: int | None = None,
) -> Transformer:
    """Allocate the model directly on ``device`` (no CPU copy first) and fill its weights.

    Exactly one of ``state_dict`` (Hugging Face names) and ``synthetic_seed`` must be given.
    Synthetic weights: N(0, std) matrices, 1 + N(0, std) norm scales, drawn on ``device``.
    """
    if (state_dict is None) == (synthetic_seed is None):
        raise ValueError("give exactly one of state_dict and synthetic_seed")
    with torch.device("meta"):
        model = (HybridTransformer if cfg.is_hybrid else Transformer)(cfg, max_positions)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    n_pos = max_positions or cfg.max_position_embeddings
    model.rope = rope_table(n_pos, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    if state_dict is not None:
        model.load_hf_state_dict(state_dict)
    else:
        gen = torch.Generator(device=device).manual_seed(synthetic_seed)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).mul_(synthetic_std)
            p.copy_(noise + 1 if "norm" in name else noise)
    return model.eval().requires_grad_(False)
