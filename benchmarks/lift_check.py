"""On-GPU check of the lifted stand-in (models/lift.py): same text as SmolLM2, the synthetic 8B's step time.

    python benchmarks/lift_check.py [--model SmolLM2.gguf] [--out DIR] [--prompts 8] [--new-tokens 64]
                                    [--batches 1,16] [--widths 1,16] [--blocks 20] [--no-compile] [--no-fp32]

Everything is built on the device in memory (nothing written but the JSON):

1. SmolLM2 (default: the embedded GGUF) and its lift to Llama-3.1-8B shapes (``--shape``), in fp32 (TF32 off): greedy
   text of ``--prompts`` chat prompts x ``--new-tokens`` must be equal token for token (``fp32_equal``).
2. The same in bf16, the engine's dtype. The lift re-rounds the q weights (x sqrt 2) and the norm weights
   (x 3/8) in bf16, so runs may part at near-ties. Every bf16 output (lifted and SmolLM2's own) is scored
   by token forcing against SmolLM2 in fp32; the lift is accepted when its mismatches are no worse than
   SmolLM2-bf16's (``harness.token_forcing.compare_forcing``), and the first divergence of each prompt is
   listed with SmolLM2's top-2 margin there.
3. Step time, lifted vs synthetic ``llama-3.1-8b`` preset (bf16, the engine's ``ModelRunner`` with CUDA
   graphs and, unless ``--no-compile``, compiled blocks), interleaved in palindromic blocks
   (``harness.timing.paired_timing``), for each batch x width (width 1: a decode step; wider: a verify
   step of a random tree). Goal: |lifted / synthetic - 1| <= 3 %.

Prints a short table and writes ``lift_check.json`` into ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Give me a short poem about the sea.",
    "What is 17 times 23? Show your steps.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "How do I reverse a list in Python?",
]


def _greedy(model, tok, prompts, new, dtype):
    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams

    opts = EngineOptions(
        max_seq_len=512, max_batch_size=len(prompts), device=DEVICE[0], dtype=dtype, cuda_graphs=False, compile=False
    )
    res = Engine(model, tok, opts).generate(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True), chat=True)
    return [r.token_ids for r in res]


DEVICE = ["cuda"]  # --device (cpu: a smoke run of this script with --shape tiny)


def _free():
    gc.collect()
    if DEVICE[0] == "cuda":
        torch.cuda.empty_cache()


def _sync():
    if DEVICE[0] == "cuda":
        torch.cuda.synchronize()


def check_text(args, out: dict) -> None:
    from sglang_specpilot.harness.token_forcing import compare_forcing, token_forcing
    from sglang_specpilot.models.lift import lift_model, load_small, sequence_logits

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prompts = (PROMPTS * 4)[: args.prompts]
    small, tok = load_small(args.model, device=args.device, max_positions=2048)
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in prompts]
    ref32 = _greedy(small, tok, prompts, args.new_tokens, "float32")
    if args.fp32:
        t0 = time.perf_counter()
        big = lift_model(small, args.shape, seed=0)
        _sync()
        out["lift_s_fp32"] = round(time.perf_counter() - t0, 2)
        got = _greedy(big, tok, prompts, args.new_tokens, "float32")
        out["fp32_equal"] = got == ref32
        out["fp32_differing_prompts"] = [i for i, (a, b) in enumerate(zip(ref32, got, strict=True)) if a != b]
        del big
        _free()

    def score(prompt, generated, m=small):  # SmolLM2 fp32, teacher forced
        return sequence_logits(m, list(prompt) + list(generated))[len(prompt) - 1 : -1]

    small16 = load_small(args.model, device=args.device, max_positions=2048)[0].to(torch.bfloat16)
    big16 = lift_model(small, args.shape, seed=0, dtype=torch.bfloat16)
    got16 = _greedy(big16, tok, prompts, args.new_tokens, "bfloat16")
    stock16 = _greedy(small16, tok, prompts, args.new_tokens, "bfloat16")
    sys_rep = token_forcing(score, list(zip(chat, got16, strict=True)))
    stock_rep = token_forcing(score, list(zip(chat, stock16, strict=True)))
    verdict = compare_forcing(sys_rep, stock_rep)
    first = []
    for i, (a, b) in enumerate(zip(stock16, got16, strict=True)):
        t = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if t is not None:
            lg = score(chat[i], a)[t].float()
            top = lg.topk(2).values
            first.append(
                {
                    "prompt": i,
                    "position": t,
                    "smollm2_bf16": a[t],
                    "lifted_bf16": b[t],
                    "fp32_top2_margin": round(float(top[0] - top[1]), 4),
                    "fp32_margin_of_lifted_token": round(float(top[0] - lg[b[t]]), 4),
                }
            )
    out["bf16_equal_to_smollm2_bf16"] = got16 == stock16
    out["bf16_first_divergences"] = first
    out["bf16_forcing"] = {
        "lifted": sys_rep.to_dict(),
        "smollm2_bf16": stock_rep.to_dict(),
        "verdict": verdict.to_dict(),
    }
    out["bf16_forcing_accepted"] = bool(verdict.accepted)
    out["lifted_text_sample"] = tok.decode(got16[0])
    del small, small16, big16, score
    _free()


def check_time(args, out: dict) -> None:
    from sglang_specpilot.engine.runner import ModelRunner
    from sglang_specpilot.harness.timing import paired_timing
    from sglang_specpilot.models.build import build_model
    from sglang_specpilot.models.config import ModelConfig
    from sglang_specpilot.models.lift import lift_model, load_small
    from sglang_specpilot.models.presets import PRESETS, preset_config
    from tree_verify import ancestor_mask

    batches = [int(b) for b in args.batches.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    ctx, scratch = args.context, max(64, max(widths))
    n_pos = ctx + 2 * scratch + 64
    dev, cuda = args.device, args.device == "cuda"
    small, _ = load_small(args.model, device=dev, max_positions=n_pos)
    lifted = lift_model(small, args.shape, seed=0, dtype=torch.bfloat16, max_positions=n_pos)
    # The synthetic preset of the same shapes (for a shape without a preset: synthetic weights, lifted shapes).
    syn_cfg = preset_config(args.shape) if args.shape in PRESETS else ModelConfig(**lifted.cfg.to_dict())
    models = {
        "synthetic": build_model(syn_cfg, device=dev, dtype=torch.bfloat16, synthetic_seed=0, max_positions=n_pos),
        "lifted": lifted,
    }
    del lifted
    del small
    _free()
    runners = {
        k: ModelRunner(
            m,
            max(batches),
            ctx + scratch,
            cuda_graphs=cuda,
            graph_batch_sizes=tuple(batches),
            scratch_slots=scratch,
            compile=args.compile,
        )
        for k, m in models.items()
    }
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in widths:
        parents = torch.tensor([int(torch.randint(0, i, (), generator=g)) - 1 for i in range(1, n)], dtype=torch.long)
        anc = ancestor_mask(parents)
        depth = (anc.sum(-1) - 1).to(dev)
        anc = anc.to(dev)
        for b in batches:
            toks = torch.randint(0, 49152, (b, n), device=dev)
            seq = torch.full((b,), ctx, device=dev)
            t0 = time.perf_counter()
            fns = {k: (lambda r=r, t=toks, s=seq, a=anc, d=depth: r.step(t, s, a, d)) for k, r in runners.items()}
            for f in fns.values():  # capture (and compile) outside the timing
                f()
            _sync()
            pt = paired_timing(fns, blocks=args.blocks, warmup=3, inner=args.inner, device=dev)
            ratio = pt.ratio("lifted", "synthetic")  # time(lifted) / time(synthetic)
            rows.append(
                {
                    "batch": b,
                    "width": n,
                    "context": ctx,
                    "synthetic_ms": round(pt.median("synthetic") * 1e3, 4),
                    "lifted_ms": round(pt.median("lifted") * 1e3, 4),
                    "lifted_over_synthetic": round(ratio.ratio, 4),
                    "ci": [round(ratio.low, 4), round(ratio.high, 4)],
                    "within_3pct": abs(ratio.ratio - 1) <= 0.03,
                    "setup_s": round(time.perf_counter() - t0, 1),
                }
            )
    out["timing"] = rows
    out["timing_within_3pct"] = all(r["within_3pct"] for r in rows)
    del runners, models
    _free()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="SmolLM2 GGUF or folder (default: the embedded one)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--widths", default="1,16")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--no-fp32", dest="fp32", action="store_false", help="skip the fp32 equality check")
    ap.add_argument("--shape", default="llama-3.1-8b", help="lift shape (tiny: a CPU smoke run)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--skip-text", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("lift_check needs a CUDA GPU (or --device cpu --shape tiny for a smoke run)")
    DEVICE[0] = args.device
    from sglang_specpilot.models.lift import lift_label, load_small

    label = lift_label(load_small(args.model)[0].cfg, args.shape)
    out: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "label": label,
        "args": vars(args),
    }
    t0 = time.perf_counter()
    if not args.skip_text:
        check_text(args, out)
    if not args.skip_time:
        check_time(args, out)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "lift_check.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if "fp32_equal" in out:
        print(f"fp32 greedy equal to SmolLM2: {out['fp32_equal']} (differing prompts: {out['fp32_differing_prompts']})")
    if "bf16_forcing_accepted" in out:
        v = out["bf16_forcing"]
        print(
            f"bf16: equal to SmolLM2-bf16: {out['bf16_equal_to_smollm2_bf16']}; forcing mismatches lifted "
            f"{v['lifted']['mismatches']} vs SmolLM2-bf16 {v['smollm2_bf16']['mismatches']} "
            f"of {v['lifted']['tokens']}; accepted: {out['bf16_forcing_accepted']}"
        )
        for d in out["bf16_first_divergences"]:
            print(f"  prompt {d['prompt']} parts at {d['position']}: fp32 top-2 margin {d['fp32_top2_margin']}")
    if "timing" in out:
        print(f"{'batch':>5} {'width':>5} {'synthetic ms':>12} {'lifted ms':>10} {'ratio':>7} {'95% CI':>16}  ok")
        for r in out["timing"]:
            print(
                f"{r['batch']:>5} {r['width']:>5} {r['synthetic_ms']:>12.3f} {r['lifted_ms']:>10.3f} "
                f"{r['lifted_over_synthetic']:>7.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]  {r['within_3pct']}"
            )
    print(f"{path} ({out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
