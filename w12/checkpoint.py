"""The W12 checkpoint on disk: safetensors files of planes plus hashes, and the loader that checks them.

A converted folder holds ``model.w12.safetensors``, or shards ``model-00001-of-00003.w12.safetensors`` ...
named by ``model.w12.safetensors.index.json`` (``{"weight_map": {tensor name: file}}``, as in HF).
Every 2-D floating tensor ``name`` [N, K] is stored as five tensors (see ``format.py`` for each):

    name.w12_hi [N, K] uint8   name.w12_lo [N, ceil(K/2)] uint8   name.w12_base [N] uint8
    name.w12_esc_idx [E] int64   name.w12_esc_val [E] bfloat16

and every other tensor under its own name, BF16 if floating (norm weights, biases), as-is otherwise.
Each file's safetensors metadata (str -> str) describes the tensors it holds:

    "format": "pt"
    "w12.format_version": "1"
    "w12.tensors": JSON {name: {"kind": "w12" | "raw", "shape": [...], "dtype": "bfloat16",
                               "source_dtype": "float32", "sha256": "<hex>"}}
    "w12.source": JSON, informational (what was converted, how it was cast)
    "w12.manifest": JSON {"conversion": "<random id>", "tensors": [every tensor name, in all files],
                          "side_files": {"config.json": "<sha256 hex>", tokenizer files ...}}

``sha256`` is over the original tensor's bytes after the cast to BF16: the row-major little-endian bytes a
safetensors file would hold for it. A W12 tensor is decoded before hashing, so a flipped bit anywhere in
its planes or escapes changes the hash; a truncated or padded file is refused by safetensors itself.
``digest`` binds the same bytes to the tensor's name, dtype and shape (sha256 of ``name \0 dtype \0 shape
\0 bytes``), so two tensors whose names were swapped, or a dtype relabelled in both headers, are refused
although their bytes are intact. The manifest (the same in every file) names every tensor and hashes the
side files, so a removed tensor, shard or index entry, and an edited or missing config.json or tokenizer
file, are refused by ``w12 verify`` and by the loader alike. Folders written before ``digest`` and the
manifest existed (no such keys) are still read, with only the checks they allow.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from w12.codec import W12FormatError, decode, encode, validate
from w12.format import W12Tensor

FORMAT_VERSION = "1"
SINGLE_FILE = "model.w12.safetensors"
INDEX_FILE = "model.w12.safetensors.index.json"
PLANES = ("hi", "lo", "base", "esc_idx", "esc_val")
_META_VERSION, _META_TENSORS, _META_SOURCE = "w12.format_version", "w12.tensors", "w12.source"
_META_MANIFEST = "w12.manifest"


def plane_key(name: str, plane: str) -> str:
    return f"{name}.w12_{plane}"


def is_w12_weight(t: torch.Tensor) -> bool:
    """The rule for what gets encoded: every 2-D floating tensor (linear weights and embedding tables)."""
    return t.dim() == 2 and t.is_floating_point()


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 hex of ``t``'s row-major bytes as safetensors stores them (little-endian)."""
    if sys.byteorder != "little":
        raise RuntimeError("W12 hashes are defined over little-endian bytes")
    flat = t.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()


def tensor_digest(name: str, t: torch.Tensor) -> str:
    """sha256 hex binding ``t``'s bytes to its name, dtype and shape (see the module docstring)."""
    h = hashlib.sha256(f"{name}\0{_dtype_name(t.dtype)}\0{list(t.shape)}\0".encode())
    h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().data)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def side_file_manifest(folder: Path, names: list[str], tensors: list[str]) -> dict:
    """The manifest a converted folder's files carry: every tensor name and the side files' hashes."""
    return {
        "conversion": uuid.uuid4().hex,  # shards of two conversions of the same model do not mix
        "tensors": sorted(tensors),
        "side_files": {n: file_sha256(folder / n) for n in sorted(names)},
    }


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack_tensor(name: str, t: torch.Tensor, source_dtype: torch.dtype | None = None):
    """One tensor (already BF16 if floating) -> (metadata entry, {file key: tensor}, W12Tensor or None)."""
    if name.rsplit(".", 1)[-1].startswith("w12_"):
        raise W12FormatError(f"{name}: source tensor names must not end in a .w12_* suffix")
    entry = {
        "shape": list(t.shape),
        "dtype": _dtype_name(t.dtype),
        "source_dtype": _dtype_name(source_dtype or t.dtype),
        "sha256": tensor_sha256(t),
        "digest": tensor_digest(name, t),
    }
    if not is_w12_weight(t):
        return {"kind": "raw", **entry}, {name: t.detach().contiguous().cpu()}, None
    w12 = encode(t)
    planes = {plane_key(name, p): getattr(w12, p).contiguous().cpu() for p in PLANES}
    return {"kind": "w12", **entry}, planes, w12


