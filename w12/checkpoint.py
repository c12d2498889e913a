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

``sha256`` is over the original tensor's bytes after the cast to BF16: the row-major little-endian bytes a
safetensors file would hold for it. A W12 tensor is decoded before hashing, so a flipped bit anywhere in
its planes or escapes changes the hash; a truncated or padded file is refused by safetensors itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
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
    }
    if not is_w12_weight(t):
        return {"kind": "raw", **entry}, {name: t.detach().contiguous().cpu()}, None
    w12 = encode(t)
    planes = {plane_key(name, p): getattr(w12, p).contiguous().cpu() for p in PLANES}
    return {"kind": "w12", **entry}, planes, w12


def write_file(path: Path, entries: dict[str, dict], tensors: dict[str, torch.Tensor], source: dict) -> None:
    """Write one W12 safetensors file holding ``tensors`` described by ``entries``."""
    metadata = {
        "format": "pt",
        _META_VERSION: FORMAT_VERSION,
        _META_TENSORS: json.dumps(entries, separators=(",", ":")),
        _META_SOURCE: json.dumps(source, separators=(",", ":")),
    }
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
    expected = set()
    for name, entry in entries.items():
        expected |= {plane_key(name, p) for p in PLANES} if entry.get("kind") == "w12" else {name}
    keys = set(handle.keys())
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        raise W12FormatError(
            f"{file}: tensors do not match its metadata: missing {missing[:5]}, extra {extra[:5]}"
        )
    return handle, entries, source


def check_hash(name: str, decoded: torch.Tensor, entry: dict) -> None:
    got = tensor_sha256(decoded)
    if got != entry.get("sha256"):
        raise W12FormatError(
            f"tensor {name}: sha256 of the decoded tensor {got[:16]}... does not match the stored "
            f"{str(entry.get('sha256'))[:16]}...: the file is corrupt"
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
    path: str | Path, *, verify_hashes: bool = True, problems: list[str] | None = None
) -> Iterator[tuple[str, W12Tensor | torch.Tensor, dict]]:
    """Yield ``(name, W12Tensor or tensor, metadata entry)`` for every tensor of a converted folder.

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


def load_w12_folder(
    path: str | Path, verify_hashes: bool = True
) -> tuple[dict[str, W12Tensor | torch.Tensor], dict]:
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
