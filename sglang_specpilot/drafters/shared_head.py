"""A drafter of a few decoder layers that shares the target's embedding and LM head.

On disk it is a folder with ``config.json`` (the drafter's shape, HF form), ``model.safetensors`` holding
only its decoder layers and final norm, and ``specpilot_drafter.json`` (the marker: which target it was
trained for, by vocabulary size and hidden size). The embedding and head are the target's, so for
SmolLM2-135M a 2-layer drafter is ~14 MB in bf16 instead of ~70 MB. ``--draft FOLDER`` loads it against
whatever target the engine runs, after checking the shapes agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..models.config import ModelConfig
from ..models.llama import Transformer
from ..models.safetensors_loader import config_to_hf

MARKER = "specpilot_drafter.json"
WEIGHTS = "model.safetensors"
# Shipped drafter of the embedded SmolLM2-135M-Instruct: an EAGLE-3 feature drafter (``drafters.eagle3``)
# trained by ``specpilot train-drafter --kind eagle3`` on HumanEval 0-99 and the offline prompt set.
DEFAULT_SMOLLM2_DRAFTER = Path(__file__).parent / "smollm2_eagle3"


def default_drafter_path() -> Path | None:
    """The shipped SmolLM2 drafter folder, or None while it has not been trained and committed."""
    return DEFAULT_SMOLLM2_DRAFTER if (DEFAULT_SMOLLM2_DRAFTER / MARKER).is_file() else None


def is_shared_drafter(path: str | Path | None) -> bool:
    """A shared-head drafter folder (not an EAGLE-3 one, whose marker says ``"kind": "eagle3"``)."""
    if path is None or not (Path(path) / MARKER).is_file():
        return False
    try:
        return json.loads((Path(path) / MARKER).read_text()).get("kind", "shared") == "shared"
    except (OSError, ValueError):
        return True  # an unreadable marker: the shared loader reports it


def _drafter_config(target: Transformer, num_layers: int) -> ModelConfig:
    return ModelConfig(**{**target.cfg.to_dict(), "num_layers": num_layers, "name": f"{target.cfg.name}-drafter"})


def _attach(target: Transformer, cfg: ModelConfig, layers: nn.ModuleList, norm: nn.Module) -> Transformer:
    draft = Transformer.__new__(Transformer)
    nn.Module.__init__(draft)
    draft.cfg = cfg
    draft.embed, draft.lm_head = target.embed, target.lm_head
    draft.layers, draft.norm = layers, norm
    draft.register_buffer("rope", target.rope, persistent=False)
    return draft


def init_shared_drafter(target: Transformer, num_layers: int) -> Transformer:
    """A drafter initialised from copies of the target's first ``num_layers`` layers and its final norm;
    embedding and head are the target's own tensors (not copied, not trained)."""
    import copy

    if not 1 <= num_layers <= target.num_layers:
        raise ValueError(f"drafter layers must be in 1..{target.num_layers}, got {num_layers}")
    layers = copy.deepcopy(nn.ModuleList(target.layers[:num_layers]))
    return _attach(target, _drafter_config(target, num_layers), layers, copy.deepcopy(target.norm))


def save_shared_drafter(draft: Transformer, path: str | Path, meta: dict | None = None) -> Path:
    """Write the drafter's own tensors (layers, final norm) in bf16 with HF names, plus config and marker."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    own = {n: t for n, t in draft.hf_state_dict().items() if n.startswith("model.layers.") or n == "model.norm.weight"}
    save_file({n: t.to(torch.bfloat16).contiguous().clone() for n, t in own.items()}, str(path / WEIGHTS))
    (path / "config.json").write_text(json.dumps(config_to_hf(draft.cfg, torch.bfloat16), indent=2) + "\n")
    marker = {
        "shares": "embedding+lm_head",
        "vocab_size": draft.cfg.vocab_size,
        "hidden_size": draft.cfg.hidden_size,
        **(meta or {}),
    }
    (path / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return path


def load_shared_drafter(path: str | Path, target: Transformer) -> Transformer:
    """Load a drafter folder onto ``target``'s embedding and head (same device and dtype as the target)."""
    path = Path(path)
    marker = json.loads((path / MARKER).read_text())
    cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    for key in ("vocab_size", "hidden_size"):
        if marker.get(key) != getattr(target.cfg, key):
            raise ValueError(
                f"{path}: drafter was trained for a target with {key} {marker.get(key)}, "
                f"this target has {getattr(target.cfg, key)}"
            )
    tensors = load_file(str(path / WEIGHTS))
    dev, dtype = target.embed.weight.device, target.embed.weight.dtype
    with torch.device("meta"):
        shell = Transformer(ModelConfig(**{**cfg.to_dict(), "vocab_size": 1}), target.rope.shape[0])
    layers = shell.layers.to_empty(device=dev).to(dtype)
    norm = shell.norm.to_empty(device=dev).to(dtype)
    draft = _attach(
        target, ModelConfig(**{**target.cfg.to_dict(), "num_layers": cfg.num_layers, "name": cfg.name}), layers, norm
    )
    sd = {**tensors, "model.embed_tokens.weight": target.embed.weight.detach()}
    if not target.cfg.tie_word_embeddings:
        sd["lm_head.weight"] = target.lm_head.weight.detach()
    draft.load_hf_state_dict({n: t.to(dev) for n, t in sd.items()})
    return draft
