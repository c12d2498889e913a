"""The verify-rows GEMM (``kernels/skinny_gemm.py``) against cuBLAS (``F.linear``) on the models' projections.

Shapes: Llama-3.1-8B's, Qwen3-8B's and Llama-3.2-1B's projections (``gemv_bench.SHAPES``) at M = 4, 8, 16,
33 and 64 rows of bf16 (a chain's gamma + 1, a 32-node tree's 33, a 64-row verify). Each timing is one CUDA
graph of calls over enough distinct weight copies to pass 400 MB, so no call finds its weights in L2; the
time per call is the median replay over the calls, paired with cuBLAS in the same graph-timing loop. Every
config is checked against ``skinny_gemm_ref`` (one bf16 ulp) and for determinism first.

With ``--sweep`` each Llama-3.1-8B shape also times a grid of tiles (BLOCK_N x BLOCK_K x stages x warps,
each at the formula's split and at twice and half of it) within ``--budget-s``; the grid is compiled first
on a thread pool. It reports the best per shape and M, and per M bucket the tile whose geomean over the
shapes is best, so ``pick_config`` is set from data.

    python benchmarks/skinny_gemm_bench.py [--sweep] [--budget-s 200] [--results-dir DIR]   (default $OUT)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gemv_bench import ROTATE_BYTES, SHAPES, close, graph_us_per_call  # noqa: E402

ROWS = (4, 8, 16, 33, 64)
MODELS = ("llama8b", "qwen3_8b", "llama1b")


def sweep_tiles(M: int, small: bool = False):
    """The tiles the sweep times; ``small``: the grid for launch-bound weights (SmolLM2's), narrower tiles
    (more programs on a small N) and fewer stages (a short K)."""
    from sglang_specpilot.kernels.skinny_gemm import block_m

    out = []
    grid = ((16, 32, 64), (64, 128), (2, 3, 4), (2, 4)) if small else ((32, 64, 128), (64, 128, 256), (3, 4, 6), (4, 8))
    for bn, bk, ns, nw in itertools.product(*grid):
        smem = ns * (bn + block_m(M)) * bk * 2
        if smem <= 200 * 1024 and not (nw == 8 and bn < 128) and (small or not (bn == 32 and bk == 64)):
            out.append((bn, bk, ns, nw))
    return out


def main(argv=None) -> int:
    from sglang_specpilot.kernels.skinny_gemm import (
        SkinnyConfig,
        new_counters,
        pick_config,
        skinny_gemm,
        skinny_gemm_ref,
        split_for,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=os.environ.get("OUT"))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--sweep-models", default="llama8b", help="models whose shapes --sweep times")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    rows_m = [int(r) for r in args.rows.split(",")]
    counters = new_counters(dev)

    if args.sweep:  # compile the grid first, on a thread pool (Triton compiles on a launch's first call)
        tc = time.monotonic()
        jobs = []
        for M in rows_m:
            x = torch.randn(M, 512, device=dev, dtype=torch.bfloat16)
            w = torch.randn(200, 512, device=dev, dtype=torch.bfloat16)
            tiles = set(sweep_tiles(M)) if "llama8b" in args.sweep_models else set()
            if "smollm2" in args.sweep_models:
                tiles |= set(sweep_tiles(M, small=True))
            for bn, bk, ns, nw in sorted(tiles):
                for split in (1, 2):
                    jobs.append((x, w, SkinnyConfig(bn, bk, split, nw, ns)))

        def build(job):
            x, w, c = job
            try:
                skinny_gemm(x, w, counters=new_counters(dev), config=c)
                return None
            except Exception as e:  # out of shared memory / registers: that tile is skipped
                return (c, repr(e)[:160])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            bad = [r for r in pool.map(build, jobs) if r]
        torch.cuda.synchronize()
        print(f"compiled {len(jobs)} launches in {time.monotonic() - tc:.1f} s, {len(bad)} failed", flush=True)

    rows_out, sweeps = [], {}
    for model in args.models.split(","):
        for name, (N, K) in SHAPES[model].items():
            nbytes = N * K * 2
            copies = max(1, -(-ROTATE_BYTES // nbytes))
            ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5 for _ in range(copies)]
            for M in rows_m:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                ref = skinny_gemm_ref(x, ws[0])
                cfg = pick_config(M, N, K)
                y = skinny_gemm(x, ws[0], counters=counters, config=cfg)
                ok = close(y, ref) and torch.equal(skinny_gemm(x, ws[0], counters=counters, config=cfg), y)
                ours = graph_us_per_call([lambda w=w, x=x, c=cfg: skinny_gemm(x, w, None, counters, c) for w in ws])
                cublas = graph_us_per_call([lambda w=w, x=x: F.linear(x, w) for w in ws])
                row = {"model": model, "proj": name, "N": N, "K": K, "M": M, "config": cfg._asdict(), "ok": ok,
                       "skinny_us": round(ours, 3), "cublas_us": round(cublas, 3),
                       "speedup_vs_cublas": round(cublas / ours, 4), "skinny_TBps": round(nbytes / ours / 1e6, 3),
                       "cublas_TBps": round(nbytes / cublas / 1e6, 3)}  # fmt: skip
                rows_out.append(row)
                print(f"{model:8} {name:8} M={M:2} {ours:8.2f} us vs cuBLAS {cublas:8.2f} us x{cublas / ours:.3f} "
                      f"({row['skinny_TBps']:.2f} vs {row['cublas_TBps']:.2f} TB/s) {tuple(cfg)}"
                      f"{'' if ok else ' WRONG'}", flush=True)  # fmt: skip
                swept = model in args.sweep_models.split(",") and name != "head"
                if args.sweep and swept and time.monotonic() - t0 < args.budget_s:
                    recs = []
                    for bn, bk, ns, nw in sweep_tiles(M, small=model == "smollm2"):
                        f = split_for(-(-N // bn), -(-K // bk))
                        for split in sorted({f, max(1, f // 2), min(16, 2 * f)}):
                            if time.monotonic() - t0 > args.budget_s:
                                break
                            c = SkinnyConfig(bn, bk, split, nw, ns)
                            try:
                                if not close(skinny_gemm(x, ws[0], None, counters, c), ref):
                                    recs.append({"config": c._asdict(), "ok": False})
                                    continue
                                us = graph_us_per_call([lambda w=w, c=c, x=x: skinny_gemm(x, w, None, counters, c)
                                                        for w in ws], repeats=5)  # fmt: skip
                                recs.append({"config": c._asdict(), "ok": True, "us": round(us, 3)})
                            except Exception as e:
                                recs.append({"config": c._asdict(), "ok": False, "error": repr(e)[:160]})
                    good = [r for r in recs if r["ok"]]
                    if good:
                        best = min(good, key=lambda r: r["us"])
                        print(f"  sweep best {tuple(best['config'].values())} {best['us']:.2f} us "
                              f"x{cublas / best['us']:.3f} cuBLAS", flush=True)  # fmt: skip
                        sweeps[f"{model}.{name}.m{M}"] = {"N": N, "K": K, "M": M, "cublas_us": cublas, "results": recs,
                                                  "best": best}  # fmt: skip
            del ws
            torch.cuda.empty_cache()

    metrics = {}
    for model in args.models.split(","):
        for M in rows_m:
            r = [x["speedup_vs_cublas"] for x in rows_out if x["model"] == model and x["M"] == M]
            if r:
                metrics[f"skinny_speedup_geomean_m{M}_{model}"] = round(statistics.geometric_mean(r), 4)
                metrics[f"skinny_speedup_min_m{M}_{model}"] = round(min(r), 4)
    # Per M: the tile (split aside: the formula's multiple) with the best geomean over the swept shapes.
    rules = {}
    for model, M in itertools.product(args.sweep_models.split(","), rows_m):
        per = {}
        mine = {k: s for k, s in sweeps.items() if s["M"] == M and k.startswith(model + ".")}
        for key, s in mine.items():
            for r in s["results"]:
                if r["ok"]:
                    c = r["config"]
                    f = split_for(-(-s["N"] // c["block_n"]), -(-s["K"] // c["block_k"]))
                    mult = c["split_k"] / f
                    t = (c["block_n"], c["block_k"], c["num_stages"], c["num_warps"], round(mult, 2))
                    per.setdefault(t, {})[key] = s["cublas_us"] / r["us"]
        full = {t: statistics.geometric_mean(v.values()) for t, v in per.items() if len(v) == len(mine)}
        if full:
            best = max(full, key=full.get)
            rules[f"{model}.m{M}"] = {"tile": best, "geomean_vs_cublas": round(full[best], 4),
                        "top5": sorted(((round(g, 4), t) for t, g in full.items()), reverse=True)[:5]}  # fmt: skip
            print(f"rule {model} M={M}: (bn, bk, stages, warps, split x formula) {best} geomean x{full[best]:.3f}")
    res = {"metrics": metrics, "rows": rows_out, "sweep": sweeps, "rules": rules,
           "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "commit": os.environ.get("SPECPILOT_COMMIT"), "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    print(json.dumps(metrics, indent=1))
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        path = os.path.join(args.results_dir, "skinny_gemm_bench.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
