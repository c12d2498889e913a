"""W12 checkpoints: convert a HF folder and the real SmolLM2 GGUF, verify, and refuse every corruption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import needs_smollm2, smollm2_path
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_specpilot.models.config import ModelConfig
from sglang_specpilot.models.loader import load_model_files
from sglang_specpilot.models.presets import preset_config, synthetic_state_dict
from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
from sglang_specpilot.models.tokenizer import Tokenizer
from w12.checkpoint import INDEX_FILE, SINGLE_FILE, load_w12_folder, tensor_sha256, verify_w12_folder
from w12.cli import main as w12_main
from w12.codec import W12FormatError, decode
from w12.convert import convert
from w12.format import W12Tensor

ZEROED = "model.layers.0.mlp.up_proj.weight"  # given exact zeros, so it has escapes to corrupt


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    cfg = preset_config("tiny-llama")
    sd = synthetic_state_dict(cfg, seed=3, dtype=torch.bfloat16)
    sd[ZEROED][0, :4] = 0.0
    sd[ZEROED][5, 7] = -0.0
    path = tmp_path_factory.mktemp("hf")
    save_safetensors_folder(path, cfg, sd, Tokenizer.synthetic(cfg.vocab_size))
    return path, sd


@pytest.fixture(scope="module")
def converted(hf_folder, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("w12") / "out"
    report = convert(hf_folder[0], dst, verify=True, progress=False)
    assert report.verified and report.files == [SINGLE_FILE]
    return dst


@pytest.fixture
def copy(converted, tmp_path) -> Path:
    """A scratch copy of the converted folder to corrupt."""
    dst = tmp_path / "copy"
    dst.mkdir()
    for f in converted.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_convert_round_trip(hf_folder, converted):
    src, sd = hf_folder
    tensors, meta = load_w12_folder(converted)
    assert set(tensors) == set(sd)
    for name, want in sd.items():
        got = tensors[name]
        assert isinstance(got, W12Tensor) == (want.dim() == 2), name
        out = decode(got) if isinstance(got, W12Tensor) else got
        assert torch.equal(bits(out), bits(want)), name
        entry = meta["tensors"][name]
        assert entry["shape"] == list(want.shape) and entry["sha256"] == tensor_sha256(want)
    assert tensors[ZEROED].esc_idx.numel() >= 5  # the zeros (and -0) are escapes
    assert meta["format_version"] == "1" and meta["source"]["kind"] == "safetensors"
    # the folder stays loadable: config and tokenizer came along
    cfg = ModelConfig.from_hf(json.loads((converted / "config.json").read_text()))
    assert cfg.hidden_size == preset_config("tiny-llama").hidden_size
    assert Tokenizer.from_folder(converted).fingerprint == Tokenizer.from_folder(src).fingerprint
    assert verify_w12_folder(converted) == []


def test_cli_convert_verify_and_refusals(hf_folder, tmp_path, capsys):
    src = hf_folder[0]
    dst = tmp_path / "cli"
    assert w12_main(["convert", str(src), str(dst), "--verify", "--quiet", "--dtype-check"]) == 0
    assert "bits/weight" in capsys.readouterr().out
    assert w12_main(["verify", str(dst), "--quiet"]) == 0
    assert w12_main(["convert", str(src), str(dst), "--quiet"]) == 1  # DST already holds a checkpoint
    assert "--force" in capsys.readouterr().err
    assert w12_main(["convert", str(src), str(dst), "--force", "--verify"]) == 0
    err = capsys.readouterr().err.splitlines()  # not a terminal: one final line per bar
    assert [line.split(" [")[0] for line in err] == ["w12 convert", "w12 verify"] and "100.0%" in err[0]
    assert w12_main(["verify", str(tmp_path / "nothing")]) == 1
    assert "not a converted W12 folder" in capsys.readouterr().err


def test_dtype_check_refuses_lossy_float32(tmp_path):
    cfg = preset_config("tiny-llama")
    src = tmp_path / "fp32"
    save_safetensors_folder(src, cfg, synthetic_state_dict(cfg, seed=1))
    with pytest.raises(W12FormatError, match="not exact in bfloat16"):
        convert(src, tmp_path / "out", exact=True, progress=False)
    assert not list((tmp_path / "out").glob("*.w12.safetensors*"))  # nothing half-written left behind
    report = convert(src, tmp_path / "out", verify=True, progress=False)  # default: rounded, then exact
    assert report.rounded_tensors and report.verified


def test_sharded_conversion(hf_folder, tmp_path):
    dst = tmp_path / "sharded"
    report = convert(hf_folder[0], dst, verify=True, max_shard_bytes=100_000, progress=False)
    assert len(report.files) > 2 and (dst / INDEX_FILE).is_file()
    assert verify_w12_folder(dst) == []
    (dst / report.files[1]).unlink()
    with pytest.raises(W12FormatError, match="missing shard"):
        load_w12_folder(dst)


# ----------------------------------------------------------------------------------------------------
# corruption: every case must be refused with a message naming what is wrong
# ----------------------------------------------------------------------------------------------------


def _header(file: Path) -> tuple[int, dict]:
    data = file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return 8 + n, json.loads(data[8 : 8 + n])


def _flip_bit(file: Path, key: str, byte: int, bit: int) -> None:
    start, header = _header(file)
    data = bytearray(file.read_bytes())
    data[start + header[key]["data_offsets"][0] + byte] ^= 1 << bit
    file.write_bytes(bytes(data))


def _rewrite(file: Path, change) -> None:
    with safe_open(str(file), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    change(tensors)
    save_file(tensors, str(file), metadata=meta)


def _refused(dst: Path, match: str, capsys) -> None:
    with pytest.raises(W12FormatError, match=match):
        load_w12_folder(dst)
    assert w12_main(["verify", str(dst), "--quiet"]) == 1
    assert match.split(".*")[0] in capsys.readouterr().err


def test_truncated_file_is_refused(copy, capsys):
    f = copy / SINGLE_FILE
    f.write_bytes(f.read_bytes()[:-1000])
    _refused(copy, "truncated", capsys)


NAME = "model.layers.1.self_attn.q_proj.weight"


@pytest.mark.parametrize("plane, byte, bit", [("hi", 0, 7), ("hi", 100, 3), ("lo", 17, 0), ("esc_val", 0, 0)])
def test_flipped_bit_is_caught_by_the_hash(copy, capsys, plane, byte, bit):
    name = ZEROED if plane == "esc_val" else NAME
    key = f"{name}.w12_{plane}"
    tensors, _ = load_w12_folder(copy, verify_hashes=False)
    if plane == "hi":
        assert int(tensors[name].hi.view(-1)[byte]) != 0  # not an escape slot: only the hash can tell
    _flip_bit(copy / SINGLE_FILE, key, byte, bit)
    load_w12_folder(copy, verify_hashes=False)  # structurally still valid ...
    _refused(copy, f"tensor {name}: sha256", capsys)  # ... but the decoded bytes are not the original


def test_flipped_bit_in_a_raw_tensor(copy, capsys):
    _flip_bit(copy / SINGLE_FILE, "model.norm.weight", 3, 2)
    _refused(copy, "tensor model.norm.weight: sha256", capsys)


@pytest.mark.parametrize(
    "key, change, match",
    [
        (f"{NAME}.w12_hi", lambda t: t[:, :-1].contiguous(), "hi has shape"),
        (f"{NAME}.w12_lo", lambda t: torch.cat([t, t[:1]]), "lo has shape"),
        (f"{NAME}.w12_base", lambda t: t.clone().fill_(241), "base 241 > 240"),
        (f"{ZEROED}.w12_esc_idx", lambda t: t + 10**9, "out of range"),
        (f"{ZEROED}.w12_esc_idx", lambda t: t.flip(0).contiguous(), "not strictly increasing"),
        (f"{ZEROED}.w12_esc_idx", lambda t: torch.cat([t[:1], t[:-1]]), "not strictly increasing"),
        (f"{ZEROED}.w12_esc_val", lambda t: t[:-1].contiguous(), "equal length"),
        ("model.norm.weight", lambda t: t[:-1].contiguous(), "metadata says"),
    ],
)
def test_malformed_tensors_are_refused(copy, capsys, key, change, match):
    def edit(tensors):
        tensors[key] = change(tensors[key])

    _rewrite(copy / SINGLE_FILE, edit)
    _refused(copy, match, capsys)


def test_missing_plane_and_bad_metadata(copy, capsys):
    _rewrite(copy / SINGLE_FILE, lambda t: t.pop(f"{NAME}.w12_lo"))
    _refused(copy, "do not match its metadata", capsys)


def _edit_metadata(file: Path, change) -> None:
    with safe_open(str(file), framework="pt") as h:
        meta, tensors = h.metadata(), {k: h.get_tensor(k) for k in h.keys()}
    change(meta)
    save_file(tensors, str(file), metadata=meta)


def test_wrong_format_version(copy, capsys):
    _edit_metadata(copy / SINGLE_FILE, lambda m: m.update({"w12.format_version": "99"}))
    _refused(copy, "format version", capsys)


def test_metadata_shape_that_disagrees_with_the_planes(copy, capsys):
    def widen(meta):
        entries = json.loads(meta["w12.tensors"])
        entries[NAME]["shape"][1] += 2
        meta["w12.tensors"] = json.dumps(entries)

    _edit_metadata(copy / SINGLE_FILE, widen)
    _refused(copy, f"tensor {NAME}: hi has shape", capsys)


# ----------------------------------------------------------------------------------------------------
# the real model: SmolLM2-135M, Q4_1 GGUF -> float32 -> bf16 -> W12
# ----------------------------------------------------------------------------------------------------


@needs_smollm2
def test_smollm2_gguf_converts_bit_exact(tmp_path):
    path = smollm2_path()
    dst = tmp_path / "smollm2"
    report = convert(path, dst, verify=True, progress=False)  # verify: decode == bf16(source), hashes
    assert report.verified and report.w12_tensors == 211
    assert report.bits_per_weight < 12.25  # embedding included; see w12/bits.py for the zero escapes
    config, state_dict, tokenizer = load_model_files(path)
    tensors, meta = load_w12_folder(dst, verify_hashes=False)
    assert set(tensors) == set(state_dict)
    name = "model.layers.7.mlp.down_proj.weight"
    assert torch.equal(bits(decode(tensors[name])), bits(state_dict[name].to(torch.bfloat16)))
    assert meta["tensors"][name]["source_dtype"] == "float32"
    assert ModelConfig.from_hf(json.loads((dst / "config.json").read_text())) == config
    folder_tok = Tokenizer.from_folder(dst)
    assert folder_tok.fingerprint == tokenizer.fingerprint
    text = "Hello, W12! 12345"
    assert folder_tok.encode(text) == tokenizer.encode(text)
    assert folder_tok.chat_template == tokenizer.chat_template
