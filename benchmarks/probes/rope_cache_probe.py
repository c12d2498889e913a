"""Time ``kernels/rope_cache.py`` alone at the lifted 8B's shapes (32 q heads, 8 K/V heads of 128) and the row
counts its rounds use, against its reference's output, in a CUDA graph (median of CUDA-event timings).

Why: in the (6, 8) tree round at 16 rows on the H100 (937d7ec, ``round_profile_b16`` in batched_h100.json) the
one-head-a-program kernel took ~9 us a call at 144 rows (338 us of the 9.9 ms round), 4.4 at 64 and 1.8 at 16.

    python benchmarks/probes/rope_cache_probe.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_specpilot.kernels.rope_cache import heads_per_program, rope_cache_write, rope_cache_write_ref  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    H, KV, D, S = 32, 8, 128, 1024
    rows = {}
    for b, n in [(1, 1), (16, 1), (1, 32), (16, 4), (16, 9), (32, 5), (64, 5)]:
        torch.manual_seed(0)
        qkv = torch.randn(b, n, (H + 2 * KV) * D, device=dev, dtype=dt)
        ang = torch.rand(b, n, 1, D, device=dev)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
        kc, vc = torch.zeros(b, S, KV, D, device=dev, dtype=dt), torch.zeros(b, S, KV, D, device=dev, dtype=dt)
        slots = (torch.arange(n, device=dev) + 100).expand(b, n).contiguous()
        q, _ = rope_cache_write(qkv, cos, sin, kc, vc, slots, H, KV, D, 64)
        kr, vr = kc.clone().zero_(), vc.clone().zero_()
        qr = rope_cache_write_ref(qkv, cos, sin, kr, vr, slots, H, KV, D)
        ok = torch.equal(q, qr) and torch.equal(kc, kr) and torch.equal(vc, vr)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                rope_cache_write(qkv, cos, sin, kc, vc, slots, H, KV, D, 64)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(20):
                rope_cache_write(qkv, cos, sin, kc, vc, slots, H, KV, D, 64)
        times = []
        for _ in range(30):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) * 1000 / 20)
        rows[f"{b}x{n}"] = {"rows": b * n, "us": round(statistics.median(times), 2), "exact": ok}
    out = {"gpu": torch.cuda.get_device_name(), "heads_per_program": heads_per_program(D), "cases": rows}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
