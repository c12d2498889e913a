"""Load a llama.cpp GGUF file into Hugging Face-named float32 tensors.

Three things differ from a Hugging Face checkpoint and are undone here:

1. Names: ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (see ``_LAYER_NAMES``).
2. Storage: weights are quantized in blocks (``dequantize``); shapes are stored in ggml's ``ne`` order,
   fastest dimension first, so a torch ``[out, in]`` weight is listed as ``[in, out]``.
3. Rope layout: for arch ``llama`` llama.cpp's converter permutes the rows of q_proj / k_proj so each
   head's rotary pairs are interleaved (GPT-J style); HF rotates halves (NeoX style). ``unpermute_qk``
   restores the HF order. qwen2 / qwen3 are converted without the permutation.

``dequantize`` is bit-identical to ``gguf.quants.dequantize``: every product and sum is done in float32
in the same order (e.g. Q4_1 is ``(d * q) + m`` with two roundings, never a fused multiply-add).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from sglang_specpilot.models.config import ARCHS, ModelConfig
from sglang_specpilot.models.errors import CheckpointError, check_state_dict

Q = GGMLQuantizationType
T = TypeVar("T", torch.Tensor, np.ndarray)

_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None if it is not a Llama/Qwen decoder weight."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


# ---------------------------------------------------------------------------------------------------
# Dequantization. Each _dq_* takes an [n_blocks, type_size] uint8 array and returns [n_blocks,
# block_size] float32. Layouts follow ggml-common.h; the arithmetic follows gguf/quants.py op for op.
# NumPy rather than torch: numpy is single-threaded, and torch's 2-thread pool costs ~7 ms per op when
# the other core is busy (measured: SmolLM2 dequant 0.36 s in numpy vs 2.0 s in torch with 2 threads).
# ---------------------------------------------------------------------------------------------------

_SHIFT_4 = np.array([0, 4], dtype=np.uint8)
_SHIFT_8 = np.arange(8, dtype=np.uint8)


def _f16(b: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of each block, widened (exactly) to float32: [n, 1]."""
    return b[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 2k] values: all low nibbles first, then all high nibbles (ggml order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 8k] bits; bit j of the little-endian word is element j."""
    return ((qh[:, :, None] >> _SHIFT_8) & 1).reshape(qh.shape[0], -1)


def _dq_q4_0(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b[:, 2:]).view(np.int8) - np.int8(8)).astype(np.float32)
    return _f16(b, 0) * q


def _dq_q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 4:]).astype(np.float32)
    q *= _f16(b, 0)
    q += _f16(b, 2)
    return q


def _dq_q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:]) | (_bits(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.view(np.int8) - np.int8(16)).astype(np.float32)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b[:, 8:]) | (_bits(b[:, 4:8]) << 4)).astype(np.float32)
    q *= _f16(b, 0)
    q += _f16(b, 2)
    return q


def _dq_q8_0(b: np.ndarray) -> np.ndarray:
    q = b[:, 2:].view(np.int8).astype(np.float32)
    q *= _f16(b, 0)
    return q


def _dq_q8_k(b: np.ndarray) -> np.ndarray:
    # float32 d, int8 qs[256], int16 bsums[16]; gguf-py has no reference, ggml computes d * q.
    q = b[:, 4:260].view(np.int8).astype(np.float32)
    q *= b[:, 0:4].copy().view(np.float32)
    return q


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins per block: ([n, 8], [n, 8])."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: sub-block 2c is chunk c's low nibbles, 2c+1 its high nibbles."""
    return ((qs.reshape(-1, 4, 1, 32) >> _SHIFT_4[:, None]) & 0x0F).reshape(-1, 8, 32)


def _dq_q4_k(b: np.ndarray) -> np.ndarray:
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc.astype(np.float32))[:, :, None]
    dm = (_f16(b, 2) * mn.astype(np.float32))[:, :, None]
    return (d * _k_low_nibbles(b[:, 16:]).astype(np.float32) - dm).reshape(-1, 256)


def _dq_q5_k(b: np.ndarray) -> np.ndarray:
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc.astype(np.float32))[:, :, None]
    dm = (_f16(b, 2) * mn.astype(np.float32))[:, :, None]
    # Sub-block i takes its fifth bit from bit i of the 32 qh bytes.
    qh = (b[:, None, 16:48] >> _SHIFT_8[:, None]) & 1
    q = _k_low_nibbles(b[:, 48:]) | (qh << 4)
    return (d * q.astype(np.float32) - dm).reshape(-1, 256)


