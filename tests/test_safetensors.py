"""Hugging Face folders: save/load round trip, sharded folders, and every bad-folder error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from sglang_specpilot.models.config import ModelConfig
from sglang_specpilot.models.errors import CheckpointError, expected_shapes
from sglang_specpilot.models.loader import load_model_files
from sglang_specpilot.models.safetensors_loader import load_safetensors_folder, save_safetensors_folder
from sglang_specpilot.models.tokenizer import Tokenizer


def _config(arch: str = "llama", **overrides) -> ModelConfig:
    base = dict(
        arch=arch,
        vocab_size=300,
        hidden_size=48,
        intermediate_size=80,
        num_layers=3,
        num_heads=6,
        num_kv_heads=2,
        head_dim=16 if arch == "qwen3" else 0,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=[2],
        name="tiny",
    )
    return ModelConfig(**{**base, **overrides})


def _weights(config: ModelConfig, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(config.num_layers)
    return {name: torch.randn(shape, generator=g).to(dtype) for name, shape in expected_shapes(config).items()}


@pytest.mark.parametrize(
    "config,dtype",
    [
        (_config("llama"), torch.float32),
        (
            _config(
                "llama",
                tie_word_embeddings=False,
                eos_token_ids=[2, 0],
                rope_scaling={"rope_type": "linear", "factor": 2.0},
            ),
            torch.bfloat16,
        ),
        (_config("qwen2"), torch.float16),
        (_config("qwen3", tie_word_embeddings=False), torch.float32),
    ],
)
def test_round_trip(tmp_path, config, dtype):
    weights = _weights(config, dtype)
    tok = Tokenizer.synthetic(config.vocab_size)
    save_safetensors_folder(tmp_path, config, weights, tokenizer=tok)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == config.arch and cfg["architectures"][0].endswith("ForCausalLM")
    loaded, state_dict, meta = load_safetensors_folder(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert meta["files"] == ["model.safetensors"]
    assert set(state_dict) == set(weights)
    for name, w in weights.items():
        assert state_dict[name].dtype == dtype and torch.equal(state_dict[name], w), name
    config2, _, tok2 = load_model_files(tmp_path)
    assert config2 == config
    assert tok2.fingerprint == tok.fingerprint
    assert (tok2.bos_token_id, tok2.eos_token_ids) == (tok.bos_token_id, tok.eos_token_ids)
    assert tok2.apply_chat_template([{"role": "user", "content": "hi"}]) == tok.apply_chat_template(
        [{"role": "user", "content": "hi"}]
    )


def test_tied_lm_head_is_not_written_and_is_dropped_on_load(tmp_path):
    config = _config()
    weights = _weights(config)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # shares storage: safetensors refuses
    save_safetensors_folder(tmp_path, config, weights)
    _, state_dict, _ = load_safetensors_folder(tmp_path)
    assert "lm_head.weight" not in state_dict


def _shard(tmp_path, config, index: bool) -> dict[str, torch.Tensor]:
    save_safetensors_folder(tmp_path, config, _weights(config))
    (tmp_path / "model.safetensors").unlink()
    weights = _weights(config)
    names = sorted(weights)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in parts.items():
        save_file({k: weights[k] for k in keys}, str(tmp_path / file))
    if index:
        weight_map = {k: file for file, keys in parts.items() for k in keys}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weights


@pytest.mark.parametrize("index", [True, False])
def test_sharded_folders(tmp_path, index):
    weights = _shard(tmp_path, _config(), index)
    _, state_dict, meta = load_safetensors_folder(tmp_path)
    assert len(meta["files"]) == 2
    assert all(torch.equal(state_dict[k], w) for k, w in weights.items())


# ----------------------------------------------------------------------------- bad folders


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder") as e:
        load_safetensors_folder(tmp_path / "gone")
    assert "gone" in str(e.value)


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"123")
    with pytest.raises(CheckpointError, match="not a folder"):
        load_safetensors_folder(tmp_path / "x.bin")


def test_no_config(tmp_path):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_safetensors_folder(tmp_path)


def test_unusable_config(tmp_path):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="unsupported model_type 'gpt2'"):
        load_safetensors_folder(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="cannot be parsed as JSON"):
        load_safetensors_folder(tmp_path)


def test_no_safetensors(tmp_path):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*.safetensors files"):
        load_safetensors_folder(tmp_path)


def test_index_names_missing_shard(tmp_path):
    _shard(tmp_path, _config(), index=True)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing shard.*model-00002-of-00002"):
        load_safetensors_folder(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_safetensors(tmp_path, damage):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    file = tmp_path / "model.safetensors"
    blob = file.read_bytes()
    file.write_bytes(
        {"garbage": b"\xff" * 64 + blob[64:], "truncated": blob[: len(blob) * 2 // 3], "empty": b""}[damage]
    )
    with pytest.raises(CheckpointError, match="corrupt or truncated safetensors") as e:
        load_safetensors_folder(tmp_path)
    assert "model.safetensors" in str(e.value)


def test_missing_tensor(tmp_path):
    config = _config()
    weights = _weights(config)
    save_file(
        {k: w for k, w in weights.items() if k != "model.layers.2.mlp.down_proj.weight"},
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 300,
                "hidden_size": 48,
                "intermediate_size": 80,
                "num_hidden_layers": 3,
                "num_attention_heads": 6,
                "num_key_value_heads": 2,
                "tie_word_embeddings": True,
            }
        )
    )
    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): model\.layers\.2\.mlp\.down_proj\.weight"):
        load_safetensors_folder(tmp_path)


def test_shape_mismatch(tmp_path):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"mlp\.gate_proj\.weight has shape \(80, 48\), config expects \(96, 48\)"
    ):
        load_safetensors_folder(tmp_path)


def test_save_refuses_incomplete_state_dict(tmp_path):
    weights = _weights(_config())
    del weights["model.norm.weight"]
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        save_safetensors_folder(tmp_path, _config(), weights)


def test_folder_without_tokenizer(tmp_path):
    save_safetensors_folder(tmp_path, _config(), _weights(_config()))
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_model_files(tmp_path)
