"""Convert a checkpoint (HF safetensors folder or GGUF file) into a W12 folder, and check one against it.

The conversion's input is the BF16 tensor. A BF16 source is taken bit for bit. A float32 source (an fp32
safetensors folder, or a GGUF file, which ``load_model_files`` dequantizes to float32) is rounded to BF16
(round to nearest even) first, unless ``exact=True`` refuses any tensor that rounding would change. The
hashes cover the rounded BF16 tensors and ``--verify`` compares against them: W12 is lossless with respect
to that BF16 checkpoint, not to the float32 values.

Safetensors sources are streamed one tensor at a time (memory stays near one shard); a GGUF file is
dequantized whole by ``load_model_files``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from w12.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    iter_w12_folder,
    pack_tensor,
    side_file_manifest,
    write_file,
)
from w12.codec import W12FormatError, decode, to_bf16_exact
from w12.format import W12Tensor
from w12.progress import Progress

DEFAULT_SHARD_BYTES = 4 << 30
# Top-level files worth carrying over from a HF folder: config, generation config, tokenizer files.
_SIDE_SUFFIXES = (".json", ".txt", ".jinja", ".model", ".tiktoken")


@dataclass
class Source:
    """A checkpoint to convert: tensor names in order, their sizes, and a way to read each one."""

    path: Path
    kind: str  # "safetensors" or "gguf"
    numel: dict[str, int]
    read: Callable[[str], torch.Tensor]
    write_side_files: Callable[[Path], list[str]]


@dataclass
class ConvertReport:
    """What :func:`convert` wrote; ``bits_per_weight`` is over the W12-encoded tensors only."""

    dst: Path
    files: list[str] = field(default_factory=list)
    side_files: list[str] = field(default_factory=list)
    w12_tensors: int = 0
    raw_tensors: int = 0
    w12_weights: int = 0
    w12_bits: int = 0
    escapes: int = 0
    rounded_tensors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    verified: bool = False

    @property
    def bits_per_weight(self) -> float:
        return self.w12_bits / self.w12_weights if self.w12_weights else 0.0

    @property
    def escape_rate(self) -> float:
        return self.escapes / self.w12_weights if self.w12_weights else 0.0

    def summary(self) -> str:
        lines = [
            f"wrote {', '.join(self.files)} to {self.dst} in {self.seconds:.1f} s",
            f"  {self.w12_tensors} W12 tensors ({self.w12_weights:,} weights):"
            f" {self.bits_per_weight:.4f} bits/weight, escape rate {self.escape_rate:.3e};"
            f" {self.raw_tensors} other tensors kept as stored",
            f"  side files: {', '.join(self.side_files) or 'none'}",
        ]
        if self.rounded_tensors:
            lines.append(f"  {len(self.rounded_tensors)} tensors rounded to bfloat16 (hashes cover the rounded values)")
        if self.verified:
            lines.append("  verified: every tensor decodes bit for bit to the BF16 source and matches its hash")
        return "\n".join(lines)


def to_bf16(t: torch.Tensor, name: str, exact: bool) -> tuple[torch.Tensor, bool]:
    """The conversion input for tensor ``t``: (BF16 tensor or ``t`` itself if not floating, was rounded)."""
    if not t.is_floating_point() or t.dtype == torch.bfloat16:
        return t, False
    if exact:
        return to_bf16_exact(t, name), False
    b = t.to(torch.bfloat16)
    return b, not torch.equal(b.to(t.dtype), t)


def _gguf_source(path: Path) -> Source:
    from sglang_specpilot.models.loader import load_model_files
    from sglang_specpilot.models.safetensors_loader import config_to_hf

    config, state_dict, tokenizer = load_model_files(path)

    def side(dst: Path) -> list[str]:
        cfg = config_to_hf(config, torch.bfloat16)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        return ["config.json", *tokenizer.save(dst)]

    numel = {name: t.numel() for name, t in state_dict.items()}
    return Source(path, "gguf", numel, state_dict.__getitem__, side)


def _safetensors_source(path: Path) -> Source:
    if (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file():
        raise W12FormatError(f"{path}: already a W12 folder")
    from sglang_specpilot.models.errors import CheckpointError
    from sglang_specpilot.models.safetensors_loader import weight_files

    index = path / "model.safetensors.index.json"
    try:
        files = weight_files(path)  # the shards the index names, else every *.safetensors
    except CheckpointError as e:
        raise W12FormatError(str(e)) from e
    handles, owner, numel = {}, {}, {}
    for file in files:
        try:
            handles[file] = h = safe_open(str(file), framework="pt")
            for name in h.keys():
                if name in owner:
                    raise W12FormatError(f"{path}: tensor {name} is in both {owner[name].name} and {file.name}")
                owner[name] = file
                shape = h.get_slice(name).get_shape()
                numel[name] = math.prod(shape)
        except W12FormatError:
            raise
        except Exception as e:
            raise W12FormatError(f"{file}: corrupt or truncated safetensors file: {e}") from e

    def side(dst: Path) -> list[str]:
        copied = []
        for f in sorted(path.iterdir()):
            if f.is_file() and f.suffix in _SIDE_SUFFIXES and f.name != index.name:
                shutil.copy2(f, dst / f.name)
                copied.append(f.name)
        return copied

    return Source(path, "safetensors", numel, lambda name: handles[owner[name]].get_tensor(name), side)


def open_source(src: str | Path) -> Source:
    """A GGUF file or a HF safetensors folder as a :class:`Source`."""
    src = Path(src)
    if src.is_file():
        return _gguf_source(src)
    if src.is_dir():
        return _safetensors_source(src)
    raise W12FormatError(f"{src}: no such file or folder (expected a .gguf file or a safetensors folder)")


def _old_files(dst: Path) -> list[Path]:
    return [*dst.glob("*.w12.safetensors"), *dst.glob(INDEX_FILE)]


def _prepare_dst(dst: Path, src: Path, force: bool) -> None:
    if dst.resolve() == src.resolve():
        raise W12FormatError(f"{dst}: the destination must differ from the source")
    dst.mkdir(parents=True, exist_ok=True)
    old = _old_files(dst)
    if old and not force:
        raise W12FormatError(f"{dst}: already holds a W12 checkpoint ({old[0].name}); pass force=True / --force")


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    verify: bool = False,
    exact: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    force: bool = False,
    progress: bool = True,
) -> ConvertReport:
    """Convert ``src`` (GGUF file or HF safetensors folder) into the W12 folder ``dst``.

    Parameters
    ----------
    verify : bool
        Afterwards decode every tensor from ``dst`` and compare it bit for bit with the BF16 source and
        with its stored hash; raise :class:`W12FormatError` naming the first tensor that differs.
    exact : bool
        Refuse (``W12FormatError``) a floating tensor that is not exactly representable in BF16.
    max_shard_bytes : int
        A new shard starts when the current one would exceed this (one tensor is never split).
    progress : bool
        Show a progress bar on stderr.
    """
    start = time.perf_counter()
    source, dst = open_source(src), Path(dst)
    _prepare_dst(dst, source.path, force)
    info = {
        "source": source.path.name,
        "kind": source.kind,
        "cast": "exact" if exact else "round-to-nearest-even",
    }
    report = ConvertReport(dst=dst)
    # Side files first: their hashes go into every shard's manifest, with the name of every tensor.
    report.side_files = source.write_side_files(dst)
    manifest = side_file_manifest(dst, report.side_files, list(source.numel))
    bar = Progress(sum(source.numel.values()), "w12 convert", enabled=progress)
    shard = _ShardWriter(dst, info, manifest)
    try:
        report.files = _convert_tensors(source, shard, report, bar, exact, max_shard_bytes)
    finally:
        shard.discard()  # whatever did not reach finish(): an old checkpoint in dst is kept in that case
    bar.close(f"{report.w12_tensors + report.raw_tensors} tensors")
    if verify:
        verify_against_source(dst, source, exact, progress=progress)
        report.verified = True
    report.seconds = time.perf_counter() - start
    return report


def _convert_tensors(
    source: Source,
    shard: _ShardWriter,
    report: ConvertReport,
    bar: Progress,
    exact: bool,
    max_shard_bytes: int,
) -> list[str]:
    for name in source.numel:
        t = source.read(name)
        b, rounded = to_bf16(t, name, exact)
        entry, tensors, w12 = pack_tensor(name, b, source_dtype=t.dtype)
        nbytes = sum(x.numel() * x.element_size() for x in tensors.values())
        if shard.nbytes and shard.nbytes + nbytes > max_shard_bytes:
            shard.flush()
        shard.add(name, entry, tensors, nbytes)
        if rounded:
            report.rounded_tensors.append(name)
        if w12 is None:
            report.raw_tensors += 1
        else:
            report.w12_tensors += 1
            report.w12_weights += t.numel()
            report.w12_bits += 8 * w12.nbytes()
            report.escapes += w12.esc_idx.numel()
        bar.update(t.numel(), name)
    return shard.finish()


class _ShardWriter:
    """Writes shards as they fill, under temporary names; ``finish`` renames them all at the end, so an
    interrupted conversion leaves no folder that looks complete."""

    def __init__(self, dst: Path, info: dict, manifest: dict | None = None):
        self.dst, self.info, self.manifest = dst, info, manifest
        self.entries: dict[str, dict] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.nbytes = 0
        self.written: list[dict[str, dict]] = []

    def add(self, name: str, entry: dict, tensors: dict[str, torch.Tensor], nbytes: int) -> None:
        self.entries[name] = entry
        self.tensors.update(tensors)
        self.nbytes += nbytes

    def _partial(self, i: int) -> Path:
        return self.dst / f"shard-{i + 1:05d}.w12.safetensors.partial"

    def discard(self) -> None:
        for f in self.dst.glob("shard-*.w12.safetensors.partial"):
            f.unlink()

    def flush(self) -> None:
        write_file(self._partial(len(self.written)), self.entries, self.tensors, self.info, self.manifest)
        self.written.append(self.entries)
        self.entries, self.tensors, self.nbytes = {}, {}, 0

    def finish(self) -> list[str]:
        if self.entries or not self.written:
            self.flush()
        for f in _old_files(self.dst):  # replaced only now that the new checkpoint is complete
            f.unlink()
        n = len(self.written)
        names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.w12.safetensors" for i in range(n)]
        for i, name in enumerate(names):
            self._partial(i).rename(self.dst / name)
        if n > 1:
            weight_map = {t: name for entries, name in zip(self.written, names, strict=True) for t in entries}
            index = {"metadata": {"format": "w12"}, "weight_map": weight_map}
            (self.dst / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        return names


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def verify_against_source(dst: str | Path, source: Source | str | Path, exact: bool = False, progress=True) -> None:
    """Decode every tensor of ``dst`` and compare it bit for bit with ``source`` cast to BF16 as
    :func:`convert` casts it, and with its stored hash. Raises :class:`W12FormatError` naming the tensor."""
    if not isinstance(source, Source):
        source = open_source(source)
    bar = Progress(sum(source.numel.values()), "w12 verify", enabled=progress)
    seen = set()
    for name, value, _entry in iter_w12_folder(dst, verify_hashes=True, check_config=False):  # vs the source
        if name not in source.numel:
            raise W12FormatError(f"{dst}: tensor {name} is not in the source {source.path}")
        seen.add(name)
        want, _ = to_bf16(source.read(name), name, exact)
        got = decode(value, check=False) if isinstance(value, W12Tensor) else value
        if not _same_bits(got, want):
            raise W12FormatError(f"{dst}: tensor {name} does not decode bit for bit to the source tensor")
        bar.update(want.numel(), name)
    missing = sorted(set(source.numel) - seen)
    if missing:
        raise W12FormatError(f"{dst}: {len(missing)} source tensor(s) missing, e.g. {missing[:5]}")
    bar.close("bit-exact")
