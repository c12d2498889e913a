"""Where the fused verify layer's time goes on SmolLM2's shapes (kernels/skinny_gemm.py's prologues).

Each variant of each projection runs in one CUDA graph over enough weight copies to pass 400 MB (so no call
finds its weights in L2, as in a round), PDL on and off, at a chain's 7 rows and a tree's 33: cuBLAS; the
plain verify GEMM; with its residual epilogue (o, down); with its SwiGLU epilogue (gate_up). (At da1cfb6 it
also timed rms_norm and silu_mul prologues, which measured 2-4x slower than the plain GEMM and were
dropped.)

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
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from gemv_bench import ROTATE_BYTES, SHAPES, graph_us_per_call  # noqa: E402


def main(argv=None) -> int:
    from sglang_specpilot.kernels import pdl
    from sglang_specpilot.kernels.skinny_gemm import new_counters, skinny_gemm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "verify_layer_probe.json"))
    args = ap.parse_args(argv)
    dev, bf = torch.device("cuda"), torch.bfloat16
    sh = SHAPES["smollm2"]
    H = sh["qkv"][1]
    layer_bytes = sum(n * k * 2 for name, (n, k) in sh.items() if name != "head")
    copies = -(-ROTATE_BYTES // layer_bytes)
    W = {name: [torch.randn(n, k, device=dev, dtype=bf) / k**0.5 for _ in range(copies)]
         for name, (n, k) in sh.items() if name != "head"}  # fmt: skip
    ctr = new_counters(dev)
    rows = {}

    def probe(M: int, use_pdl: bool) -> None:
        x = torch.randn(M, H, device=dev, dtype=bf)
        gu = torch.randn(M, sh["down"][1], device=dev, dtype=bf)
        res = torch.randn(M, H, device=dev, dtype=bf)
        pdl.PDL = use_pdl
        tag = f"m{M}.pdl{int(use_pdl)}"
        for name, ws in W.items():
            inp = gu if name == "down" else x
            calls = {
                "cublas": lambda w, inp=inp: F.linear(inp, w),
                "skinny": lambda w, inp=inp: skinny_gemm(inp, w, None, ctr),
            }
            if name in ("o", "down"):
                calls["skinny_res"] = lambda w, inp=inp: skinny_gemm(inp, w, None, ctr, residual=res)
            if name == "gate_up":
                calls["skinny_swiglu"] = lambda w: skinny_gemm(x, w, None, ctr, swiglu=True)
            out = {k: graph_us_per_call([lambda w=w, f=f: f(w) for w in ws]) for k, f in calls.items()}
            rows[f"{tag}.{name}"] = {k: round(v, 3) for k, v in out.items()}
            print(tag, name, rows[f"{tag}.{name}"], flush=True)

    for M in (7, 33):
        for use_pdl in (True, False):
            probe(M, use_pdl)
    from sglang_specpilot.harness.bench import provenance

    res = {"suite": "verify_layer_probe", **provenance(device=dev),
           "command": "python benchmarks/probes/verify_layer_probe.py " + " ".join(sys.argv[1:]),
           "note": "SmolLM2-135M shapes, synthetic weights, us per call", "rows": rows}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
