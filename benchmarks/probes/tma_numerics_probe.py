"""Why ``skinny_tma``'s unsplit launches fail the bench's one-ulp check (skinny_tma_h100.json, a02a30b: every
split_k = 1 config failed at down, K = 14336, every M, and at gate_up, M = 64; every split config passed).

Two explanations predict different things:
- a kernel bug (a tile never summed, a stage read early) gives errors as large as the outputs, clustered in
  whole 128-row weight tiles or K steps;
- the tensor cores' fp32 accumulation (its adds truncate rather than round, so one long accumulation chain
  drifts while split-K's shorter chains are summed in IEEE fp32) gives small errors, near outputs close to
  zero (where the check's relative bound is tightest), growing with K / split, and cuBLAS shows them too.

Per (projection, M, launch): the elements outside one bf16 ulp of the fp32 reference (``within_bf16_ulp``'s
rule), the largest error, the largest error over the output's scale, the |reference| where it fell, the
distinct weight tiles holding failures, and the error against an fp64 reference. cuBLAS is checked the same
way. Prints a table; JSON to $OUT/tma_numerics_probe.json.

    python benchmarks/probes/tma_numerics_probe.py
"""

import json
import os

import torch
import torch.nn.functional as F

from sglang_specpilot.kernels.skinny_gemm import new_counters, skinny_gemm_ref
from sglang_specpilot.kernels.skinny_tma import TmaConfig, skinny_tma

CASES = (("down", 4096, 14336, 4), ("down", 4096, 14336, 64), ("gate_up", 28672, 4096, 64), ("o", 4096, 4096, 64))
SPLITS = (1, 2, 4, 8)


def stats(y: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, block_n: int) -> dict:
    err = (y.double() - ref32.double()).abs()
    bound = ref32.double().abs().clamp_min(1e-3) * 2**-7
    bad = err > bound
    scale = ref64.abs().max().item()
    out = {
        "bad": int(bad.sum()),
        "max_err": err.max().item(),
        "max_err_over_scale": err.max().item() / scale,
        "err64_max": (y.double() - ref64).abs().max().item(),
        "err64_mean": (y.double() - ref64).abs().mean().item(),
    }
    if out["bad"]:
        worst = (err - bound).flatten().argmax()
        out["ref_at_worst"] = ref32.flatten()[worst].item()
        out["err_at_worst"] = err.flatten()[worst].item()
        cols = bad.nonzero()[:, 1]  # y is [M, N]: output column n is weight row n
        out["bad_tiles"] = int((cols // block_n).unique().numel())
        out["tiles"] = -(-y.shape[1] // block_n)
        out["bad_max_abs_ref"] = ref32[bad].abs().max().item()
    return out


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    counters = new_counters(dev)
    rows = []
    for name, N, K, M in CASES:
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        ref32 = skinny_gemm_ref(x, w)
        ref64 = x.double() @ w.double().t()
        r = {"proj": name, "N": N, "K": K, "M": M, "launch": "cublas"}
        r.update(stats(F.linear(x, w), ref32.float(), ref64, 128))
        rows.append(r)
        for split in SPLITS:
            cfg = TmaConfig(128, 128, split, 4, 3)
            y = skinny_tma(x, w, None, counters, cfg)
            torch.cuda.synchronize()
            r = {"proj": name, "N": N, "K": K, "M": M, "launch": f"tma split {split}"}
            r.update(stats(y, ref32.float(), ref64, 128))
            r["deterministic"] = bool(torch.equal(skinny_tma(x, w, None, counters, cfg), y))
            rows.append(r)
        del w
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "tma_numerics_probe.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"{'proj':8} {'M':>3} {'launch':14} {'bad':>6} {'max err':>10} {'err/scale':>10} {'err64 max':>10} "
          f"{'|ref| worst':>11} {'bad tiles':>10}")  # fmt: skip
    for r in rows:
        tiles = f"{r['bad_tiles']}/{r['tiles']}" if r["bad"] else "-"
        worst = r.get("ref_at_worst", 0.0)
        print(f"{r['proj']:8} {r['M']:3} {r['launch']:14} {r['bad']:6} {r['max_err']:10.3g} "
              f"{r['max_err_over_scale']:10.3g} {r['err64_max']:10.3g} {worst:11.3g} {tiles:>10}")  # fmt: skip


if __name__ == "__main__":
    main()
