"""The decode GEMV (``kernels/gemv.py``) against cuBLAS (``F.linear``) on the models' projections, one GPU.

Shapes: Llama-3.1-8B's (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336, head 128256x4096)
and the real SmolLM2-135M's (960x576, 576x576, 3072x576, 576x1536, head 49152x576), at M = 1, 2 and 4 rows
of bf16. Each timing is one CUDA graph of calls over enough distinct weight copies to pass 400 MB, so no
call finds its weights in L2 (the H200's is 60 MB); the time per call is the median replay over the calls.
The bandwidth is the weight bytes over that time. Every config is checked against ``gemv_ref`` first (one
bf16 ulp) and for determinism.

Qwen3-8B's and Llama-3.2-1B's projections are timed too, with the tiles chosen on the other two.

With ``--sweep`` each Llama-3.1-8B and SmolLM2 shape also times a grid of tiles (BLOCK_N x BLOCK_K x warps x
stages) within ``--budget-s``, every tile at one row and the best few at two and four, and reports the
best beside ``pick_config``'s choice, so the chooser is set from data.

    python benchmarks/gemv_bench.py [--sweep] [--budget-s 150] [--results-dir DIR]   (default $OUT)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "llama8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                "head": (128256, 4096)},
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                "head": (49152, 576)},
    # Shapes the tiles were not chosen on (the sweep runs on the two above): does the rule carry over?
    "qwen3_8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
                 "head": (151936, 4096)},
    "llama1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                "head": (128256, 2048)},
}  # fmt: skip
ROWS = (1, 2, 4)
ROTATE_BYTES = 400 * 2**20
REPEATS = 20


def graph_us_per_call(calls, repeats: int = REPEATS) -> float:
    """Median microseconds per call of a CUDA graph that runs ``calls`` once each (the harness's capture and
    CUDA-event timer)."""
    from sglang_specpilot.harness.graphs import graph_replay
    from sglang_specpilot.harness.timing import cuda_times_ms

    replay = graph_replay(lambda: [c() for c in calls], warmup=1)
    return statistics.median(cuda_times_ms(replay, repeats)) * 1e3 / len(calls)


def sweep_configs(M: int):
    """The tiles the sweep times: BLOCK_N x BLOCK_K x warps x pipeline stages, kept to those whose W tile
    gives each thread 8 to 32 weights at one row, 8 to 16 at more (one 16-byte load at least; the rows'
    fp32 accumulators fit in registers)."""
    from sglang_specpilot.kernels.gemv import GemvConfig

    out = []
    for bn, bk, nw, ns in itertools.product((1, 2, 4, 8, 16, 32), (128, 256, 512, 1024), (2, 4, 8), (1, 3)):
        per_thread = bn * bk // (32 * nw)
        if 8 <= per_thread <= (32 if M == 1 else 16):
            out.append(GemvConfig(bn, bk, nw, ns))
    return out


def close(y, ref) -> bool:
    return bool(((y.float() - ref.float()).abs() <= ref.float().abs().clamp_min(1e-3) * 2**-7).all())


def main(argv=None) -> int:
    from sglang_specpilot.kernels.gemv import GemvConfig, gemv, gemv_ref, gemv_wins, pick_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=os.environ.get("OUT"))
    ap.add_argument("--sweep", action="store_true", help="time a grid of tiles per shape at M = 1")
    ap.add_argument("--budget-s", type=float, default=150.0, help="the sweep stops this long after the start")
    ap.add_argument("--models", default=",".join(SHAPES))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    rows_out, sweeps = [], {}
    for model in args.models.split(","):
        for name, (N, K) in SHAPES[model].items():
            nbytes = N * K * 2
            copies = max(1, -(-ROTATE_BYTES // nbytes))
            ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5 for _ in range(copies)]
            for M in ROWS:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                cfg = pick_config(M)
                y, ref = gemv(x, ws[0], config=cfg), gemv_ref(x, ws[0])
                ok = close(y, ref) and torch.equal(gemv(x, ws[0], config=cfg), y)
                ours = graph_us_per_call([lambda w=w, x=x, c=cfg: gemv(x, w, config=c) for w in ws])
                cublas = graph_us_per_call([lambda w=w, x=x: F.linear(x, w) for w in ws])
                row = {"model": model, "proj": name, "N": N, "K": K, "M": M, "config": cfg._asdict(), "ok": ok,
                       "engine_uses": gemv_wins(M, N, K), "gemv_us": round(ours, 3), "cublas_us": round(cublas, 3),
                       "speedup_vs_cublas": round(cublas / ours, 4),
                       "gemv_TBps": round(nbytes / ours / 1e6, 3),
                       "cublas_TBps": round(nbytes / cublas / 1e6, 3)}  # fmt: skip
                rows_out.append(row)
                print(f"{model:8} {name:8} M={M} {ours:8.2f} us vs cuBLAS {cublas:8.2f} us "
                      f"x{cublas / ours:.3f} ({row['gemv_TBps']:.2f} vs {row['cublas_TBps']:.2f} TB/s)"
                      f"{'' if ok else ' WRONG'}", flush=True)  # fmt: skip
            if args.sweep and model in ("llama8b", "smollm2") and time.monotonic() - t0 < args.budget_s:
                recs = []
                for M in ROWS:
                    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                    ref = gemv_ref(x, ws[0])
                    # Every tile at one row; at more rows the six best one-row tiles, and each with half the
                    # BLOCK_K (the rows' accumulators take registers), where the sweep allows them.
                    if M == 1:
                        configs = sweep_configs(1)
                    else:
                        top = sorted((r for r in recs if r.get("ok") and r["M"] == 1), key=lambda r: r["us"])[:6]
                        allowed = set(sweep_configs(M))
                        configs = []
                        for r in top:
                            c = GemvConfig(**r["config"])
                            for cand in (c, c._replace(block_k=c.block_k // 2)):
                                if cand in allowed and cand not in configs:
                                    configs.append(cand)
                    for c in configs:
                        if time.monotonic() - t0 > args.budget_s:
                            break
                        try:
                            if not close(gemv(x, ws[0], config=c), ref):
                                recs.append({"M": M, "config": c._asdict(), "ok": False})
                                continue
                            calls = [lambda w=w, c=c, x=x: gemv(x, w, config=c) for w in ws]
                            us = graph_us_per_call(calls, repeats=5)
                            recs.append({"M": M, "config": c._asdict(), "ok": True, "us": round(us, 3),
                                         "TBps": round(nbytes / us / 1e6, 3)})  # fmt: skip
                        except Exception as e:  # out of registers / shared memory: recorded
                            recs.append({"M": M, "config": c._asdict(), "ok": False, "error": repr(e)[:200]})
                best = {}
                for M in ROWS:
                    good = [r for r in recs if r.get("ok") and r["M"] == M]
                    if good:
                        best[M] = min(good, key=lambda r: r["us"])
                        cub = next(r["cublas_us"] for r in rows_out if r["model"] == model and r["proj"] == name
                                   and r["M"] == M)  # fmt: skip
                        print(f"  sweep {model}.{name} M={M}: best {tuple(best[M]['config'].values())} "
                              f"{best[M]['us']:.2f} us ({best[M]['TBps']:.2f} TB/s, x{cub / best[M]['us']:.3f} "
                              f"cuBLAS)", flush=True)  # fmt: skip
                sweeps[f"{model}.{name}"] = {"N": N, "K": K, "results": recs, "best": best}
            del ws
            torch.cuda.empty_cache()
    geo = {}
    for model in args.models.split(","):
        for M in ROWS:
            r = [x["speedup_vs_cublas"] for x in rows_out if x["model"] == model and x["M"] == M]
            geo[f"gemv_speedup_vs_cublas_geomean_{model}_m{M}"] = round(statistics.geometric_mean(r), 4)
    res = {"metrics": geo, "rows": rows_out, "sweep": sweeps, "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "commit": os.environ.get("SPECPILOT_COMMIT")}  # fmt: skip
    print(json.dumps(geo, indent=1))
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        path = os.path.join(args.results_dir, "gemv_bench.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