def write_file(
    path: Path, entries: dict[str, dict], tensors: dict[str, torch.Tensor], source: dict, manifest: dict | None = None
) -> None:
    """Write one W12 safetensors file holding ``tensors`` described by ``entries``."""
    metadata = {
        "format": "pt",
        _META_VERSION: FORMAT_VERSION,
        _META_TENSORS: json.dumps(entries, separators=(",", ":")),
        _META_SOURCE: json.dumps(source, separators=(",", ":")),
    }
    if manifest is not None:
        metadata[_META_MANIFEST] = json.dumps(manifest, separators=(",", ":"))
    save_file(tensors, str(path), metadata=metadata)


def w12_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The W12 files of folder ``path`` and the index's weight map (None without an index)."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise W12FormatError(f"{index}: not a valid W12 index: {e}") from e
        files = [path / f for f in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise W12FormatError(f"{path}: {INDEX_FILE} names missing shard(s): {', '.join(absent)}")
        return files, weight_map
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE], None
    raise W12FormatError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}: not a converted W12 folder")


def _open(file: Path):
    try:
        handle = safe_open(str(file), framework="pt")
        meta = handle.metadata() or {}
    except Exception as e:  # safetensors checks the header's byte ranges against the file size
        raise W12FormatError(f"{file}: corrupt or truncated safetensors file: {e}") from e
    if meta.get(_META_VERSION) != FORMAT_VERSION:
        raise W12FormatError(
            f"{file}: W12 format version {meta.get(_META_VERSION)!r}, this reader knows {FORMAT_VERSION!r}"
        )
    try:
        entries = json.loads(meta[_META_TENSORS])
        source = json.loads(meta.get(_META_SOURCE, "{}"))
    except (KeyError, ValueError) as e:
        raise W12FormatError(f"{file}: unreadable {_META_TENSORS} metadata: {e}") from e
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise W12FormatError(f"{file}: {_META_TENSORS} metadata is not an object of tensor entries")
    expected = set()
    for name, entry in entries.items():
        expected |= {plane_key(name, p) for p in PLANES} if entry.get("kind") == "w12" else {name}
    keys = set(handle.keys())
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        raise W12FormatError(f"{file}: tensors do not match its metadata: missing {missing[:5]}, extra {extra[:5]}")
    return handle, entries, source


def check_hash(name: str, decoded: torch.Tensor, entry: dict) -> None:
    got = tensor_sha256(decoded)
    if got != entry.get("sha256"):
        raise W12FormatError(
            f"tensor {name}: sha256 of the decoded tensor {got[:16]}... does not match the stored "
            f"{str(entry.get('sha256'))[:16]}...: the file is corrupt"
        )
    if "digest" in entry and tensor_digest(name, decoded) != entry["digest"]:
        raise W12FormatError(
            f"tensor {name}: its bytes are intact but its name, dtype ({_dtype_name(decoded.dtype)}) or shape "
            f"{list(decoded.shape)} is not the one they were converted under (renamed, swapped or relabelled)"
        )


def _read_tensor(handle, name: str, entry: dict, verify_hashes: bool) -> W12Tensor | torch.Tensor:
    try:
        shape = tuple(int(s) for s in entry["shape"])
    except (KeyError, TypeError, ValueError):
        raise W12FormatError(f"tensor {name}: metadata entry has no valid shape: {entry}") from None
    if entry.get("kind") == "w12":
        if len(shape) != 2 or entry.get("dtype") != "bfloat16":
            raise W12FormatError(
                f"tensor {name}: W12 entry of {entry.get('dtype')}{list(shape)}, expected a bfloat16 [N, K]"
            )
        value = W12Tensor(**{p: handle.get_tensor(plane_key(name, p)) for p in PLANES}, shape=shape)
        validate(value, f"tensor {name}")
        if verify_hashes:
            check_hash(name, decode(value, check=False), entry)
        return value
    if entry.get("kind") != "raw":
        raise W12FormatError(f"tensor {name}: unknown kind {entry.get('kind')!r}")
    t = handle.get_tensor(name)
    if tuple(t.shape) != shape or _dtype_name(t.dtype) != entry.get("dtype"):
        raise W12FormatError(
            f"tensor {name}: stored {_dtype_name(t.dtype)}{list(t.shape)}, "
            f"metadata says {entry.get('dtype')}{list(shape)}"
        )
    if verify_hashes:
        check_hash(name, t, entry)
    return t