def _dq_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql, qh, scales = b[:, 0:128], b[:, 128:192], b[:, 192:208]
    d = (_f16(b, 208) * scales.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    lo = ((ql.reshape(n, 2, 1, 64) >> _SHIFT_4[:, None]) & 0x0F).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3).reshape(n, 8, 32)
    q = (lo | (hi << 4)).view(np.int8) - np.int8(32)
    return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


_BLOCK_DEQUANT = {
    Q.Q4_0: _dq_q4_0,
    Q.Q4_1: _dq_q4_1,
    Q.Q5_0: _dq_q5_0,
    Q.Q5_1: _dq_q5_1,
    Q.Q8_0: _dq_q8_0,
    Q.Q4_K: _dq_q4_k,
    Q.Q5_K: _dq_q5_k,
    Q.Q6_K: _dq_q6_k,
    Q.Q8_K: _dq_q8_k,
}
SUPPORTED_QTYPES = ("F32", "F16", "BF16", *(t.name for t in _BLOCK_DEQUANT))

# Blocks per chunk: 65536 Q4_1 blocks is 1.3 MiB in, 8 MiB out; smaller chunks were slower (0.48 s at
# 16384 vs 0.36 s for all of SmolLM2), whole tensors at once thrash the cache.
_CHUNK_BLOCKS = 1 << 16


