"""A corruption corpus, built here: W12 folders (single file and sharded) and GGUF files damaged in the ways
a disk, a copy or a careless edit damages them. Each W12 corruption is refused by ``w12 verify`` and by
the loader alike, naming the file and tensor; each GGUF one is refused by the loader, except bit flips in
quantized data, which GGUF (no checksum by design) cannot detect: those are documented below."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_specpilot.models.loader import load_model_files
from sglang_specpilot.models.presets import preset_config, synthetic_state_dict
from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
from sglang_specpilot.models.tokenizer import Tokenizer
from w12.checkpoint import INDEX_FILE, SINGLE_FILE, verify_w12_folder
from w12.convert import convert

L0 = "model.layers.0."
PLANES = ("hi", "lo", "base", "esc_idx", "esc_val")


def _hf(tmp: Path, seed: int) -> Path:
    cfg = preset_config("tiny-llama")
    sd = synthetic_state_dict(cfg, seed=seed, dtype=torch.bfloat16)
    sd[L0 + "mlp.up_proj.weight"][0, :4] = 0.0  # exact zeros: escapes to corrupt
    path = tmp / f"hf{seed}"
    save_safetensors_folder(path, cfg, sd, Tokenizer.synthetic(cfg.vocab_size))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("corpus")
    hf, other = _hf(tmp, 3), _hf(tmp, 4)
    out = {}
    for name, src, shard in (("single", hf, 1 << 30), ("sharded", hf, 60_000), ("other", other, 60_000)):
        out[name] = tmp / name
        convert(src, out[name], max_shard_bytes=shard, progress=False)
    assert (out["single"] / SINGLE_FILE).is_file() and (out["sharded"] / INDEX_FILE).is_file()
    return out


# ---- editing helpers ------------------------------------------------------------------------------------
def _read(file: Path):
    with safe_open(str(file), framework="pt") as h:
        return {k: h.get_tensor(k) for k in h.keys()}, dict(h.metadata())


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.w12.safetensors"))


def _holder(folder: Path, name: str) -> Path:
    for f in _files(folder):
        if name in json.loads(_read(f)[1]["w12.tensors"]):
            return f
    raise KeyError(name)


def _edit(folder: Path, name: str, change) -> None:
    """Rewrite the file holding tensor ``name``: ``change(tensors, entries, metadata)`` edits it in place."""
    f = _holder(folder, name)
    tensors, meta = _read(f)
    entries = json.loads(meta["w12.tensors"])
    change(tensors, entries, meta)
    meta["w12.tensors"] = json.dumps(entries)
    save_file(tensors, str(f), metadata=meta)


def _keys(name: str, entries: dict) -> list[str]:
    return [f"{name}.w12_{p}" for p in PLANES] if entries[name]["kind"] == "w12" else [name]


def swap_names(a: str, b: str):
    """Swap two tensors' names consistently: the file's keys and the metadata entries (so bytes match)."""

    def run(folder: Path) -> None:
        assert _holder(folder, a) == _holder(folder, b)

        def change(tensors, entries, meta):
            ka, kb = _keys(a, entries), _keys(b, entries)
            va, vb = [tensors.pop(k) for k in ka], [tensors.pop(k) for k in kb]
            tensors.update({k.replace(a, b): v for k, v in zip(ka, va, strict=True)})
            tensors.update({k.replace(b, a): v for k, v in zip(kb, vb, strict=True)})
            entries[a], entries[b] = entries[b], entries[a]

        _edit(folder, a, change)

    return run


def relabel_f16(name: str):
    """BF16 -> F16 in both headers (safetensors' and the W12 entry); the bytes stay as they are."""

    def run(folder: Path) -> None:
        def change(tensors, entries, meta):
            tensors[name] = tensors[name].view(torch.float16)
            entries[name]["dtype"] = "float16"

        _edit(folder, name, change)

    return run


def relabel_plane(name: str, plane: str, dtype):
    def run(folder: Path) -> None:
        _edit(folder, name, lambda t, e, m: t.update({f"{name}.w12_{plane}": t[f"{name}.w12_{plane}"].view(dtype)}))

    return run


def remove_tensor(name: str):
    """The tensor and its metadata entry gone (a consistent file, one tensor short)."""

    def run(folder: Path) -> None:
        def change(tensors, entries, meta):
            for k in _keys(name, entries):
                del tensors[k]
            del entries[name]

        _edit(folder, name, change)
        index = folder / INDEX_FILE
        if index.is_file():
            data = json.loads(index.read_text())
            del data["weight_map"][name]
            index.write_text(json.dumps(data))

    return run


def edit_config(**changes):
    def run(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(changes)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))

    return run


