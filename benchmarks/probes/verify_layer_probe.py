"""Where the fused verify layer's time goes on SmolLM2's shapes (kernels/skinny_gemm.py's prologues).

Each variant of each projection runs in one CUDA graph over enough weight copies to pass 400 MB (so no call
finds its weights in L2, as in a round), PDL on and off, at a chain's 7 rows and a tree's 33: cuBLAS; the
plain verify GEMM; with its rms_norm prologue; with silu_mul and the residual; with the residual. Then a
layer's four projections in order, fused (four launches) against cuBLAS with the unfused ops (eager: the
same kernel count as inductor's), per layer.

    python benchmarks/probes/verify_layer_probe.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemv_bench import ROTATE_BYTES, SHAPES, graph_us_per_call  # noqa: E402


def main(argv=None) -> int:
    from sglang_specpilot.kernels import pdl
    from sglang_specpilot.kernels.skinny_gemm import new_counters, skinny_gemm
    from sglang_specpilot.models.llama import rms_norm, silu_mul

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "verify_layer_probe.json"))
    args = ap.parse_args(argv)
    dev, bf = torch.device("cuda"), torch.bfloat16
    sh = SHAPES["smollm2"]
    H, I2 = sh["qkv"][1], sh["gate_up"][0]
    layer_bytes = sum(n * k * 2 for name, (n, k) in sh.items() if name != "head")
    copies = -(-ROTATE_BYTES // layer_bytes)
    W = {name: [torch.randn(n, k, device=dev, dtype=bf) / k**0.5 for _ in range(copies)]
         for name, (n, k) in sh.items() if name != "head"}  # fmt: skip
    nw = torch.rand(H, device=dev, dtype=bf) + 0.5
    ctr = new_counters(dev)
    rows = {}

    def probe(M: int, use_pdl: bool) -> None:
        x = torch.randn(M, H, device=dev, dtype=bf)
        gu = torch.randn(M, I2, device=dev, dtype=bf)
        res = torch.randn(M, H, device=dev, dtype=bf)
        pdl.PDL = use_pdl
        tag = f"m{M}.pdl{int(use_pdl)}"
        for name, ws in W.items():
            inp = gu[:, : ws[0].shape[1]].contiguous() if name == "down" else x
            calls = {
                "cublas": lambda w, inp=inp: F.linear(inp, w),
                "skinny": lambda w, inp=inp: skinny_gemm(inp, w, None, ctr),
            }
            if name in ("qkv", "gate_up"):
                calls["skinny_norm"] = lambda w: skinny_gemm(x, w, None, ctr, norm=nw, eps=1e-5)
            if name == "o":
                calls["skinny_res"] = lambda w: skinny_gemm(x, w, None, ctr, residual=res)
            if name == "down":
                calls["skinny_silu_res"] = lambda w: skinny_gemm(gu, w, None, ctr, silu=True, residual=res)
            out = {k: graph_us_per_call([lambda w=w, f=f: f(w) for w in ws]) for k, f in calls.items()}
            rows[f"{tag}.{name}"] = {k: round(v, 3) for k, v in out.items()}
            print(tag, name, rows[f"{tag}.{name}"], flush=True)

        def fused(i):
            q = skinny_gemm(x, W["qkv"][i], None, ctr, norm=nw, eps=1e-5)
            h = skinny_gemm(q[:, :H].contiguous(), W["o"][i], None, ctr, residual=x)
            g = skinny_gemm(h, W["gate_up"][i], None, ctr, norm=nw, eps=1e-5)
            return skinny_gemm(g, W["down"][i], None, ctr, silu=True, residual=h)

        def unfused(i):
            q = F.linear(rms_norm(x, nw, 1e-5), W["qkv"][i])
            h = x + F.linear(q[:, :H].contiguous(), W["o"][i])
            g = F.linear(rms_norm(h, nw, 1e-5), W["gate_up"][i])
            return h + F.linear(silu_mul(g), W["down"][i])

        lay = {
            "fused": graph_us_per_call([lambda i=i: fused(i) for i in range(copies)]),
            "unfused_eager": graph_us_per_call([lambda i=i: unfused(i) for i in range(copies)]),
        }
        rows[f"{tag}.layer"] = {k: round(v, 3) for k, v in lay.items()}
        print(tag, "layer", rows[f"{tag}.layer"], flush=True)

    for M in (7, 33):
        for use_pdl in (True, False):
            probe(M, use_pdl)
    res = {"rows": rows, "gpu": torch.cuda.get_device_name(dev), "commit": os.environ.get("SPECPILOT_COMMIT"),
           "note": "SmolLM2-135M shapes, synthetic weights, us per call (per layer for .layer)"}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