def iter_w12_folder(
    path: str | Path, *, verify_hashes: bool = True, problems: list[str] | None = None, check_config: bool = True
) -> Iterator[tuple[str, W12Tensor | torch.Tensor, dict]]:
    """Yield ``(name, W12Tensor or tensor, metadata entry)`` for every tensor of a converted folder.

    After the last tensor, the folder is checked against its manifest (tensor set, side files) and, with
    ``check_config``, against the tensor set its config.json implies (off when comparing a conversion with
    a source that is not a whole model).

    Raises :class:`W12FormatError` (naming file and tensor) at the first problem, unless ``problems`` is
    a list: then each problem is appended there, the bad tensor (or file) is skipped and reading goes on.
    """
    path = Path(path)

    def fail(msg: str) -> None:
        if problems is None:
            raise W12FormatError(msg)
        problems.append(msg)

    try:
        files, weight_map = w12_files(path)
    except W12FormatError as e:
        fail(str(e))
        return
    seen: set[str] = set()
    for file in files:
        try:
            handle, entries, _ = _open(file)
        except W12FormatError as e:
            fail(str(e))
            continue
        for name, entry in entries.items():
            if name in seen:
                fail(f"{file.name}: tensor {name} is stored twice")
                continue
            seen.add(name)
            if weight_map is not None and weight_map.get(name) != file.name:
                fail(f"{file.name}: tensor {name} is not mapped to this file by {INDEX_FILE}")
                continue
            try:
                value = _read_tensor(handle, name, entry, verify_hashes)
            except W12FormatError as e:
                fail(f"{file.name}: {e}")
                continue
            yield name, value, entry
    if weight_map is not None and set(weight_map) - seen:
        fail(f"{path}: {INDEX_FILE} lists tensors no file holds: {sorted(set(weight_map) - seen)[:5]}")
    for problem in manifest_problems(path, files, seen, weight_map, check_config):
        fail(problem)


def _manifest(file: Path) -> str | None:
    try:
        with safe_open(str(file), framework="pt") as h:
            return (h.metadata() or {}).get(_META_MANIFEST)
    except Exception:  # an unreadable file was reported when it was opened
        return None


def has_manifest(path: str | Path) -> bool:
    """Whether a converted folder's files carry the manifest (folders converted before it do not)."""
    try:
        files, _ = w12_files(Path(path))
    except W12FormatError:
        return False
    return all(_manifest(f) is not None for f in files)


def manifest_problems(
    path: Path, files: list[Path], seen: set[str], weight_map: dict | None, check_config: bool = True
) -> list[str]:
    """What the folder lacks or changed against the manifest its files carry, and (``check_config``)
    against the tensor set of its config.json."""
    raw = {f.name: _manifest(f) for f in files}
    present = {k: v for k, v in raw.items() if v is not None}
    if not present:  # written before manifests existed: the config's tensor set only
        return config_problems(path, seen) if check_config else []
    if len(set(present.values())) > 1 or len(present) != len(raw):
        groups: dict[str | None, list[str]] = {}
        for name, m in raw.items():
            groups.setdefault(m, []).append(name)
        odd = sorted(min(groups.values(), key=len))
        return [f"{path}: {', '.join(odd)} carr{'ies' if len(odd) == 1 else 'y'} a different manifest (or none) than "
                f"the other files: shards of different conversions are mixed"]  # fmt: skip
    try:
        manifest = json.loads(next(iter(present.values())))
        tensors, side = set(manifest["tensors"]), dict(manifest["side_files"])
    except (ValueError, KeyError, TypeError) as e:
        return [f"{path}: unreadable {_META_MANIFEST} metadata: {e}"]
    problems = []
    missing = sorted(tensors - seen)
    if missing:
        where = f"({INDEX_FILE} and its shards)" if weight_map is not None else f"({files[0].name})"
        problems.append(f"{path}: {len(missing)} tensor(s) the checkpoint was converted with are missing {where}: "
                        f"{missing[:5]}")  # fmt: skip
    extra = sorted(seen - tensors)
    if extra:
        problems.append(f"{path}: tensor(s) not in the manifest: {extra[:5]}")
    for name, digest in sorted(side.items()):
        f = path / name
        if not f.is_file():
            problems.append(f"{path}: side file {name} is missing (the conversion wrote it; the model needs it)")
        elif file_sha256(f) != digest:
            problems.append(f"{path}: side file {name} was edited or is corrupt (its sha256 differs from the one "
                            "recorded at conversion)")  # fmt: skip
    if check_config:
        problems += config_problems(path, tensors)
    return problems