def side_file(name: str, how: str):
    def run(folder: Path) -> None:
        f = folder / name
        if how == "delete":
            f.unlink()
        else:
            f.write_bytes(f.read_bytes() + b" ")

    return run


def flip(name: str, key_suffix: str = ""):
    def run(folder: Path) -> None:
        def change(tensors, entries, meta):
            t = tensors[name + key_suffix]
            b = t.reshape(-1).view(torch.uint8).clone()
            b[len(b) // 2] ^= 0x10
            tensors[name + key_suffix] = b.view(t.dtype).reshape(t.shape)

        _edit(folder, name, change)

    return run


def edit_entry(name: str, field: str, value):
    def run(folder: Path) -> None:
        _edit(folder, name, lambda t, e, m: e[name].update({field: value}))

    return run


def edit_meta(key: str, value: str, which: int = 0):
    def run(folder: Path) -> None:
        f = _files(folder)[which]
        tensors, meta = _read(f)
        meta[key] = value
        save_file(tensors, str(f), metadata=meta)

    return run


def drop_meta(key: str):
    def run(folder: Path) -> None:
        for f in _files(folder):
            tensors, meta = _read(f)
            meta.pop(key)
            save_file(tensors, str(f), metadata=meta)

    return run


def raw_bytes(how: str):
    def run(folder: Path) -> None:
        f = _files(folder)[0]
        data = f.read_bytes()
        if how == "truncate":
            f.write_bytes(data[: len(data) - 100])
        elif how == "append":
            f.write_bytes(data + b"\0" * 64)
        elif how == "empty":
            f.write_bytes(b"")
        elif how == "header-length":
            f.write_bytes((len(data) * 4).to_bytes(8, "little") + data[8:])

    return run


def shard_op(how: str):
    def run(folder: Path) -> None:
        files, index = _files(folder), folder / INDEX_FILE
        data = json.loads(index.read_text())
        wm = data["weight_map"]
        if how in ("drop-first", "drop-last"):  # a shard and its index entries
            gone = files[0 if how == "drop-first" else -1]
            gone.unlink()
            data["weight_map"] = {k: v for k, v in wm.items() if v != gone.name}
        elif how == "drop-file":
            files[1].unlink()
        elif how == "drop-entry":
            del wm[sorted(wm)[0]]
        elif how == "drop-index":
            index.unlink()
            return
        elif how == "remap":
            first = sorted(wm)[0]
            wm[first] = next(v for v in sorted(set(wm.values())) if v != wm[first])
        elif how == "rename-files":
            a, b = files[0], files[1]
            tmp = a.with_suffix(".tmp")
            a.rename(tmp)
            b.rename(a)
            tmp.rename(b)
            return
        index.write_text(json.dumps(data))

    return run


def foreign_shard(folders):
    def run(folder: Path) -> None:  # a shard of another conversion (other weights) with the same name
        other = _files(folders["other"])[1]
        shutil.copy(other, folder / other.name)

    return run


SIDE = ("config.json", "tokenizer.json", "tokenizer_config.json")

W12_CASES = {
    # silently accepted before (bytes-only hashes, unhashed config): changed output
    "swap-k-v": ("single", swap_names(L0 + "self_attn.k_proj.weight", L0 + "self_attn.v_proj.weight")),
    "swap-norms": ("single", swap_names(L0 + "input_layernorm.weight", L0 + "post_attention_layernorm.weight")),
    "swap-gate-up": ("single", swap_names(L0 + "mlp.gate_proj.weight", L0 + "mlp.up_proj.weight")),
    "swap-layers-q": ("single", swap_names(L0 + "self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight")),
    "swap-embed-head": ("single", swap_names("model.embed_tokens.weight", "lm_head.weight")),
    "swap-final-norm": ("single", swap_names("model.norm.weight", L0 + "input_layernorm.weight")),
    "f16-norm": ("single", relabel_f16(L0 + "input_layernorm.weight")),
    "f16-final-norm": ("single", relabel_f16("model.norm.weight")),
    "f16-esc-val": ("single", relabel_plane(L0 + "mlp.up_proj.weight", "esc_val", torch.float16)),
    "int8-hi": ("single", relabel_plane(L0 + "mlp.down_proj.weight", "hi", torch.int8)),
    "config-eps": ("single", edit_config(rms_norm_eps=1e-3)),
    "config-theta": ("single", edit_config(rope_theta=500000.0)),
    "config-tie": ("single", edit_config(tie_word_embeddings=True)),
    "config-heads": ("single", edit_config(num_key_value_heads=4)),
    "config-ctx": ("single", edit_config(max_position_embeddings=64)),
    # accepted by verify, refused by generate before
    "config-layers": ("single", edit_config(num_hidden_layers=3)),
    "config-layers-sharded": ("sharded", edit_config(num_hidden_layers=5)),
    **{f"{how}-{n}": ("single", side_file(n, how)) for n in SIDE for how in ("delete", "edit")},
    "sharded-delete-config": ("sharded", side_file("config.json", "delete")),
    "rm-norm": ("single", remove_tensor("model.norm.weight")),
    "rm-embed": ("single", remove_tensor("model.embed_tokens.weight")),
    "rm-q": ("single", remove_tensor(L0 + "self_attn.q_proj.weight")),
    "rm-layer-norm": ("single", remove_tensor("model.layers.3.post_attention_layernorm.weight")),
    "rm-sharded": ("sharded", remove_tensor("model.layers.2.mlp.down_proj.weight")),
    "drop-first-shard": ("sharded", shard_op("drop-first")),
    "drop-last-shard": ("sharded", shard_op("drop-last")),
    "drop-shard-file": ("sharded", shard_op("drop-file")),
    "drop-index-entry": ("sharded", shard_op("drop-entry")),
    "drop-index": ("sharded", shard_op("drop-index")),
    "remap-entry": ("sharded", shard_op("remap")),
    "rename-shards": ("sharded", shard_op("rename-files")),
    "foreign-shard": ("sharded", "foreign"),
    # the damage the per-tensor hashes and structure checks caught already
    "flip-raw": ("single", flip(L0 + "input_layernorm.weight")),
    "flip-hi": ("single", flip(L0 + "mlp.down_proj.weight", ".w12_hi")),
    "flip-lo": ("single", flip(L0 + "mlp.down_proj.weight", ".w12_lo")),
    "flip-sharded": ("sharded", flip("model.layers.3.mlp.up_proj.weight", ".w12_lo")),
    "entry-sha": ("single", edit_entry("model.norm.weight", "sha256", "0" * 64)),
    "entry-digest": ("single", edit_entry("model.norm.weight", "digest", "0" * 64)),
    "entry-shape": ("single", edit_entry("model.norm.weight", "shape", [32, 2])),
    "entry-kind": ("single", edit_entry("model.norm.weight", "kind", "w13")),
    "meta-tensors": ("single", edit_meta("w12.tensors", "{not json")),
    "meta-manifest": ("single", edit_meta("w12.manifest", "[]")),
    "manifest-one-shard": ("sharded", edit_meta("w12.manifest", '{"tensors": [], "side_files": {}}', which=1)),
    "manifest-dropped-one": ("sharded", "drop-one-manifest"),
    "version": ("single", edit_meta("w12.format_version", "7")),
    "truncate": ("single", raw_bytes("truncate")),
    "append": ("single", raw_bytes("append")),
    "empty": ("single", raw_bytes("empty")),
    "header-length": ("single", raw_bytes("header-length")),
}


def _drop_one_manifest(folder: Path) -> None:
    f = _files(folder)[0]
    tensors, meta = _read(f)
    meta.pop("w12.manifest")
    save_file(tensors, str(f), metadata=meta)


def test_the_corpus_is_big_enough():
    assert len(W12_CASES) >= 40


@pytest.mark.parametrize("case", sorted(W12_CASES))
def test_w12_corruption_is_refused_by_verify_and_load(case, folders, tmp_path):
    which, corrupt = W12_CASES[case]
    folder = tmp_path / "copy"
    shutil.copytree(folders[which], folder)
    assert verify_w12_folder(folder) == []  # the clean copy is good
    if corrupt == "foreign":
        corrupt = foreign_shard(folders)
    elif corrupt == "drop-one-manifest":
        corrupt = _drop_one_manifest
    corrupt(folder)
    problems = verify_w12_folder(folder)
    assert problems, f"{case}: w12 verify accepted the corrupted folder"
    assert all(str(folder) in p or ".w12.safetensors" in p or "tensor " in p for p in problems), problems
    with pytest.raises(ValueError) as e:  # CheckpointError: what `specpilot generate --model` reports
        load_model_files(folder)
    assert "\n" not in str(e.value).strip() or "Traceback" not in str(e.value)


def test_a_legacy_folder_is_still_checked_against_its_config(folders, tmp_path):
    # Written before digests and the manifest: still read, and a removed tensor is still refused, by the
    # tensor set config.json implies.
    folder = tmp_path / "legacy"
    shutil.copytree(folders["single"], folder)
    drop_meta("w12.manifest")(folder)

    def no_digests(tensors, entries, meta):
        for e in entries.values():
            e.pop("digest")

    _edit(folder, "model.norm.weight", no_digests)
    assert verify_w12_folder(folder) == []
    load_model_files(folder)
    remove_tensor(L0 + "mlp.gate_proj.weight")(folder)
    problems = verify_w12_folder(folder)
    assert len(problems) == 1 and "mlp.gate_proj.weight" in problems[0] and "config.json" in problems[0]


def test_clean_folders_load(folders):
    for which in ("single", "sharded"):
        config, sd, _ = load_model_files(folders[which])
        assert config.num_layers == 4 and len(sd) == 3 + 4 * 9  # embed, norm, lm_head, 4 layers x 9


# ---- GGUF -------------------------------------------------------------------------------------------------
# GGUF has no checksum (by design), so the loader refuses what structure and values can reveal: non-finite
# scales and norms, tensor types or offsets that no longer tile the data section, token ids out of range,
# a tokenizer that cannot be built. A bit flipped inside quantized data or a float's mantissa, or a type
# relabelled to one of the same size (F16 <-> BF16), still decodes to finite numbers: undetectable.


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    from gguf import GGMLQuantizationType as Q
    from test_gguf import _tiny_config, _write_gguf

    cfg = _tiny_config("llama", tied=False)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_gguf(path, cfg, qtype=Q.Q8_0, tokenizer=Tokenizer.synthetic(cfg.vocab_size))
    return path


def _reader(path: Path):
    from gguf import GGUFReader

    return GGUFReader(path, "r+")


def _tensor(reader, name: str):
    return next(t for t in reader.tensors if t.name == name)


def poke_data(name: str, at: int, value: bytes):
    """Overwrite bytes ``at`` .. inside tensor ``name``'s data (a negative ``at`` counts from its end)."""

    def run(path: Path) -> None:
        r = _reader(path)
        t = _tensor(r, name)
        start = t.data_offset + (at if at >= 0 else t.n_bytes + at)
        r.data[start : start + len(value)] = list(value)
        r.data.flush()

    return run


def tensor_info(name: str, part: int, value: int):
    """Tensor info parts: [name length, name, n_dims, dims, type, offset (relative to the data section)]."""

    def run(path: Path) -> None:
        r = _reader(path)
        field = _tensor(r, name).field
        field.parts[part][0] = value
        r.data.flush()

    return run


def shift_offset(name: str, delta: int):
    def run(path: Path) -> None:
        r = _reader(path)
        field = _tensor(r, name).field
        field.parts[5][0] = int(field.parts[5][0]) + delta
        r.data.flush()

    return run


def same_offset(a: str, b: str):
    def run(path: Path) -> None:
        r = _reader(path)
        _tensor(r, b).field.parts[5][0] = int(_tensor(r, a).field.parts[5][0])
        r.data.flush()

    return run


def meta_value(key: str, value: int):
    def run(path: Path) -> None:
        r = _reader(path)
        f = r.fields[key]
        f.parts[f.data[0]][0] = value
        r.data.flush()

    return run


def rename_token(index: int, new: bytes):
    """Overwrite token ``index``'s string with ``new`` of the same length (keeps the file's layout)."""

    def run(path: Path) -> None:
        r = _reader(path)
        f = r.fields["tokenizer.ggml.tokens"]
        part = f.parts[f.data[index]]
        assert len(part) == len(new)
        part[:] = list(new)
        r.data.flush()

    return run


def break_a_merge(path: Path) -> None:
    """Make one merge name a token that is not in the vocabulary (same byte length: the layout stays)."""
    r = _reader(path)
    f = r.fields["tokenizer.ggml.merges"]
    for d in f.data:
        text = bytes(f.parts[d]).decode()
        first = text.split(" ", 1)[0]
        if len(first.encode()) == 2:
            f.parts[d][:2] = list("ʬ".encode())
            r.data.flush()
            return
    raise AssertionError("no merge with a 2-byte first token")


NAN32, INF32, NAN16, INF16 = b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x7e", b"\x00\x7c"
F32, Q8_0, Q4_0 = 0, 8, 2

GGUF_REFUSED = {
    "nan-final-norm": poke_data("output_norm.weight", 8, NAN32),
    "inf-attn-norm": poke_data("blk.0.attn_norm.weight", 0, INF32),
    "neg-inf-ffn-norm": poke_data("blk.1.ffn_norm.weight", -4, b"\x00\x00\x80\xff"),
    "nan-q8-scale-embed": poke_data("token_embd.weight", 0, NAN16),  # a Q8_0 block starts with its fp16 scale
    "inf-q8-scale-q": poke_data("blk.0.attn_q.weight", 34, INF16),  # the second block's scale
    "nan-q8-scale-head": poke_data("output.weight", 34 * 5, NAN16),
    "nan-q8-scale-down": poke_data("blk.1.ffn_down.weight", 0, NAN16),
    "type-q8-to-q4": tensor_info("blk.0.attn_k.weight", 4, Q4_0),
    "type-f32-to-q8": tensor_info("output_norm.weight", 4, Q8_0),
    "type-q8-to-f32": tensor_info("blk.1.attn_v.weight", 4, F32),
    "type-unknown": tensor_info("blk.0.attn_v.weight", 4, 99),
    "offset-plus-align": shift_offset("blk.0.attn_q.weight", 32),
    "offset-minus-align": shift_offset("blk.1.ffn_up.weight", -32),
    "offset-unaligned": shift_offset("blk.0.ffn_gate.weight", 4),
    "offset-overlap": same_offset("blk.0.attn_q.weight", "blk.0.attn_k.weight"),
    "offset-past-end": shift_offset("output.weight", 1 << 30),
    "bos-out-of-range": meta_value("tokenizer.ggml.bos_token_id", 5000),
    "eos-out-of-range": meta_value("tokenizer.ggml.eos_token_id", 300),
    "block-count": meta_value("llama.block_count", 3),
    "vocab-size-small": meta_value("llama.vocab_size", 200),
    "head-count": meta_value("llama.attention.head_count", 3),
    "merge-unknown-token": "merge",
}

GGUF_UNDETECTABLE = {  # they load; what they change cannot be told from the file
    "flip-q8-quant": poke_data("blk.0.ffn_up.weight", 10, b"\x55"),
    "flip-f32-mantissa": poke_data("blk.0.attn_norm.weight", 0, b"\x01"),
}


def test_the_gguf_corpus_is_big_enough():
    assert len(GGUF_REFUSED) >= 20


@pytest.mark.parametrize("case", sorted(GGUF_REFUSED))
def test_gguf_corruption_is_refused(case, gguf_file, tmp_path):
    path = tmp_path / "bad.gguf"
    shutil.copy(gguf_file, path)
    load_model_files(path)  # the clean copy loads
    corrupt = GGUF_REFUSED[case]
    if corrupt == "merge":  # a merge naming a token that is not in the vocabulary: the BPE cannot be built
        break_a_merge(path)
    else:
        corrupt(path)
    with pytest.raises(ValueError) as e:
        load_model_files(path)
    assert str(path) in str(e.value) or "GGUF" in str(e.value), str(e.value)


@pytest.mark.parametrize("case", sorted(GGUF_UNDETECTABLE))
def test_gguf_data_bit_flips_are_undetectable(case, gguf_file, tmp_path):
    path = tmp_path / "flipped.gguf"
    shutil.copy(gguf_file, path)
    _, clean, _ = load_model_files(path)
    GGUF_UNDETECTABLE[case](path)
    _, flipped, _ = load_model_files(path)  # loads: GGUF carries no checksum
    assert any(not torch.equal(clean[k], flipped[k]) for k in clean)  # and the weights did change


def test_the_cli_reports_a_corrupt_gguf_in_one_line(gguf_file, tmp_path, capsys):
    from sglang_specpilot import cli

    path = tmp_path / "nan.gguf"
    shutil.copy(gguf_file, path)
    GGUF_REFUSED["nan-final-norm"](path)
    rc = cli.main(["generate", "--prompt", "x", "--model", str(path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "non-finite" in err and "output_norm.weight" in err and "Traceback" not in err