def dequantize(data: np.ndarray, qtype: int | GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode one ggml tensor to float32.

    Parameters
    ----------
    data : np.ndarray
        The raw tensor as ``GGUFReader`` gives it: uint8 blocks for quantized types, or float32 /
        float16 / uint8 for the float types. Any shape; only its bytes are used.
    qtype : GGMLQuantizationType or int
    shape : tuple[int, ...]
        Logical shape in torch order (the reverse of ggml's ``ne``), e.g. ``(out_features, in_features)``.

    Returns
    -------
    torch.Tensor
        float32 of ``shape``, never sharing memory with ``data``; bit-identical to
        ``gguf.quants.dequantize(data, qtype).reshape(shape)``.
    """
    return torch.from_numpy(_dequantize_np(data, qtype, shape))


def _dequantize_np(data: np.ndarray, qtype: int | GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    try:
        qtype = Q(int(qtype))
    except ValueError:
        raise CheckpointError(f"unknown ggml tensor type {qtype}") from None
    if qtype not in _BLOCK_DEQUANT and qtype not in (Q.F32, Q.F16, Q.BF16):
        raise CheckpointError(f"tensor type {qtype.name} is not supported; supported: {', '.join(SUPPORTED_QTYPES)}")
    n_elem = math.prod(shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if n_elem % block_size:
        raise CheckpointError(f"{qtype.name} tensor of shape {shape} is not a whole number of {block_size}-blocks")
    n_blocks = n_elem // block_size
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size != n_blocks * type_size:
        raise CheckpointError(
            f"{qtype.name} tensor of shape {shape} needs {n_blocks * type_size} bytes, got {raw.size}"
        )
    if qtype == Q.F32:
        out = raw.view(np.float32).copy()
    elif qtype == Q.F16:
        out = raw.view(np.float16).astype(np.float32)
    elif qtype == Q.BF16:
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        blocks = raw.reshape(n_blocks, type_size)
        out = np.empty((n_blocks, block_size), dtype=np.float32)
        fn = _BLOCK_DEQUANT[qtype]
        for start in range(0, n_blocks, _CHUNK_BLOCKS):
            out[start : start + _CHUNK_BLOCKS] = fn(blocks[start : start + _CHUNK_BLOCKS])
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------------
# Rope layout.
# ---------------------------------------------------------------------------------------------------


def permute_qk(w: T, n_heads: int) -> T:
    """HF (rotate-half) rows -> llama.cpp (interleaved) rows, as llama.cpp's converter does.

    Within each head of ``head_dim`` rows, row ``i`` of the first half and row ``i`` of the second half
    become rows ``2i`` and ``2i + 1``. Works on a [n_heads * head_dim, in] weight or a [n_heads *
    head_dim] bias, as a torch tensor or a numpy array. Used by tests to check ``unpermute_qk``.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: T, n_heads: int) -> T:
    """Inverse of :func:`permute_qk`: llama.cpp interleaved rows back to HF rotate-half rows."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------------
# File reading.
# ---------------------------------------------------------------------------------------------------


class _FastReader(GGUFReader):
    """``GGUFReader`` that slices a plain ndarray view of its memmap instead of the memmap itself.

    Parsing SmolLM2's 98k vocabulary/merge strings makes ~250k small reads; ``np.memmap.__getitem__``
    and ``__array_finalize__`` dominate them (measured: 2.9 s -> 0.7-1.0 s). Overrides the private
    ``_get`` of gguf 0.19 with the same semantics; ``_open`` falls back to the stock reader on error.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
        buf = self.__dict__.get("_plain")
        if buf is None:
            buf = self._plain = self.data.view(np.ndarray)
        dtype, count = np.dtype(dtype), int(count)
        arr = buf[offset : offset + dtype.itemsize * count].view(dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


def _open(path: Path) -> GGUFReader:
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if size < 4:
        raise CheckpointError(f"{path}: truncated file: {size} bytes is too short to be a GGUF file")
    if magic != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        reader = _FastReader(path)
    except Exception:
        try:
            reader = GGUFReader(path)
        except Exception as e:
            # GGUFReader reads past the end of a short memmap as empty arrays, so a truncated file shows
            # up as an IndexError / reshape ValueError deep inside it; say what it most likely means.
            raise CheckpointError(
                f"{path}: truncated or corrupt GGUF file ({size} bytes): {type(e).__name__}: {e}"
            ) from e
    if reader.byte_order != "I":
        raise CheckpointError(f"{path}: big-endian GGUF files are not supported")
    for t in reader.tensors:
        end = t.data_offset + t.n_bytes
        if end > size:
            raise CheckpointError(
                f"{path}: truncated GGUF file: tensor {t.name} ends at byte {end}, file has {size} bytes"
            )
    _check_layout(path, reader, size)
    return reader


def _check_layout(path: Path, reader: GGUFReader, size: int) -> None:
    """The tensors must tile the data section: each at an aligned offset, the next one starting where the
    previous one ends (rounded up to the alignment), none overlapping. A tensor whose type or offset was
    changed breaks this (its byte count or position no longer fits), as does a duplicated tensor name.
    GGUF has no checksum: a bit flipped inside a tensor's data cannot be detected here."""
    align = int(reader.alignment)
    names = [t.name for t in reader.tensors]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise CheckpointError(f"{path}: tensor(s) {', '.join(dup[:3])} appear more than once")
    expect = int(reader.data_offset)
    prev = None
    for t in sorted(reader.tensors, key=lambda t: int(t.data_offset)):
        start = int(t.data_offset)
        if (start - int(reader.data_offset)) % align:
            raise CheckpointError(f"{path}: tensor {t.name}: data offset {start} is not aligned to {align} bytes")
        if start != expect:
            what = "overlaps" if start < expect else "leaves a gap after"
            after = f"tensor {prev}" if prev else "the header"
            raise CheckpointError(
                f"{path}: tensor {t.name} ({t.tensor_type.name}) at byte {start} {what} {after} (expected byte "
                f"{expect}): a changed tensor type or offset, or a corrupt header"
            )
        end = start + int(t.n_bytes)
        expect = end + (-end) % align
        prev = t.name
    if reader.tensors and size > expect + align:
        raise CheckpointError(f"{path}: {size - expect} bytes after the last tensor's data: a corrupt header")


def _metadata(reader: GGUFReader) -> dict:
    """All key/value fields as plain Python values (strings, numbers, lists)."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def read_gguf_metadata(path: str | Path) -> dict:
    """Every key/value of a GGUF file as plain Python values, without decoding any tensor (~1 s for
    SmolLM2, nearly all of it the 98k vocabulary strings). Raises :class:`CheckpointError` like
    :func:`load_gguf`."""
    return _metadata(_open(Path(path)))


def _f32(value: float) -> float:
    """GGUF stores floats as float32: 1e-5 reads back as 9.999999747e-06. Give the shortest decimal that
    rounds to the same float32 (1e-05), as the original config.json has it."""
    return float(str(np.float32(value)))


def _rope_scaling(meta: dict, arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling = {"rope_type": kind, "factor": _f32(meta[f"{arch}.rope.scaling.factor"])}
    orig = meta.get(f"{arch}.rope.scaling.original_context_length")
    if orig is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


def config_from_metadata(meta: dict, shapes: dict[str, tuple[int, ...]], source: str = "GGUF") -> ModelConfig:
    """Build a :class:`ModelConfig` from GGUF key/values (``{arch}.block_count`` etc.).

    ``shapes`` maps GGUF tensor names to torch-order shapes; it decides tying (no ``output.weight``),
    q/k/v biases, and the vocabulary size when ``{arch}.vocab_size`` is absent.
    """
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{source}: unsupported architecture {arch!r}; supported: {', '.join(ARCHS)}")

    def need(key: str):
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"{source}: metadata key {arch}.{key} is missing")
        return meta[f"{arch}.{key}"]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or shapes.get("token_embd.weight", (0,))[0]
    if not vocab:
        raise CheckpointError(f"{source}: no {arch}.vocab_size and no token_embd.weight tensor")
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    kwargs = dict(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        rms_norm_eps=_f32(need("attention.layer_norm_rms_epsilon")),
        rope_theta=_f32(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(meta, arch),
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in shapes,
        attention_bias="blk.0.attn_q.bias" in shapes,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(int(e) for e in eos)),
        name=meta.get("general.name", ""),
    )
    try:
        return ModelConfig(**kwargs)
    except ValueError as e:
        raise CheckpointError(f"{source}: inconsistent model metadata: {e}") from None


def load_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """Read a GGUF file (memory-mapped) and dequantize every tensor.

    Returns
    -------
    config : ModelConfig
    state_dict : dict[str, torch.Tensor]
        float32 tensors under HF names in HF shapes ([out_features, in_features]) and HF rope layout.
        ``lm_head.weight`` is absent when the embeddings are tied.
    metadata : dict
        Every GGUF key/value (``general.*``, ``{arch}.*``, ``tokenizer.*``) as plain Python values;
        ``Tokenizer.from_gguf_metadata`` accepts it.
    """
    path = Path(path)
    reader = _open(path)
    meta = _metadata(reader)
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape.tolist())) for t in reader.tensors}
    if "rope_freqs.weight" in shapes:
        # Llama 3.1-style scaling is stored as per-frequency divisors, not as an HF rope_scaling dict.
        raise CheckpointError(f"{path}: rope_freqs (Llama 3 rope scaling) GGUF files are not supported")
    config = config_from_metadata(meta, shapes, str(path))
    state_dict: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise CheckpointError(f"{path}: unexpected tensor {t.name} for arch {config.arch}")
        try:
            w = _dequantize_np(t.data, t.tensor_type, shapes[t.name])
        except CheckpointError as e:
            raise CheckpointError(f"{path}: tensor {t.name}: {e}") from None
        bad = w.size - int(np.isfinite(w).sum())
        if bad:
            kind = "a norm" if "norm" in t.name else "a weight"
            raise CheckpointError(
                f"{path}: tensor {t.name} ({t.tensor_type.name}, {kind}) holds {bad} non-finite value(s) (NaN or "
                "Inf) after dequantization: a corrupt scale or value"
            )
        if config.arch == "llama" and ".self_attn.q_proj." in name:
            w = unpermute_qk(w, config.num_heads)
        elif config.arch == "llama" and ".self_attn.k_proj." in name:
            w = unpermute_qk(w, config.num_kv_heads)
        state_dict[name] = torch.from_numpy(np.ascontiguousarray(w))
    check_state_dict(config, state_dict, str(path))
    _check_token_ids(path, meta, config.vocab_size)
    return config, state_dict, meta


SPECIAL_TOKEN_KEYS = tuple(
    f"tokenizer.ggml.{k}_token_id" for k in ("bos", "eos", "eot", "unknown", "padding", "seperator", "eom")
)


def _check_token_ids(path: Path, meta: dict, vocab_size: int) -> None:
    """Token ids the metadata names must index the vocabulary and the embedding."""
    tokens = meta.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, list) else None
    if n_tokens is not None and n_tokens > vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {n_tokens} tokens but the model's vocabulary (embedding rows) is "
            f"{vocab_size}: ids >= {vocab_size} would index past the embedding"
        )
    limit = min(vocab_size, n_tokens) if n_tokens is not None else vocab_size
    for key in SPECIAL_TOKEN_KEYS:
        value = meta.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise CheckpointError(f"{path}: {key} = {value!r} is out of range: token ids are 0..{limit - 1}")
