"""Where a captured round's time goes on the e2e stand-in: kernels of AR, chain and tree rounds, in order.

"SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)" with its lifted EAGLE-3 drafter (the e2e
suite's model, ``suites.stand_in``), batch 1, rows parked at ``--context`` cached tokens. For each system
it captures the round, times it (CUDA events, median), and records one replay's kernels in launch order
(CUPTI): the drafter's steps, the verify pass and the acceptance are contiguous runs of that list, so the
JSON under ``--out`` lets the split be read off. Prints a table of per-category time last.

    python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --out $OUT/round_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_specpilot.suites.e2e_configs import chain, config_options, tree  # noqa: E402


def category(name: str) -> str:
    n = name.lower()
    if "tree_attention" in n or "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "gemv" in n or "gemm" in n or "cutlass" in n or "sm90" in n or "nvjet" in n or "xmma" in n:
        return "gemm"
    if "topk" in n or "sort" in n or "radix" in n or "argmax" in n or "reduce" in n:
        return "select"
    return "other"


def kernels_in_order(replay) -> list[tuple[str, float, float]]:
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0]
    evs.sort(key=lambda e: e.time_range.start)
    t0 = evs[0].time_range.start if evs else 0
    return [(e.name[:120], round(e.time_range.start - t0, 2), round(e.device_time, 2)) for e in evs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument("--context", type=int, default=170)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--systems", default="ar,chain5,tree32d3,tree32d6")
    p.add_argument("--out", default="round_profile.json")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--lift-layers", type=int, default=None)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--options", default="", help="extra EngineOptions as k=v,k=v (ints, floats, true/false)")
    args = p.parse_args()

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine
    from sglang_specpilot.engine.engine import scratch_slots
    from sglang_specpilot.harness.timing import times_ms
    from sglang_specpilot.suites.rounds import _parked_round, _unpark
    from sglang_specpilot.suites.stand_in import load_stand_in

    systems = {
        "ar": {"kind": "ar"},
        "chain3": chain(3),
        "chain5": chain(5),
        "chain6": chain(6),
        "tree32d3": tree(32, 3, 8),
        "tree32d6": tree(32, 6, 8),
        "tree64d6": tree(64, 6, 8),
    }
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    extra = {}
    for kv in filter(None, args.options.split(",")):
        k, v = kv.split("=")
        extra[k] = {"true": True, "false": False}.get(v.lower(), None)
        if extra[k] is None:
            extra[k] = float(v) if "." in v else int(v)
    dev = torch.device(args.device)
    n_pos = args.max_seq_len + max(
        scratch_slots(EngineOptions(device="cpu", **config_options(systems[n.removesuffix("_cublas")]))) for n in names
    )
    m = load_stand_in(args, dev, n_pos, print)
    from sglang_specpilot.harness.bench import provenance

    out = {
        "suite": "round_profile",
        **provenance(device=dev),
        "command": "python benchmarks/probes/round_profile.py " + " ".join(sys.argv[1:]),
        "metrics": {},
        "model": m.info,
        "context": args.context,
        "systems": {},
        "options": extra,
    }
    for name in names:
        # "<system>_cublas": the same round with cuBLAS for its one-row projections (no decode GEMV).
        base, cublas = name.removesuffix("_cublas"), name.endswith("_cublas")
        cfg = systems[base]
        opts = EngineOptions(
            device=args.device,
            dtype=args.dtype,
            max_seq_len=args.max_seq_len,
            max_batch_size=1,
            graph_batch_sizes=(1,),
            compile=False if args.no_compile else None,
            **config_options(cfg),
            **({**extra, "decode_gemv": False} if cublas else extra),
        )
        t0 = time.perf_counter()
        eng = Engine(m.target, m.tok, opts, None if cfg["kind"] == "ar" else m.drafter)
        eng.warmup(progress=False)
        warm = time.perf_counter() - t0
        g = torch.Generator(device=dev).manual_seed(0)
        eng.state.history[0, : args.context + 1] = torch.randint(
            0, m.real_vocab, (args.context + 1,), device=dev, generator=g
        )
        with torch.inference_mode():
            replay = _parked_round(eng, args.context)
            ms = times_ms(replay, args.iters, dev.type == "cuda")
            ks = kernels_in_order(replay) if dev.type == "cuda" else []
        _unpark(eng)
        cats: dict[str, float] = {}
        for n, _, us in ks:
            cats[category(n)] = cats.get(category(n), 0.0) + us
        out["systems"][name] = {
            "config": cfg,
            "warmup_s": round(warm, 1),
            "round_ms": ms,
            "round_ms_median": statistics.median(ms),
            "kernels": len(ks),
            "kernel_us": round(sum(k[2] for k in ks), 1),
            "span_us": round(ks[-1][1] + ks[-1][2], 1) if ks else 0,
            "by_category_us": {k: round(v, 1) for k, v in cats.items()},
            "in_order": ks,
        }
        r = out["systems"][name]
        out["metrics"].update({f"{name}_round_ms": round(r["round_ms_median"], 4), f"{name}_kernels": r["kernels"],
                               f"{name}_span_us": r["span_us"]})  # fmt: skip
        del eng, replay
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{'system':10} {'round ms':>9} {'kernels':>8} {'kern us':>8} {'span us':>8}  by category (us)")
    for name, r in out["systems"].items():
        print(
            f"{name:10} {r['round_ms_median']:9.3f} {r['kernels']:8d} {r['kernel_us']:8.0f} {r['span_us']:8.0f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["by_category_us"].items()))
        )


if __name__ == "__main__":
    main()
