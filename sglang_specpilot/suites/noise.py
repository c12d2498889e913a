"""Noise suite: the stock engine timed against itself (two separately captured instances, ABBA blocks).

The figure each later promotion gate needs: how far from 1.0 the paired ratio of two identical systems is
measured (``harness.noise.noise_from_ratio``). SmolLM2 uses its real weights; Llama-3.1-8B synthetic ones.
"""

from __future__ import annotations

import argparse

import torch

from ..harness.bench import register_suite
from .common import decode_state


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smollm2", default=None, help="SmolLM2 GGUF path (default: the embedded one)")
    p.add_argument("--blocks", type=int, default=30)
    p.add_argument("--inner", type=int, default=10, help="steps per sample (short steps need > 1)")
    p.add_argument("--context", type=int, default=128)


def _step_fn(engine, batch: int, context: int):
    from ..engine.attn_meta import causal_tree

    _, seq_len, next_tok = decode_state(engine, batch, context)
    anc, depth = causal_tree(1, "cuda")
    return lambda: engine.target_runner.step(next_tok[:, None], seq_len, anc, depth)


def _noise(name: str, options, args, out) -> None:
    from ..engine import Engine
    from ..engine.loading import load_engine_models
    from ..harness.noise import noise_from_ratio
    from ..harness.timing import paired_timing

    target, _, tok, options = load_engine_models(options)
    a, b = Engine(target, tok, options), Engine(target, tok, options)
    times = paired_timing(
        {"stock_a": _step_fn(a, 1, args.context), "stock_b": _step_fn(b, 1, args.context)},
        blocks=args.blocks,
        inner=args.inner,
        device="cuda",
    )
    ci = times.ratio("stock_a", "stock_b")
    out["metrics"][f"noise_{name}_bs1"] = round(noise_from_ratio(ci), 5)
    row = {"case": f"{name}.ar_step.bs1", "context": args.context, "inner": args.inner, "ratio_ci": ci.to_dict()}
    out["rows"].append({**row, "samples": times.rows()})
    del a, b, target
    torch.cuda.empty_cache()


@register_suite("noise", add_args=_args)
def noise(args: argparse.Namespace) -> dict:
    """Stock-vs-stock noise of the AR decode step at batch 1: SmolLM2 (real) and Llama-3.1-8B (synthetic)."""
    from ..config import EngineOptions

    if not torch.cuda.is_available():
        raise SystemExit("the noise suite needs a CUDA GPU")
    out = {"metrics": {}, "rows": []}
    common = dict(max_batch_size=1, graph_batch_sizes=(1,), max_seq_len=1024, compile=True)
    _noise("smollm2", EngineOptions(model=args.smollm2, **common), args, out)
    _noise("llama8b", EngineOptions(model="llama-3.1-8b", synthetic=True, **common), args, out)
    return out
