"""W12 weights in the engine: the greedy output of a W12 model equals the BF16 model's, token for token."""

import torch
from helpers import engine, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.models.w12_weights import to_w12


def test_w12_model_equals_bf16_model():
    # On the CPU the W12 path decodes bit-exactly and runs the same F.linear, so equality is exact.
    bf16 = tiny_model("tiny-qwen3", dtype=torch.bfloat16)
    w12 = to_w12(tiny_model("tiny-qwen3", dtype=torch.bfloat16))
    assert type(w12.layers[0].attn.wqkv).__name__ == "W12Linear" and type(w12.lm_head).__name__ == "W12Linear"
    ps = prompts([6, 19, 3], bf16.cfg.vocab_size, seed=7)
    p = SamplingParams(max_new_tokens=20, ignore_eos=True)
    ref = [r.token_ids for r in engine(bf16).generate(ps, p)]
    assert [r.token_ids for r in engine(w12).generate(ps, p)] == ref
    assert [r.token_ids for r in engine(w12, w12.truncated(1), gamma=3).generate(ps, p)] == ref


def test_w12_options_validate():
    import pytest

    assert EngineOptions(weights="w12", device="cpu").dtype == "bfloat16"
    with pytest.raises(ValueError, match="bfloat16"):
        EngineOptions(weights="w12", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="unknown weights"):
        EngineOptions(weights="w8")


def test_converted_w12_folder_loads_bit_exact(tmp_path):
    from sglang_specpilot.models.loader import load_model_files
    from sglang_specpilot.models.presets import preset_config, synthetic_state_dict
    from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
    from sglang_specpilot.models.tokenizer import Tokenizer
    from w12.convert import convert

    cfg = preset_config("tiny-llama")
    sd = synthetic_state_dict(cfg, dtype=torch.bfloat16, std=0.1)
    save_safetensors_folder(tmp_path / "src", cfg, sd, tokenizer=Tokenizer.synthetic(cfg.vocab_size))
    convert(tmp_path / "src", tmp_path / "dst", verify=True, progress=False)
    cfg2, sd2, _ = load_model_files(tmp_path / "dst")
    assert cfg2.num_layers == cfg.num_layers and set(sd2) >= set(sd)
    for name, t in sd.items():
        assert torch.equal(sd2[name].view(torch.int16), t.view(torch.int16)), name
