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


def test_w12_ar_suite_dry_run_on_cpu(monkeypatch):
    # The suite's bookkeeping on a tiny preset (its timings mean nothing here). On the CPU W12 decodes
    # bit-exactly, so the greedy comparison must find no mismatch and token forcing must accept.
    import argparse

    from sglang_specpilot.suites import w12_ar

    monkeypatch.setattr(w12_ar, "DEVICE", "cpu")
    p = argparse.ArgumentParser()
    w12_ar._args(p)
    flags = "--preset tiny-llama --no-compile --blocks 2 --inner 1 --new-tokens 4 --repeats 1"
    args = p.parse_args(flags.split())
    out = {"metrics": {}, "rows": []}
    w12_ar._llama8b(args, out)
    m = out["metrics"]
    assert m["llama8b_w12_vs_bf16_mismatched_prompts"] == 0 and m["llama8b_w12_forcing_accepted"] == 1
    assert 0.7 < m["llama8b_w12_bytes_over_bf16"] < 0.8 and m["ar_speedup_bs1_llama8b"] > 0
    assert len(out["rows"][1]["tokens_per_s"]["w12"]) == 2


def test_a_compiling_runner_gives_every_layer_one_escape_length_per_projection():
    # One compiled block serves every layer, and compile guards on buffer shapes: the escape counts that
    # differ per layer (a real model's do) would recompile per layer (on the H200 the real SmolLM2 hit
    # dynamo's limit of 256), so the runner pads each projection's kernel escapes to one length.
    from sglang_specpilot.engine.runner import ModelRunner

    model = tiny_model("tiny-llama", dtype=torch.bfloat16)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):  # zeros are escapes: a different count per layer
            layer.mlp.w2.weight[0, : 3 + 5 * i] = 0.0
    w12 = to_w12(model)
    real = [int(layer.mlp.w2.esc_idx.numel()) for layer in w12.layers]
    assert len(set(real)) == len(real) > 1
    ModelRunner(w12, 1, 64, compile=False)
    assert len({int(layer.mlp.w2.kernel_esc_idx.numel()) for layer in w12.layers}) == len(real)  # untouched
    ModelRunner(w12, 1, 64, compile=True)
    for name in ("attn.wqkv", "attn.wo", "mlp.w13", "mlp.w2"):
        mods = [layer.get_submodule(name) for layer in w12.layers]
        assert len({int(m.kernel_esc_idx.numel()) for m in mods}) == 1, name
        assert all(torch.equal(m.kernel_esc_idx[: m.esc_idx.numel()], m.esc_idx) for m in mods)
    assert [int(layer.mlp.w2.esc_idx.numel()) for layer in w12.layers] == real  # the record itself is kept
