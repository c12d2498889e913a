"""Turn ``EngineOptions`` into models on the device: checkpoint or preset, target and drafter."""

from __future__ import annotations

from ..config import EngineOptions
from ..models.build import build_model
from ..models.llama import Transformer


def _load_one(spec: str | None, options: EngineOptions, max_positions: int, seed: int):
    from ..models.loader import default_model_path, load_model_files
    from ..models.presets import preset_config
    from ..models.tokenizer import Tokenizer

    dev, dtype = options.device, options.torch_dtype
    if options.synthetic:
        if spec is None:
            raise ValueError("--synthetic needs a preset name for the model")
        cfg = preset_config(spec)
        model = build_model(cfg, device=dev, dtype=dtype, synthetic_seed=seed, max_positions=max_positions)
        return model, Tokenizer.synthetic(cfg.vocab_size)
    cfg, state_dict, tokenizer = load_model_files(spec or default_model_path())
    model = build_model(cfg, device=dev, dtype=dtype, state_dict=state_dict, max_positions=max_positions)
    return model, tokenizer


def load_engine_models(options: EngineOptions) -> tuple[Transformer, Transformer | None, object]:
    """Returns (target, draft or None, tokenizer). Refuses a drafter whose tokenizer differs."""
    from .engine import scratch_slots

    n_pos = options.max_seq_len + scratch_slots(options)
    target, tokenizer = _load_one(options.model, options, n_pos, options.seed)
    draft = None
    if options.draft is not None:
        draft, draft_tok = _load_one(options.draft, options, n_pos, options.seed + 1)
        if draft_tok.fingerprint != tokenizer.fingerprint:
            raise ValueError(
                f"draft and target tokenizers differ ({options.draft!r} vs {options.model!r}); "
                "speculative decoding needs one shared vocabulary"
            )
    elif options.draft_layers > 0:
        draft = target.truncated(options.draft_layers)
    return target, draft, tokenizer
