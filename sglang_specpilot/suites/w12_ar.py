"""W12 AR suite (one GPU): autoregressive decoding with W12 weights against the same model in BF16.

Two parts, each in one process with both engines built side by side:

* ``llama8b``: the Llama-3.1-8B preset (synthetic N(0, 0.02) weights at the published shapes, labelled so),
  batch 1, the engine's decode step (CUDA graph, compiled blocks) timed paired and interleaved
  (``harness.timing.paired_timing``, ABBA blocks, CUDA events), BF16 vs W12; then ``generate`` tokens/s
  interleaved (bf16, w12, w12, bf16). ``ar_speedup_bs1_llama8b`` is the paired step-time ratio (at batch 1
  one step is one token). Greedy outputs of the two engines are compared token for token and every
  mismatch is scored by token forcing against the BF16 engine.
* ``smollm2``: the real SmolLM2-135M-Instruct (embedded default or ``--smollm2``), HumanEval/100-107,
  64 greedy tokens at batch 8: W12 output vs BF16 output, token forcing of both against BF16 AR; tokens/s
  of both at batch 1.

W12 weights come from ``models.w12_weights.to_w12`` (every projection and the LM head; the embedding
lookup stays BF16). Bytes read per step are reported for both (the W12 floor is ~0.75 of BF16's).
"""

from __future__ import annotations

import argparse

import torch

from ..harness.bench import register_suite
from .common import decode_state, humaneval_prompts, median

# The tests set "cpu" (and a tiny preset) for a dry run of the bookkeeping; the suite itself needs CUDA.
DEVICE = "cuda"


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smollm2", default=None, help="SmolLM2 GGUF path (default: the embedded one)")
    p.add_argument("--parts", default="llama8b,smollm2", help="comma list of parts to run")
    p.add_argument("--context", type=int, default=128, help="tokens in the cache for step timing")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="steps per timed sample")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--preset", default="llama-3.1-8b", help="the synthetic model of the step-time part")


def step_bytes(model) -> int:
    """Weight bytes one decode step reads: parameters and W12 buffers, not the embedding table."""
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.startswith("embed.") or name.endswith(("esc_row_ptr", "counters")) or "rope" in name:
            continue
        total += t.numel() * t.element_size()
    return total


def _engine_pair(base: dict) -> dict:
    """A BF16 and a W12 engine of the same weights (the same seed draws the same synthetic ones), warmed up."""
    from ..config import EngineOptions
    from ..engine import Engine
    from ..engine.loading import load_engine_models

    bf16, _, tok, opts = load_engine_models(EngineOptions(**base))
    w12, _, _, _ = load_engine_models(EngineOptions(**base, weights="w12"))
    engines = {"bf16": Engine(bf16, tok, opts), "w12": Engine(w12, tok, opts)}
    for e in engines.values():
        e.warmup()
    return engines


def _greedy_vs_bf16(engines: dict, prompts: list[str], params) -> tuple[dict, int]:
    """Greedy tokens of both engines (in batches of their max batch size) and token forcing of both against the
    BF16 engine: (forcing report, number of prompts whose tokens differ)."""
    from ..harness.token_forcing import compare_forcing, token_forcing

    def run(e) -> list[list[int]]:
        n = e.options.max_batch_size
        return [r.token_ids for i in range(0, len(prompts), n) for r in e.generate(prompts[i : i + n], params)]

    ref, got = run(engines["bf16"]), run(engines["w12"])
    ids = [engines["bf16"].encode(q) for q in prompts]
    score = engines["bf16"].teacher_force_logits
    stock = token_forcing(score, list(zip(ids, ref, strict=True)))
    system = token_forcing(score, list(zip(ids, got, strict=True)))
    forcing = {"stock": stock.to_dict(), "w12": system.to_dict(), "verdict": compare_forcing(system, stock).to_dict()}
    return forcing, sum(a != b for a, b in zip(ref, got, strict=True))


def _interleaved_rates(engines: dict, prompts: list[str], params, repeats: int) -> dict[str, list[float]]:
    """generate() tokens/s at batch 1, per prompt in the order bf16, w12, w12, bf16."""
    rates: dict[str, list[float]] = {"bf16": [], "w12": []}
    for _ in range(repeats):
        for q in prompts:
            for name in ("bf16", "w12", "w12", "bf16"):
                rates[name].append(engines[name].generate([q], params)[0].tokens_per_s)
    return rates


