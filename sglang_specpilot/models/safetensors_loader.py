"""Read and write Hugging Face checkpoint folders: ``config.json`` plus one or many ``*.safetensors``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_specpilot.models.config import _HYBRID_KEYS, ModelConfig
from sglang_specpilot.models.errors import CheckpointError, check_state_dict
from sglang_specpilot.models.tokenizer import Tokenizer

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}
_INDEX = "model.safetensors.index.json"


def _read_config(path: Path) -> dict:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        return json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: cannot be parsed as JSON: {e}") from e


def weight_files(path: Path) -> list[Path]:
    """The shards the index names, or every ``*.safetensors`` in the folder when there is no index."""
    index = path / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index: {e}") from e
        files = [path / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{path}: {_INDEX} names missing shard(s): {', '.join(absent)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    return files


def load_safetensors_folder(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """Load a Hugging Face Llama / Qwen2 / Qwen3 checkpoint folder (or a Qwen3-Next-layout hybrid's).

    Returns
    -------
    config : ModelConfig
        From ``config.json`` via :meth:`ModelConfig.from_hf`.
    state_dict : dict[str, torch.Tensor]
        HF names and shapes, in the dtype stored in the files (bf16 stays bf16). ``lm_head.weight`` is
        dropped when the embeddings are tied.
    metadata : dict
        ``{"config": <config.json dict>, "files": [shard names], "safetensors": <header metadata>}``.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such folder")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder (expected a Hugging Face checkpoint folder)")
    raw_cfg = _read_config(path)
    try:
        config = ModelConfig.from_hf(raw_cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / 'config.json'}: unusable config: {type(e).__name__}: {e}") from e
    files = weight_files(path)
    state_dict: dict[str, torch.Tensor] = {}
    header: dict = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                header.update(f.metadata() or {})
                for name in f.keys():
                    state_dict[name] = f.get_tensor(name)
        except Exception as e:
            # safetensors checks the header and the byte ranges it promises against the file size.
            raise CheckpointError(f"{file}: corrupt or truncated safetensors file: {e}") from e
    if config.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    check_state_dict(config, state_dict, str(path))
    return config, state_dict, {"config": raw_cfg, "files": [f.name for f in files], "safetensors": header}


def config_to_hf(config: ModelConfig, dtype: torch.dtype | None = None) -> dict:
    """A ``config.json`` dict that :meth:`ModelConfig.from_hf` (and transformers) read back unchanged."""
    eos = config.eos_token_ids
    cfg = {
        "architectures": [_ARCHITECTURES[config.arch]],
        "model_type": config.arch,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (list(eos) or None),
        "_name_or_path": config.name,
    }
    if config.is_hybrid:  # Qwen3-Next's config.json keys for the GDN shapes and the layer layout
        cfg |= {k: getattr(config, k) for k in _HYBRID_KEYS}
        cfg["layer_types"] = [
            "linear_attention" if config.is_gdn_layer(i) else "full_attention" for i in range(config.num_layers)
        ]
    if dtype is not None:
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    return cfg


def save_safetensors_folder(
    path: str | Path,
    config: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    tokenizer: Tokenizer | None = None,
) -> None:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files) that ``load_safetensors_folder``
    and ``Tokenizer.from_folder`` read back to an equal config, equal tensors and an equal tokenizer.

    ``state_dict`` must use HF names; ``lm_head.weight`` is not written when the embeddings are tied.
    """
    path = Path(path)
    check_state_dict(config, state_dict, "state_dict to save")
    path.mkdir(parents=True, exist_ok=True)
    # safetensors refuses tensors that share storage (a tied lm_head), and needs contiguous ones.
    tensors = {
        name: t.detach().contiguous().clone()
        for name, t in state_dict.items()
        if not (config.tie_word_embeddings and name == "lm_head.weight")
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    dtype = state_dict["model.embed_tokens.weight"].dtype
    (path / "config.json").write_text(json.dumps(config_to_hf(config, dtype), indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(path)
