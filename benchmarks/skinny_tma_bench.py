"""The TMA verify-rows GEMM (``kernels/skinny_tma.py``) against cuBLAS (``F.linear``) and ``skinny_gemm`` on the
8B's projections, at the row counts a verify pass uses, with a sweep of its launch shape.

Each timing is one CUDA graph of calls over enough distinct weight copies to pass 400 MB (``gemv_bench``), so
no call finds its weights in L2; per call, the median replay. Every config is first checked against
``skinny_gemm_ref`` (one bf16 ulp) and for determinism. The sweep (BLOCK_N x BLOCK_K x stages x warps, each
at ``wave_split``'s factor and at 1 and twice it) runs within ``--budget-s``, an equal share a shape; per
(projection, M) it reports the best config and per M the geomean of the bests over the projections, which is
what ``pick_config`` and ``tma_wins`` should be set from.

    python benchmarks/skinny_tma_bench.py [--budget-s 240] [--rows 4,8,16,33,64] [--results-dir DIR]
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

sys.path.insert(0, os.path.dirname(__file__))
from gemv_bench import ROTATE_BYTES, SHAPES, close, graph_us_per_call  # noqa: E402

ROWS = (4, 8, 16, 33, 64)
PROJS = ("qkv", "o", "gate_up", "down")


def sweep_configs(M: int, N: int, K: int):
    from sglang_specpilot.kernels.skinny_gemm import SMEM_BYTES
    from sglang_specpilot.kernels.skinny_tma import TmaConfig, stage_bytes, wave_split

    out = []
    for bn, bk, ns, nw in itertools.product((128, 256), (64, 128), (2, 3, 4), (4, 8)):
        if ns * stage_bytes(bn, bk, M) + 1024 > SMEM_BYTES or (nw == 8 and bn < 128) or (nw == 4 and bn == 256):
            continue
        ctas = max(1, SMEM_BYTES // (ns * stage_bytes(bn, bk, M) + 1024))
        f = wave_split(M, N, K, bn, bk, ctas)
        for split in sorted({1, f, min(8, 2 * f)}):
            out.append(TmaConfig(bn, bk, split, nw, ns))
    return out


def main(argv=None) -> int:
    from sglang_specpilot.harness.jsonable import write_json
    from sglang_specpilot.kernels.skinny_gemm import new_counters, skinny_gemm, skinny_gemm_ref
    from sglang_specpilot.kernels.skinny_tma import pick_config, skinny_tma

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=os.environ.get("OUT"))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--model", default="llama8b")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    rows_m = [int(r) for r in args.rows.split(",")]
    counters = new_counters(dev)
    rows_out, sweeps = [], {}
    for name in PROJS:
        N, K = SHAPES[args.model][name]
        nbytes = N * K * 2
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5 for _ in range(-(-ROTATE_BYTES // nbytes))]
        for M in rows_m:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = skinny_gemm_ref(x, ws[0])

            def tma(c, w, x=x):
                return skinny_tma(x, w, None, counters, c)

            cfg = pick_config(M, N, K)
            y = tma(cfg, ws[0])
            ok = close(y, ref) and torch.equal(tma(cfg, ws[0]), y)
            cublas = graph_us_per_call([lambda w=w, x=x: F.linear(x, w) for w in ws])
            ours = graph_us_per_call([lambda w=w, c=cfg: tma(c, w) for w in ws])
            old = graph_us_per_call([lambda w=w, x=x: skinny_gemm(x, w, None, counters) for w in ws])
            row = {"proj": name, "N": N, "K": K, "M": M, "config": cfg._asdict(), "ok": ok,
                   "tma_us": round(ours, 3), "cublas_us": round(cublas, 3), "skinny_us": round(old, 3),
                   "speedup_vs_cublas": round(cublas / ours, 4), "tma_TBps": round(nbytes / ours / 1e6, 3),
                   "cublas_TBps": round(nbytes / cublas / 1e6, 3)}  # fmt: skip
            rows_out.append(row)
            print(f"{name:8} M={M:2} tma {ours:8.2f} us, cuBLAS {cublas:8.2f}, skinny {old:8.2f}: x{cublas / ours:.3f} "
                  f"({row['tma_TBps']:.2f} vs {row['cublas_TBps']:.2f} TB/s) {tuple(cfg)}{'' if ok else ' WRONG'}",
                  flush=True)  # fmt: skip
            recs, t_shape = [], time.monotonic()
            share = args.budget_s / (len(PROJS) * len(rows_m))  # each (projection, M) gets its share
            for c in sweep_configs(M, N, K):
                if time.monotonic() - t_shape > share or time.monotonic() - t0 > args.budget_s:
                    break
                try:
                    if not close(tma(c, ws[0]), ref):
                        recs.append({"config": c._asdict(), "ok": False})
                        continue
                    us = graph_us_per_call([lambda w=w, c=c: tma(c, w) for w in ws], repeats=5)
                    recs.append({"config": c._asdict(), "ok": True, "us": round(us, 3)})
                except Exception as e:  # out of shared memory or registers: that config is skipped
                    recs.append({"config": c._asdict(), "ok": False, "error": repr(e)[:160]})
            good = [r for r in recs if r["ok"]]
            if good:
                best = min(good, key=lambda r: r["us"])
                sweeps[f"{name}.m{M}"] = {"N": N, "K": K, "M": M, "cublas_us": cublas, "best": best, "results": recs}
                print(f"  sweep best {tuple(best['config'].values())} {best['us']:.2f} us x{cublas / best['us']:.3f}",
                      flush=True)  # fmt: skip
        del ws
        torch.cuda.empty_cache()

    metrics = {}
    for M in rows_m:
        r = [x["speedup_vs_cublas"] for x in rows_out if x["M"] == M]
        b = [s["cublas_us"] / s["best"]["us"] for s in sweeps.values() if s["M"] == M]
        if r:
            metrics[f"tma_speedup_geomean_m{M}_{args.model}"] = round(statistics.geometric_mean(r), 4)
            metrics[f"tma_speedup_min_m{M}_{args.model}"] = round(min(r), 4)
        if len(b) == len(PROJS):
            metrics[f"tma_best_speedup_geomean_m{M}_{args.model}"] = round(statistics.geometric_mean(b), 4)
    res = {"metrics": metrics, "rows": rows_out, "sweep": sweeps, "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    print(json.dumps(metrics, indent=1))
    if args.results_dir:
        path = os.path.join(args.results_dir, "skinny_tma_bench.json")
        write_json(path, res, default=str)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
