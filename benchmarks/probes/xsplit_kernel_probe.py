"""X_SPLIT kernel alone: the W12 tensor-core GEMM with x pre-split outside the timed graph (as a compiled model
would fuse the split into x's producer) against the default path and cuBLAS, 8B per-layer projections,
weights rotated past L2 in CUDA graphs, paired blocks, medians. Prints a table; JSON to $OUT.

    python benchmarks/probes/xsplit_kernel_probe.py      # w12_xsplit_h100.json attachments.xsplit_kernel_probe
"""

import json
import os
import statistics

import torch

from sglang_specpilot.suites.w12_gemm import _clone_w12, copies_for, projection_shapes, synthetic_weight
from w12.codec import encode
from w12.kernels import escape_row_ptr, gemm_tc, gemm_tolerance, w12_gemm_ref
from w12.kernels.config import pick_tc_config

MS = (16, 32, 64)
BLOCKS, INNER = 12, 3


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def measure(proj: str, K: int, N: int) -> list[dict]:
    wb = synthetic_weight(K, N, 7)
    w = encode(wb)
    copies = copies_for(w.nbytes(), 400 << 20)
    ws = [w] + [_clone_w12(w) for _ in range(copies - 1)]
    bs = [wb] + [wb.clone() for _ in range(copies - 1)]
    rp = escape_row_ptr(w)
    cnt = torch.zeros(1024, dtype=torch.int32, device="cuda")
    rows = []
    for M in MS:
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        xs = gemm_tc.split_x(x)
        cfg = pick_tc_config(M, N, K, x.device).op_args()

        def run(c, xs_=None, x=x, cfg=cfg):
            return gemm_tc.run(x, c.hi, c.lo, c.base, c.esc_idx, c.esc_val, rp, None, cnt, cfg, True, False, xs_)

        ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
        tol = gemm_tolerance(x, w, ref)
        ok = all(bool(((run(w, a).float() - ref).abs() <= tol).all()) for a in (None, xs))
        graphs = {
            "cublas": graphed(lambda x=x: [torch.matmul(x, b.t()) for b in bs]),
            "xs0": graphed(lambda run=run: [run(c) for c in ws]),
            "xs1": graphed(lambda run=run, xs=xs: [run(c, xs) for c in ws]),
        }
        t = {k: [] for k in graphs}
        for blk in range(BLOCKS):
            for k in list(graphs) if blk % 2 == 0 else list(graphs)[::-1]:
                s, e = torch.cuda.Event(True), torch.cuda.Event(True)
                s.record()
                for _ in range(INNER):
                    graphs[k].replay()
                e.record()
                e.synchronize()
                t[k].append(s.elapsed_time(e) * 1000 / INNER / copies)
        med = {k: statistics.median(v) for k, v in t.items()}
        r = dict(proj=proj, M=M, ok=ok, us=med, xs1_over_xs0=med["xs0"] / med["xs1"],
                 xs0_vs_cublas=med["cublas"] / med["xs0"], xs1_vs_cublas=med["cublas"] / med["xs1"], raw=t)  # fmt: skip
        rows.append(r)
        print(
            f"{proj:>8} M={M:<3} ok={ok} cublas {med['cublas']:7.1f} xs0 {med['xs0']:7.1f} xs1 {med['xs1']:7.1f} us"
            f"  xs1/xs0 gain {r['xs1_over_xs0']:.3f}  vs cuBLAS {r['xs0_vs_cublas']:.3f} -> {r['xs1_vs_cublas']:.3f}",
            flush=True,
        )
    return rows


def main() -> None:
    rows = []
    for proj, (K, N) in projection_shapes("llama-3.1-8b").items():
        if proj != "lm_head":
            rows += measure(proj, K, N)
    out = os.environ.get("OUT", ".")
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(f"{out}/xsplit_probe.json", "w") as f:
        json.dump(record, f, indent=1)
    for M in MS:
        sel = [r for r in rows if r["M"] == M]
        xs0 = statistics.geometric_mean([r["xs0_vs_cublas"] for r in sel])
        xs1 = statistics.geometric_mean([r["xs1_vs_cublas"] for r in sel])
        print(f"M={M}: geomean vs cuBLAS xs0 {xs0:.3f}  xs1 (kernel only) {xs1:.3f}")


if __name__ == "__main__":
    main()
