"""Turn ``EngineOptions`` into models on the device: checkpoint or preset, target and drafter."""

from __future__ import annotations

from ..config import EngineOptions
from ..models.build import build_model
from ..models.llama import Transformer
from ..models.w12_weights import to_w12


def _read(spec: str | None, options: EngineOptions):
    """(config, state_dict or None, tokenizer) of a checkpoint path or, with ``synthetic``, a preset."""
    from ..models.loader import default_model_path, load_model_files
    from ..models.presets import preset_config
    from ..models.tokenizer import Tokenizer

    if options.synthetic:
        if spec is None:
            raise ValueError("--synthetic needs a preset name for the model")
        cfg = preset_config(spec)
        return cfg, None, Tokenizer.synthetic(cfg.vocab_size)
    return load_model_files(spec or default_model_path())


def _build(read, options: EngineOptions, seed: int, weights: str) -> Transformer:
    from .engine import scratch_slots

    cfg, state_dict, _ = read
    n_pos = options.max_seq_len + scratch_slots(options)
    synthetic_seed = seed if state_dict is None else None
    model = build_model(
        cfg,
        device=options.device,
        dtype=options.torch_dtype,
        state_dict=state_dict,
        synthetic_seed=synthetic_seed,
        max_positions=n_pos,
    )
    return to_w12(model) if weights == "w12" else model


def load_engine_models(options: EngineOptions) -> tuple[Transformer, Transformer | None, object, EngineOptions]:
    """Returns (target, draft or None, tokenizer, options with max_seq_len resolved).

    Refuses a drafter whose tokenizer differs from the target's.
    """
    read = _read(options.model, options)
    options = options.resolved(read[0].max_position_embeddings)
    target, tokenizer = _build(read, options, options.seed, options.weights), read[2]
    draft = None
    from ..drafters import is_shared_drafter, load_shared_drafter
    from ..drafters.eagle3 import is_eagle3, load_eagle3

    if is_eagle3(options.draft):
        # A feature drafter: one layer over the target's own hidden states (and its embedding).
        draft = load_eagle3(options.draft, target)
    elif is_shared_drafter(options.draft):
        # A trained drafter that keeps only its own layers: it borrows the target's embedding and head.
        draft = load_shared_drafter(options.draft, target)
    elif options.draft is not None:
        draft_read = _read(options.draft, options)
        draft, draft_tok = _build(draft_read, options, options.seed + 1, options.draft_weights), draft_read[2]
        if draft_tok.fingerprint != tokenizer.fingerprint:
            raise ValueError(
                f"draft and target tokenizers differ ({options.draft!r} vs {options.model!r}); "
                "speculative decoding needs one shared vocabulary"
            )
    elif options.draft_layers > 0:
        draft = target.truncated(options.draft_layers)
    return target, draft, tokenizer, options
