"""Why the verify GEMM (``kernels/skinny_gemm.py``) is slower at 33 rows than at 64 on the 8B's projections.

skinny_gemm_h200.json (6e058fb) timed the same tile (64 x 128, 4 stages) at 31.4 us for qkv at M = 33 and
25.6 us at M = 64 (gate_up 100 vs 70), and flagged gate_up's M = 33 output as not within one ulp. At 33 rows
the tile's 31 spare x rows re-read row 32; at 64 none do. This probe times, on the 8B's four projections
(weight copies rotated past L2, CUDA graphs, paired with cuBLAS):

- M = 32, 33, 48 and 64 with the default config;
- "33pad": the 33 rows padded to 64 with zero rows (the kernel's M = 64, no re-read row), sliced after;
- each M's error against an fp64 product, for the kernel and for cuBLAS, in units of the output's bf16 ulp
  (is the one-ulp flag a real error or the tolerance on long-K sums?).

    python benchmarks/probes/skinny_rows_probe.py --out $OUT/skinny_rows_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemv_bench import ROTATE_BYTES, SHAPES, graph_us_per_call  # noqa: E402

from sglang_specpilot.harness.bench import provenance  # noqa: E402
from sglang_specpilot.kernels.skinny_gemm import new_counters, pick_config, skinny_gemm  # noqa: E402


def ulp_error(y: torch.Tensor, exact: torch.Tensor) -> dict:
    """Max and 99.99th-percentile |y - exact| over the bf16 ulp at |exact| (fp64 ``exact``)."""
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs().clamp_min(2**-20)
    e = ((y.double() - exact).abs() / ulp.double()).flatten().float()
    return {"max_ulp": round(e.max().item(), 2), "p9999_ulp": round(e.quantile(0.9999).item(), 2)}


def summary_metrics(rows: list[dict]) -> dict:
    """Per projection: the kernel at 33 rows over 33 padded to 64 (1.0: the spare rows cost nothing), and the
    kernel's speedup over cuBLAS at 33 rows."""
    by = {(r["proj"], str(r["M"])): r for r in rows}
    out = {}
    for proj in dict.fromkeys(r["proj"] for r in rows):
        if (proj, "33") in by and (proj, "33pad") in by:
            out[f"{proj}_m33_over_33pad"] = round(by[proj, "33"]["skinny_us"] / by[proj, "33pad"]["skinny_us"], 4)
            out[f"{proj}_m33_speedup_vs_cublas"] = by[proj, "33"]["speedup_vs_cublas"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dev = torch.device("cuda")
    counters = new_counters(dev)
    rows = []
    for name, (N, K) in SHAPES["llama8b"].items():
        if name == "head":
            continue
        copies = max(1, -(-ROTATE_BYTES // (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5 for _ in range(copies)]
        exact_w = ws[0].double()
        for M in (32, 33, 48, 64, "33pad"):
            m = 33 if M == "33pad" else M
            x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
            if M == "33pad":
                xp = torch.zeros(64, K, device=dev, dtype=torch.bfloat16)
                xp[:33] = x
                cfg = pick_config(64, N, K)

                def run(w, xp=xp, cfg=cfg):
                    return skinny_gemm(xp, w, None, counters, cfg)[:33]
            else:
                cfg = pick_config(m, N, K)

                def run(w, x=x, cfg=cfg):
                    return skinny_gemm(x, w, None, counters, cfg)

            exact = x.double() @ exact_w.T
            y, yc = run(ws[0]), F.linear(x, ws[0])
            ours = graph_us_per_call([lambda w=w: run(w) for w in ws])
            cublas = graph_us_per_call([lambda w=w, x=x: F.linear(x, w) for w in ws])
            row = {"proj": name, "N": N, "K": K, "M": M, "config": cfg._asdict(), "skinny_us": round(ours, 3),
                   "cublas_us": round(cublas, 3), "speedup_vs_cublas": round(cublas / ours, 4),
                   "skinny_err": ulp_error(y, exact), "cublas_err": ulp_error(yc, exact),
                   "equal_to_cublas": round((y == yc).float().mean().item(), 4)}  # fmt: skip
            rows.append(row)
            print(f"{name:8} M={M!s:6} {ours:8.2f} us vs cuBLAS {cublas:8.2f} us x{cublas / ours:.3f}  err ulp "
                  f"ours {row['skinny_err']} cuBLAS {row['cublas_err']}", flush=True)  # fmt: skip
        del ws
        torch.cuda.empty_cache()
    doc = {
        "suite": "skinny_rows_probe",
        **provenance(device=dev),
        "command": "python benchmarks/probes/skinny_rows_probe.py " + " ".join(sys.argv[1:]),
        "metrics": summary_metrics(rows),
        "rows": rows,
    }
    a.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