def _llama8b(args, out) -> None:
    from ..engine import SamplingParams
    from ..engine.attn_meta import causal_tree
    from ..harness.timing import paired_timing

    base = dict(
        model=args.preset,
        synthetic=True,
        device=DEVICE,
        dtype="bfloat16",
        max_batch_size=1,
        graph_batch_sizes=(1,),
        max_seq_len=1024,
        compile=not args.no_compile,
    )
    engines = _engine_pair(base)
    anc, depth = causal_tree(1, DEVICE)
    steps = {}
    for name, e in engines.items():
        _, seq_len, next_tok = decode_state(e, 1, args.context)
        steps[name] = lambda e=e, s=seq_len, t=next_tok: e.target_runner.step(t[:, None], s, anc, depth)
    times = paired_timing(steps, blocks=args.blocks, inner=args.inner, device=DEVICE)
    ci = times.ratio("bf16", "w12")
    bytes_ = {name: step_bytes(e.target) for name, e in engines.items()}
    out["rows"].append(
        {
            "case": "llama8b.ar_step.bs1",
            "weights": "synthetic",
            "context": args.context,
            "timing": times.to_dict(),
            "step_ms": {n: times.median(n) * 1e3 for n in steps},
            "speedup_ci": ci.to_dict(),
            "weight_bytes": bytes_,
        }
    )
    m = out["metrics"]
    m["ar_speedup_bs1_llama8b"] = round(ci.ratio, 4)
    m["llama8b_bf16_step_ms"] = round(times.median("bf16") * 1e3, 3)
    m["llama8b_w12_step_ms"] = round(times.median("w12") * 1e3, 3)
    m["llama8b_w12_bytes_over_bf16"] = round(bytes_["w12"] / bytes_["bf16"], 4)

    # End-to-end generate() tokens/s, interleaved bf16, w12, w12, bf16.
    p = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    rates = _interleaved_rates(engines, ["The history of the printing press"], p, args.repeats)
    out["rows"].append({"case": "llama8b.ar_generate.bs1", "weights": "synthetic", "tokens_per_s": rates})
    m["llama8b_bf16_tok_s_bs1"] = round(median(rates["bf16"]), 1)
    m["llama8b_w12_tok_s_bs1"] = round(median(rates["w12"]), 1)
    m["ar_generate_speedup_bs1_llama8b"] = round(median(rates["w12"]) / median(rates["bf16"]), 4)

    # Lossless: greedy tokens of the W12 engine against the BF16 engine's (synthetic weights, so the text
    # means nothing, but the argmax chain is a real check of the GEMM).
    prompts = ["The history of the printing press", "def quicksort(xs):", "Once upon a time", "1, 2, 3,"]
    p64 = SamplingParams(max_new_tokens=64, ignore_eos=True)
    forcing, mismatched = _greedy_vs_bf16(engines, prompts, p64)
    out["rows"].append({"case": "llama8b.w12_vs_bf16_greedy", "weights": "synthetic", **forcing})
    m["llama8b_w12_vs_bf16_mismatched_prompts"] = mismatched
    m["llama8b_w12_forcing_accepted"] = int(forcing["verdict"]["accepted"])


def _smollm2(args, out) -> None:
    from ..engine import SamplingParams

    base = dict(
        model=args.smollm2, max_batch_size=8, graph_batch_sizes=(1, 8), max_seq_len=1024, compile=not args.no_compile
    )
    engines = _engine_pair(base)
    prompts = humaneval_prompts(range(100, 108))
    p64 = SamplingParams(max_new_tokens=64, ignore_eos=True)
    forcing, mismatched = _greedy_vs_bf16(engines, prompts, p64)
    m = out["metrics"]
    m["smollm2_w12_vs_bf16_mismatched_prompts"] = mismatched
    m["smollm2_w12_forcing_mismatch_rate"] = round(forcing["w12"]["rate"], 5)
    m["smollm2_bf16_forcing_mismatch_rate"] = round(forcing["stock"]["rate"], 5)
    m["smollm2_w12_forcing_accepted"] = int(forcing["verdict"]["accepted"])
    p = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    rates = _interleaved_rates(engines, prompts[:2], p, 1)
    out["rows"].append(
        {
            "case": "smollm2.w12_vs_bf16",
            "prompts": "HumanEval/100-107",
            "new_tokens": 64,
            **forcing,
            "tokens_per_s_bs1": rates,
        }
    )
    m["smollm2_bf16_tok_s_bs1"] = round(median(rates["bf16"]), 1)
    m["smollm2_w12_tok_s_bs1"] = round(median(rates["w12"]), 1)


@register_suite("w12_ar", add_args=_args)
def w12_ar(args: argparse.Namespace) -> dict:
    """AR decoding with W12 vs BF16 weights: Llama-3.1-8B preset (synthetic) step time, SmolLM2 equality."""
    if not torch.cuda.is_available():
        raise SystemExit("the w12_ar suite needs a CUDA GPU")
    parts = set(args.parts.split(","))
    out: dict = {"metrics": {}, "rows": []}
    if "llama8b" in parts:
        _llama8b(args, out)
        torch.cuda.empty_cache()
    if "smollm2" in parts:
        _smollm2(args, out)
    return out
