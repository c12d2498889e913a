"""Tree attention against its K/V byte floor, per decode/verify step of Llama-3.1-8B (32 layers).

The shape: 8 KV heads, 32 query heads, head_dim 128, bf16, batch 1, a static cache of CAPACITY slots
(the engine's caches are sized for the longest request, so a short context leaves most of it unused).
Nq in {1, 64} query rows (64 = a verify tree with a random ancestor mask, W = Nq) at {1024, 4096} cached
tokens. One CUDA graph holds 32 calls over 32 distinct layer caches, so the K/V is not L2-resident (1k
tokens x 32 layers is 134 MB, over the H200's 60 MB L2); the step time is the median replay.

The floor is the live K/V bytes (2 x (context + W) x 8 heads x 128 x 2 bytes a layer) over the HBM
bandwidth measured in the same run, timed the same way: the larger of a 1 GiB device-to-device copy (read +
write bytes) and a 1 GiB sum (read bytes). On the project's H200 the copy read 2.77 TB/s in graphs (two
runs), under the 4.3 TB/s of an eager copy elsewhere, hence the sum beside it.

    python benchmarks/attention_bench.py [--results-dir DIR] [--old PATH_TO_OLD_MODULE]

``measure_attention(device)`` returns the metrics; ``attention_over_floor_{1,64}rows_{1k,4k}`` is the step
time over the floor (the goal: <= 2 at 4k, <= 3 at 1k).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys

import torch

HKV, G, D, DT = 8, 4, 128, torch.bfloat16
LAYERS = 32
CAPACITY = 4096 + 128  # slots per layer cache: room for 4k tokens and a 64-token window
ROWS = (1, 64)
CONTEXTS = (1024, 4096)
REPEATS = 30


def graph_us(calls, repeats: int = REPEATS, warmup: int = 3) -> float:
    """Median microseconds of one replay of a CUDA graph that runs ``calls`` in order."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def hbm_GBps(device) -> dict:
    """HBM bandwidth two ways, 1 GiB at a time, four to a graph: a device-to-device copy (read + write bytes)
    and a sum (read bytes, as attention does). The floor uses the larger, the stricter of the two."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    # An idle H200 sits at 345 MHz; 40 replays (~0.1 s of copies) bring the clocks up before the timed ones.
    copy_us = graph_us([lambda: y.copy_(x)] * 4, repeats=20, warmup=40) / 4
    xs = x.view(torch.bfloat16)
    read_us = graph_us([lambda: xs.sum()] * 4, repeats=20, warmup=40) / 4
    copy = 2 * (1 << 30) / copy_us / 1e3
    read = (1 << 30) / read_us / 1e3
    return {"copy_GBps": round(copy, 1), "read_GBps": round(read, 1), "GBps": round(max(copy, read), 1)}


def random_tree(n: int, gen: torch.Generator) -> torch.Tensor:
    """Ancestor-or-self matrix of a random tree in topological order (node i's parent is some j < i)."""
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        anc[i] |= anc[int(torch.randint(0, i, (1,), generator=gen))]
    return anc


def make_layers(device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (1, CAPACITY, HKV, D)
    return [
        (
            torch.randn(shape, generator=gen, device=device, dtype=DT),
            torch.randn(shape, generator=gen, device=device, dtype=DT),
        )
        for _ in range(LAYERS)
    ]


def make_step(nq: int, ctx: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, nq, HKV * G, D, generator=gen).to(device, DT)
    anc = random_tree(nq, gen).to(device)
    seq_len = torch.full((1,), ctx, dtype=torch.int64, device=device)
    return q, seq_len, anc


def live_bytes(nq: int, ctx: int) -> int:
    return 2 * (ctx + nq) * HKV * D * DT.itemsize


def time_step(fn, layers, q, seq_len, anc) -> float:
    """Microseconds of one step: fn(q, k, v, seq_len, anc) over every layer cache, in one graph."""
    return graph_us([lambda k=k, v=v: fn(q, k, v, seq_len, anc) for k, v in layers])


def check(fn, layers, q, seq_len, anc) -> float:
    """Max |fn - reference| on the first layer (the reference in fp32); also asserts determinism."""
    from sglang_specpilot.kernels.tree_attention import tree_attention_ref

    k, v = layers[0]
    out = fn(q, k, v, seq_len, anc)
    again = fn(q, k, v, seq_len, anc)
    assert torch.equal(out, again), "not deterministic"
    return (out.float() - tree_attention_ref(q, k, v, seq_len, anc).float()).abs().max().item()


def measure_attention(device: str = "cuda", old=None) -> dict:
    """Per-step tree-attention time over the K/V byte floor on the 8B shape; ``old`` is an optional
    ``tree_attention`` to time beside the current one (keys ``old_*``)."""
    ta = importlib.import_module("sglang_specpilot.kernels.tree_attention")
    tree_attention = ta.tree_attention

    device = torch.device(device)
    hbm = hbm_GBps(device)
    bw = hbm["GBps"]
    layers = make_layers(device)
    res: dict = {"hbm": hbm, "hbm_GBps": bw, "layers": LAYERS, "capacity": CAPACITY, "shapes": []}
    impls = {"new": tree_attention} | ({"old": old} if old is not None else {})
    for ctx in CONTEXTS:
        for nq in ROWS:
            q, seq_len, anc = make_step(nq, ctx, device)
            floor_us = LAYERS * live_bytes(nq, ctx) / bw / 1e3
            cfg = ta.pick_config(1, nq * G, HKV, CAPACITY, DT.itemsize, ta._num_sms(device))
            row = {"rows": nq, "context": ctx, "floor_us": round(floor_us, 2), "config": cfg._asdict()}
            for name, fn in impls.items():
                row[f"{name}_max_err"] = check(fn, layers, q, seq_len, anc)
                us = time_step(fn, layers, q, seq_len, anc)
                row[f"{name}_us"] = round(us, 2)
                row[f"{name}_over_floor"] = round(us / floor_us, 3)
            tag = f"{nq}rows_{ctx // 1024}k"
            res[f"attention_over_floor_{tag}"] = row["new_over_floor"]
            res[f"attention_us_{tag}"] = row["new_us"]
            if old is not None:
                res[f"old_attention_over_floor_{tag}"] = row["old_over_floor"]
                res[f"old_attention_us_{tag}"] = row["old_us"]
            res["shapes"].append(row)
    return res


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("tree_attention_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=None, help="write attention_bench.json here")
    ap.add_argument("--old", default=None, help="a module file with an older tree_attention to time beside")
    args = ap.parse_args(argv)
    old = load_module(args.old).tree_attention if args.old else None
    res = measure_attention("cuda", old)
    hbm = res["hbm"]
    print(
        f"HBM {hbm['GBps']:.0f} GB/s (copy {hbm['copy_GBps']:.0f}, read {hbm['read_GBps']:.0f}); {LAYERS} layers,"
        f" capacity {CAPACITY} slots"
    )
    head = f"{'rows':>5} {'ctx':>6} {'floor us':>9} {'new us':>8} {'x floor':>8}"
    print(head + (f" {'old us':>8} {'x floor':>8}" if old else ""))
    for r in res["shapes"]:
        line = f"{r['rows']:>5} {r['context']:>6} {r['floor_us']:>9.1f} {r['new_us']:>8.1f} {r['new_over_floor']:>8.2f}"
        print(line + (f" {r['old_us']:>8.1f} {r['old_over_floor']:>8.2f}" if old else ""))
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        path = os.path.join(args.results_dir, "attention_bench.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
