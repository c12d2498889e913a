"""Tree attention on the GPU: the Triton kernel against the engine's SDPA path, both inside CUDA graphs.

Llama-3-8B attention shapes (8 KV heads, G = 4, head_dim 128, bf16), every request at the same context,
a chain of N new tokens. Bytes are the K/V slots read once (the floor); GB/s is against a measured copy
peak. Each graph cycles through enough cache copies to exceed L2, so small contexts are not L2 hits.

    python benchmarks/bench_tree_attention.py [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from sglang_specpilot.engine.attn_meta import build_step_meta, causal_tree
from sglang_specpilot.kernels.tree_attention import BLOCK_S, _num_sms, default_num_splits, row_block
from sglang_specpilot.kernels.tree_attention import tree_attention as kernel

HKV, G, D, DT = 8, 4, 128, torch.bfloat16
L2_BYTES = 256 << 20  # cycle caches until a graph touches this much: several times the H200's 50 MB L2


def sdpa(q, k_cache, v_cache, mask):
    # The engine's path (models/llama.py): G query heads folded into the row axis, a boolean mask.
    B, N = q.shape[:2]
    kv_len = mask.shape[-1]
    qf = q.view(B, N, HKV, G, D).transpose(1, 2).reshape(B, HKV, N * G, D)
    kf, vf = k_cache[:B, :kv_len].transpose(1, 2), v_cache[:B, :kv_len].transpose(1, 2)
    return F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)


def graph_us(calls) -> float:
    """Microseconds per call of a list of closures, replayed as one CUDA graph."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def copy_peak_GBps() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = graph_us([lambda: y.copy_(x)] * 4)
    return 2 * x.numel() / us / 1e3


def bench_one(B: int, N: int, ctx: int, peak: float, baseline: bool = True) -> dict:
    S = ctx + N
    kv_bytes = 2 * B * S * HKV * D * DT.itemsize
    shape = (B, S, HKV, D)
    caches = [
        (torch.randn(shape, dtype=DT, device="cuda"), torch.randn(shape, dtype=DT, device="cuda"))
        for _ in range(max(1, min(8, L2_BYTES // kv_bytes)))
    ]
    q = torch.randn(B, N, HKV * G, D, dtype=DT, device="cuda")
    seq_len = torch.full((B,), ctx, dtype=torch.int64, device="cuda")
    anc, depth = causal_tree(N, "cuda")
    mask = build_step_meta(seq_len, anc, depth, S, G).mask
    kernel_us = graph_us([lambda k=k, v=v: kernel(q, k, v, seq_len, anc) for k, v in caches])
    if not baseline:
        return dict(B=B, N=N, ctx=ctx, kernel_us=kernel_us)
    sdpa_us = graph_us([lambda k=k, v=v: sdpa(q, k, v, mask) for k, v in caches])
    o = kernel(q, *caches[0], seq_len, anc)
    ref = sdpa(q, *caches[0], mask).view(B, HKV, N, G, D).transpose(1, 2).reshape(o.shape)
    row_tiles = -(-N * G // row_block(N * G, B, HKV, _num_sms(q.device)))
    return dict(
        B=B,
        N=N,
        ctx=ctx,
        block_s=BLOCK_S,
        splits=default_num_splits(B, HKV, row_tiles, S, _num_sms(q.device)),
        kernel_us=kernel_us,
        sdpa_us=sdpa_us,
        GBps=kv_bytes / kernel_us / 1e3,
        peak_GBps=peak,
        max_err_vs_sdpa=(o.float() - ref.float()).abs().max().item(),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="append JSON rows here")
    args = ap.parse_args()
    peak = copy_peak_GBps()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, time=time.time())
    print(f"{meta['gpu']}, torch {torch.__version__}, copy peak {peak:.0f} GB/s")
    print("  B   N   ctx splits kernel_us   GB/s %peak  sdpa_us speedup max_err")
    rows = []
    for B in (1, 8, 32, 64):
        for N in (1, 8, 64):
            for ctx in (1024, 8192):
                r = bench_one(B, N, ctx, peak)
                rows.append(meta | r)
                print(
                    f"{B:>3} {N:>3} {ctx:>5} {r['splits']:>6} {r['kernel_us']:>9.1f} {r['GBps']:>6.0f} "
                    f"{100 * r['GBps'] / peak:>5.0f} {r['sdpa_us']:>8.1f} "
                    f"{r['sdpa_us'] / r['kernel_us']:>7.2f} {r['max_err_vs_sdpa']:.3g}"
                )
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