def _expected_set_problems(f: Path, cfg: dict, tensors: set[str]) -> list[str]:
    """The exact tensor set the decoder needs for this config (``expected_shapes``), where it can be built."""
    try:
        from sglang_specpilot.models.config import ModelConfig
        from sglang_specpilot.models.errors import expected_shapes
    except ImportError:  # w12 used without the engine package
        return []
    try:
        want = set(expected_shapes(ModelConfig.from_hf(cfg)))
    except Exception:  # a config the decoder does not know: the layer check below still applies
        return []
    missing = sorted(want - tensors)
    return [f"{f}: the config needs {len(missing)} tensor(s) the checkpoint lacks: {missing[:5]}"] if missing else []


def config_problems(path: Path, tensors: set[str]) -> list[str]:
    """The tensor set config.json implies (layers 0 .. num_hidden_layers - 1, an lm_head unless tied)."""
    f = path / "config.json"
    if not f.is_file():
        return []
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
        n = int(cfg.get("num_hidden_layers", cfg.get("n_layer", -1)))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return [f"{f}: not a readable config: {e}"]
    problems = _expected_set_problems(f, cfg, tensors)
    if problems:
        return problems
    layers = {int(m.group(1)) for t in tensors if (m := re.match(r"model\.layers\.(\d+)\.", t))}
    if n >= 0 and layers != set(range(n)):
        problems.append(f"{f}: num_hidden_layers is {n} but the tensors hold layers "
                        f"{min(layers, default=0)}..{max(layers, default=-1)} ({len(layers)} layers)")  # fmt: skip
    if not cfg.get("tie_word_embeddings", False) and tensors and "lm_head.weight" not in tensors:
        problems.append(f"{f}: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
    return problems


def load_w12_folder(path: str | Path, verify_hashes: bool = True) -> tuple[dict[str, W12Tensor | torch.Tensor], dict]:
    """Load a converted folder: every 2-D weight as a :class:`W12Tensor`, every other tensor as stored.

    With ``verify_hashes`` each tensor is decoded and its sha256 compared with the stored one (about 0.1 s
    per 58 M weights on 2 CPU threads plus hashing at ~1 GB/s); without, only the structure is checked.
    Raises :class:`W12FormatError` naming the file and tensor on any mismatch.

    Returns
    -------
    tensors : dict[str, W12Tensor | torch.Tensor]
    metadata : dict
        ``{"format_version": "1", "files": [names], "tensors": {name: entry}, "source": {...}}``.
    """
    path = Path(path)
    tensors: dict[str, W12Tensor | torch.Tensor] = {}
    entries: dict[str, dict] = {}
    for name, value, entry in iter_w12_folder(path, verify_hashes=verify_hashes):
        tensors[name], entries[name] = value, entry
    files, _ = w12_files(path)
    source = _open(files[0])[2] if files else {}
    meta = {
        "format_version": FORMAT_VERSION,
        "files": [f.name for f in files],
        "tensors": entries,
        "source": source,
    }
    return tensors, meta


def folder_entries(path: str | Path) -> dict[str, dict]:
    """The metadata entries of every tensor of a converted folder, from the file headers alone."""
    entries: dict[str, dict] = {}
    for file in w12_files(Path(path))[0]:
        entries.update(_open(file)[1])
    return entries


def verify_w12_folder(path: str | Path) -> list[str]:
    """Decode every tensor of a converted folder and check its hash; returns the problems (empty = good)."""
    problems: list[str] = []
    for _ in iter_w12_folder(path, verify_hashes=True, problems=problems):
        pass
    return problems
