"""Where a captured round's time goes on the e2e stand-in: kernels of AR, chain and tree rounds, in order.

"SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)" with its lifted EAGLE-3 drafter (the e2e
suite's model, ``suites.stand_in``), ``--batch`` rows (default 1) parked at ``--context`` cached tokens. For
each system it captures the round, times it (CUDA events, median), and records one replay's kernels in
launch order (CUPTI): the drafter's steps, the verify pass and the acceptance are contiguous runs of that
list, so the JSON under ``--out`` lets the split be read off. Prints a table of per-category time last.

System ``batched`` is ``bench batched``'s trees + mechanisms engine (``suites.batched.system_options`` at the
suite's defaults): every round kind it captured at the bucket (the configured tree, each shallower depth,
each narrowed width, each chain, the keep-up AR round) is profiled as ``batched:<kind>``. Why: at 16 clients
on the H100 (742b745) its narrowed depth-6 tree took 9.6 ms a round and stock's chain of 3 7.4 ms, against
AR's 6.3, and the tree's 1.29x tokens a row did not pay for that; this says where the 2.2 ms go.

    python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --out $OUT/round_profile.json
    python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --batch 16 --systems ar,chain3,batched
"""

from __future__ import annotations

import argparse
import json
import shlex
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
    p.add_argument("--batch", type=int, default=1, help="rows parked at the context (the round's batch bucket)")
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
    p.add_argument("--batched-args", default="", help="bench batched's options for system batched (its defaults)")
    args = p.parse_args()

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine
    from sglang_specpilot.engine.engine import scratch_slots
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
    if "batched" in names:
        systems["batched"] = {"kind": "batched"}
    extra = {}
    for kv in filter(None, args.options.split(",")):
        k, v = kv.split("=")
        extra[k] = {"true": True, "false": False}.get(v.lower(), None)
        if extra[k] is None:
            extra[k] = float(v) if "." in v else int(v)
    dev = torch.device(args.device)

    def system_opts(cfg: dict) -> dict:
        if cfg["kind"] != "batched":
            return config_options(cfg)
        from sglang_specpilot.suites import batched

        bp = argparse.ArgumentParser()
        batched._args(bp)
        mech = batched.system_options(bp.parse_args(shlex.split(args.batched_args)), [args.batch], "specpilot_batched")
        drop = ("device", "dtype", "max_seq_len", "max_batch_size", "graph_batch_sizes", "compile", "prompt_admission")
        return {k: v for k, v in mech.items() if k not in drop}

    n_pos = args.max_seq_len + max(
        scratch_slots(EngineOptions(device="cpu", **system_opts(systems[n.removesuffix("_cublas")]))) for n in names
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
            max_batch_size=args.batch,
            graph_batch_sizes=(args.batch,),
            compile=False if args.no_compile else None,
            **system_opts(cfg),
            **({**extra, "decode_gemv": False} if cublas else extra),
        )
        t0 = time.perf_counter()
        eng = Engine(m.target, m.tok, opts, None if cfg["kind"] == "ar" else m.drafter)
        eng.warmup(progress=False)
        warm = time.perf_counter() - t0
        g = torch.Generator(device=dev).manual_seed(0)
        eng.state.history[: args.batch, : args.context + 1] = torch.randint(
            0, m.real_vocab, (args.batch, args.context + 1), device=dev, generator=g
        )
        # One engine, every kind it captured (``batched``), else its own round.
        kinds = [None] + (sorted(eng.kinds, key=str) if cfg["kind"] == "batched" else [])
        for kind in kinds:
            label = name if kind is None else f"{name}:{kind}"
            record(out, label, dict(cfg, round_kind=None if kind is None else str(kind)), warm, eng, kind, args, dev)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=1))
        del eng
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(f"{'system':22} {'round ms':>9} {'kernels':>8} {'kern us':>8} {'span us':>8}  by category (us)")
    for name, r in out["systems"].items():
        print(
            f"{name:22} {r['round_ms_median']:9.3f} {r['kernels']:8d} {r['kernel_us']:8.0f} {r['span_us']:8.0f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["by_category_us"].items()))
        )


def record(out: dict, name: str, cfg: dict, warm: float, eng, kind, args, dev) -> None:
    """Time and profile one round kind of ``eng`` at ``args.batch`` parked rows into ``out["systems"][name]``."""
    from sglang_specpilot.harness.timing import times_ms
    from sglang_specpilot.suites.rounds import _parked_round, _unpark

    with torch.inference_mode():
        replay = _parked_round(eng, args.context, args.batch, kind)
        ms = times_ms(replay, args.iters, dev.type == "cuda")
        ks = kernels_in_order(replay) if dev.type == "cuda" else []
    _unpark(eng, args.batch)
    cats: dict[str, float] = {}
    for n, _, us in ks:
        cats[category(n)] = cats.get(category(n), 0.0) + us
    out["systems"][name] = {
        "config": cfg,
        "batch": args.batch,
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


if __name__ == "__main__":
    main()
