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
    python benchmarks/attention_bench.py --sweep [--regime decode|tree|both] [--budget-s 65] [--results-dir DIR]

``measure_attention(device)`` returns the metrics; ``attention_over_floor_{1,64}rows_{1k,4k}`` is the step
time over the floor (the goal: <= 2 at 4k, <= 3 at 1k).

``--sweep`` first compiles every launch shape of ``_sweep_configs()`` at once on a thread pool, then times
each (per regime: decode = 1 row, tree = 64 rows) at both contexts through the kernel's launcher, checked
against the reference (the tests' bf16 tolerance, determinism, tickets left zero), and scores it by its
worse context against the goal (max over contexts of x floor / goal): the capacity is static, so one shape
must serve both contexts, as in the engine. Then it toggles each flag (pdl, one_loop, balanced,
half_partials) on the best. It prints each regime's best as the ``TUNING`` entry of
``kernels/tree_attention.py`` that reproduces it, then the default measurement (what ``measure_attention``
reports, with the table as committed), and writes both to ``attention_bench.json`` under ``--results-dir``
(default $OUT). A time budget (``--budget-s``, counted from the start of main) cuts the sweep short so the
run stays within 90 s on the H200; the first shape of each list is the table's current choice. Shapes
marked ``pdl`` launch with programmatic dependent launch: a call starts while the one before it (here the
previous layer's call, in the engine whatever kernel precedes it) finishes, and waits for it before its
first load; it never triggers the next kernel early.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

HKV, G, D, DT = 8, 4, 128, torch.bfloat16
LAYERS = 32
CAPACITY = 4096 + 128  # slots per layer cache: room for 4k tokens and a 64-token window
ROWS = (1, 64)
CONTEXTS = (1024, 4096)
REPEATS = 30
# --shape smollm2: the real SmolLM2-135M's attention (3 KV heads, 3 query heads each, head_dim 64, 30
# layers), the engine's cache at the rounds suite's --max-seq-len 1024 (+ scratch), a 32-node tree verify
# (33 rows) at a chat prompt's ~256 cached tokens and at 1k. The rounds suite at 8fdc58d profiled its
# tree-32 round at 20.6 us a tree-attention call (740 of 2,700 us of kernels) against 6.3 us for AR's
# decode call: this shape's launch table is the 8B's, never swept here.
SHAPES = {
    "llama8b": dict(HKV=8, G=4, D=128, LAYERS=32, CAPACITY=4096 + 128, ROWS=(1, 64), CONTEXTS=(1024, 4096)),
    "smollm2": dict(HKV=3, G=3, D=64, LAYERS=30, CAPACITY=1024 + 128, ROWS=(1, 33), CONTEXTS=(256, 1024)),
}


def set_shape(name: str) -> None:
    """Point the module's shape constants at ``SHAPES[name]`` (the script times one shape per run)."""
    g = globals()
    g.update(SHAPES[name])
    g["REGIME_ROWS"] = {"decode": 1, "tree": g["ROWS"][-1]}


def ctx_tag(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


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


def check(fn, layers, q, seq_len, anc, tol: float = 2e-2) -> tuple[float, bool]:
    """Max |fn - reference| on the first layer (the reference in fp32), and whether every element is within
    the tests' bf16 tolerance (tol + tol * |reference|); also asserts determinism."""
    from sglang_specpilot.kernels.tree_attention import tree_attention_ref

    k, v = layers[0]
    out = fn(q, k, v, seq_len, anc)
    again = fn(q, k, v, seq_len, anc)
    assert torch.equal(out, again), "not deterministic"
    ref = tree_attention_ref(q, k, v, seq_len, anc).float()
    err = (out.float() - ref).abs()
    return err.max().item(), bool((err <= tol + tol * ref.abs()).all())


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
            cfg = ta.pick_config(1, nq * G, HKV, CAPACITY, DT.itemsize, ta._num_sms(device), head_dim=D)
            row = {"rows": nq, "context": ctx, "floor_us": round(floor_us, 2), "config": cfg._asdict()}
            for name, fn in impls.items():
                row[f"{name}_max_err"], row[f"{name}_close"] = check(fn, layers, q, seq_len, anc)
                us = time_step(fn, layers, q, seq_len, anc)
                row[f"{name}_us"] = round(us, 2)
                row[f"{name}_over_floor"] = round(us / floor_us, 3)
            tag = f"{nq}rows_{ctx_tag(ctx)}"
            res[f"attention_over_floor_{tag}"] = row["new_over_floor"]
            res[f"attention_us_{tag}"] = row["new_us"]
            if old is not None:
                res[f"old_attention_over_floor_{tag}"] = row["old_over_floor"]
                res[f"old_attention_us_{tag}"] = row["old_us"]
            res["shapes"].append(row)
    return res


# ---------------------------------------------------------------------------------------------------------
# The sweep: launch shapes per regime, each at both contexts
# ---------------------------------------------------------------------------------------------------------

GOAL = {1024: 3.0, 4096: 2.0}  # x floor, by context (3 below 1k, where per-call latency weighs more)
REGIME_ROWS = {"decode": 1, "tree": 64}


def _sweep_configs():
    from sglang_specpilot.kernels.tree_attention import Config as C

    if HKV * G * D != 8 * 4 * 128:  # another shape: the table's choice first, then split counts and tiles
        ta = importlib.import_module("sglang_specpilot.kernels.tree_attention")
        out = {}
        for regime, nq in REGIME_ROWS.items():
            first = ta.pick_config(1, nq * G, HKV, CAPACITY, DT.itemsize, ta.DEFAULT_NUM_SMS, head_dim=D)
            tiles = (16,) if nq * G <= 16 else (32, 64, 128)
            rest = [first._replace(block_r=r, num_splits=n, num_warps=max(4, r // 16)) for r in tiles
                    for n in (1, 2, 4, 8, 16) if (r, n) != (first.block_r, first.num_splits)]  # fmt: skip
            rest += [c._replace(block_s=64) for c in rest[:4] if c.block_s != 64]
            if regime == "decode":
                # The fixed cost of a call (seq_len, K/V, partials, ticket, merge: dependent round trips) weighs
                # more than the bytes at a small model's contexts, so also a grid that keeps one split (no
                # merge) until a split would hold min_split_blocks blocks, and wider blocks or fewer warps for it.
                rest = [first._replace(min_split_blocks=m) for m in (2, 4, 8)] + rest
                rest += [first._replace(num_splits=1, block_s=256, num_warps=w) for w in (4, 8)]
                rest += [first._replace(num_splits=1, num_warps=2), first._replace(num_splits=1, num_stages=3)]
            out[regime] = [first, first._replace(pdl=True), *rest]
        return out

    # Config(block_r, block_s, num_splits, min_split_blocks, num_warps, num_stages, ...flags); the first of each
    # list is the committed table's choice at this shape. Ordered by promise: the budget may cut the tail.
    # Flags: pdl (programmatic dependent launch), one_loop (no separate unmasked prefix loop), balanced (split
    # ranges of equal slot counts, not whole blocks), half_partials (bf16 partial outputs: half the merge's
    # bytes), merge_elems (the merge step's size).
    # Registers / shared memory noted from an sm_90 compile of each shape at the 8B shapes (Triton 3.6);
    # "n/SM" = programs an SM holds. Tree shapes with 16 warps (256-row tiles) or 128-slot blocks of 128 rows
    # spill registers and are left out.
    return {
        "decode": [
            C(16, 128, 32, 1, 4, 2),  # 247 regs, 72 KB: 2/SM
            C(16, 128, 32, 1, 4, 2, pdl=True),
            C(16, 128, 32, 2, 4, 2),  # at least 2 / 4 blocks a split: fewer partials to merge at short contexts
            C(16, 128, 32, 4, 4, 2),
            C(16, 128, 32, 1, 4, 2, one_loop=True),
            C(16, 128, 16, 1, 4, 2, balanced=True),  # 16 equal ranges a kv head: 128 programs at any context
            C(16, 64, 32, 1, 4, 3),  # 219 regs, 70 KB: 2/SM
            C(16, 64, 32, 1, 4, 3, one_loop=True),
            C(16, 128, 33, 1, 4, 2, balanced=True),  # 264 programs: 2 an SM
            C(16, 128, 16, 1, 4, 2),  # at most one program an SM
            C(16, 64, 64, 1, 4, 2),  # 227 regs, 38 KB
            C(16, 128, 32, 1, 4, 1),  # no pipelining: 40 KB
            C(16, 64, 32, 1, 2, 3),  # 2 warps: fewer cross-warp reductions
            C(16, 64, 64, 2, 4, 3),
            C(16, 64, 32, 4, 4, 3, one_loop=True),
            C(16, 128, 16, 1, 8, 2),
            C(16, 256, 16, 1, 8, 2),  # 206 regs, 140 KB: 1/SM
            C(16, 256, 8, 1, 8, 2),
            C(16, 32, 64, 1, 4, 3),
            C(16, 128, 32, 1, 4, 2, merge_elems=4096),  # 196 regs (the merge sets the peak)
        ],
        "tree": [
            C(64, 64, 4, 1, 4, 3),  # 255 regs, 116 KB: 1/SM
            C(64, 64, 4, 1, 4, 3, pdl=True),
            C(64, 64, 4, 1, 4, 3, one_loop=True),
            C(64, 64, 4, 1, 4, 3, balanced=True),
            C(64, 64, 8, 1, 4, 2),  # 84 KB: 2/SM, the softmax of one beside the mma of the other
            C(64, 32, 8, 1, 4, 3),  # 222 regs, 66 KB: 2/SM
            C(128, 64, 4, 1, 8, 3),  # K/V read by 2 row tiles, not 4; 136 KB: 1/SM
            C(128, 64, 8, 1, 8, 2),  # 250 regs x 8 warps: 1/SM
            C(64, 64, 8, 1, 4, 2, half_partials=True),
            C(128, 64, 8, 1, 8, 2, half_partials=True),
            C(64, 64, 6, 1, 4, 2),
            C(64, 64, 3, 1, 4, 3),
            C(64, 32, 4, 1, 4, 3),
            C(64, 64, 4, 1, 8, 3),
            C(64, 64, 8, 1, 4, 2, merge_elems=4096),
            C(64, 128, 4, 1, 4, 2),  # 152 KB
            C(64, 64, 2, 1, 4, 3),
        ],
    }


FLAG_NAMES = ("half_partials", "pdl", "one_loop", "balanced")
# Flags the sweep toggles on the best shape once the list is done (time permitting), so that they compose.
FLAGS = {"decode": ("pdl", "one_loop", "balanced"), "tree": ("pdl", "one_loop", "balanced", "half_partials")}


def tuning_entry(cfg, rows: int, num_sms: int) -> str:
    """The ``TUNING`` line of kernels/tree_attention.py that makes pick_config return ``cfg`` at batch 1 on
    this shape (``waves`` = splits per whole set of row programs per num_sms SMs)."""
    programs = HKV * -(-rows * G // cfg.block_r)
    waves = cfg.num_splits / max(1, num_sms // programs)
    flags = "".join(f", {f}=True" for f in FLAG_NAMES if getattr(cfg, f))
    return (
        f"Tuning({cfg.block_r}, {cfg.block_r}, block_s={cfg.block_s}, num_warps={cfg.num_warps},"
        f" num_stages={cfg.num_stages}, waves={round(waves, 4)}, min_split_blocks={cfg.min_split_blocks},"
        f" merge_elems={cfg.merge_elems}{flags})"
    )


def _compiled_kernels(ta) -> dict:
    """{id: stats} of the compiled tree-attention kernels: registers, spills, shared memory (best effort: it
    reads Triton's kernel cache, which is not an API)."""
    out = {}
    try:
        for kernel_cache, *_ in ta._tree_attention_kernel.device_caches.values():
            for k in kernel_cache.values():
                out[id(k)] = {"regs": k.n_regs, "spills": k.n_spills, "smem_KB": round(k.metadata.shared / 1024)}
    except Exception:
        pass
    return out


def precompile(ta, layers, tickets, jobs) -> float:
    """Compile the kernels of ``jobs`` ((cfg, q, seq_len, anc) each) at once on a thread pool (Triton's
    AsyncCompileMode; the compiler drops the GIL), rather than one by one at their first launch. Best effort:
    a shape that fails here compiles (and fails) again at its launch. Returns the seconds it took."""
    import concurrent.futures

    import triton

    t0 = time.monotonic()
    k, v = layers[0]
    try:
        with triton.AsyncCompileMode(concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 4), ignore_errors=True):
            for cfg, q, seq_len, anc in jobs:
                try:
                    ta._launch(q, k, v, seq_len, anc, tickets, D**-0.5, cfg, compile_only=True)
                except Exception as e:
                    print("precompile", _cfg_str(cfg._asdict()), "failed:", repr(e)[:200], flush=True)
    except Exception as e:
        print("parallel compile failed; the shapes compile at their first launch:", repr(e)[:200], flush=True)
    return time.monotonic() - t0


def sweep(device, layers, bw: float, regimes, deadline: float) -> dict:
    """Time every SWEEP shape of ``regimes`` at both contexts until ``deadline`` (time.monotonic()), then
    toggle each of the regime's FLAGS on the best in turn, keeping a toggle that scores better."""
    ta = importlib.import_module("sglang_specpilot.kernels.tree_attention")
    num_sms = ta._num_sms(device)
    tickets = ta._tickets(device, 4096)
    configs = _sweep_configs()
    out: dict = {}
    all_steps = {r: {ctx: make_step(REGIME_ROWS[r], ctx, device) for ctx in CONTEXTS} for r in regimes}
    if not ta.INTERPRETED:
        jobs = [(cfg, *all_steps[r][CONTEXTS[0]]) for r in regimes for cfg in configs[r]]
        out["compile_s"] = round(precompile(ta, layers, tickets, jobs), 1)
        print(f"compiled {len(jobs)} shapes in {out['compile_s']} s", flush=True)
    for regime in regimes:
        nq = REGIME_ROWS[regime]
        steps = all_steps[regime]
        floors = {ctx: LAYERS * live_bytes(nq, ctx) / bw / 1e3 for ctx in CONTEXTS}
        # Split the time left between the regimes still to come.
        share = (deadline - time.monotonic()) / (len(regimes) - regimes.index(regime))
        stop = time.monotonic() + share
        rows, skipped, tried = [], [], set()

        def run(cfg, steps=steps, floors=floors, rows=rows, tried=tried, regime=regime) -> dict:
            rec = {"config": cfg._asdict(), "ok": True}
            tried.add(cfg)
            before = _compiled_kernels(ta)

            def fn(q, k, v, s, a):
                return ta._launch(q, k, v, s, a, tickets, D**-0.5, cfg)

            try:
                for ctx in CONTEXTS:
                    q, seq_len, anc = steps[ctx]
                    err, close = check(fn, layers, q, seq_len, anc)
                    zero = not bool(tickets.any())
                    us = time_step(fn, layers, q, seq_len, anc)
                    tag = ctx_tag(ctx)
                    rec |= {f"err_{tag}": err, f"us_{tag}": round(us, 2), f"x_{tag}": round(us / floors[ctx], 3)}
                    rec["ok"] &= close and zero
            except Exception as e:  # out of shared memory / registers: record and go on
                rec |= {"ok": False, "error": repr(e)[:300]}
            if rec["ok"]:
                rec["score"] = round(max(rec[f"x_{ctx_tag(c)}"] / GOAL.get(c, 3.0) for c in CONTEXTS), 3)
            new = [v for k, v in _compiled_kernels(ta).items() if k not in before]
            if len(new) == 1:
                rec["kernel"] = new[0]
            rows.append(rec)
            print(regime, _cfg_str(rec["config"]), _rec_str(rec), flush=True)
            return rec

        best = None
        for cfg in configs[regime]:
            if time.monotonic() > stop:
                skipped.append(list(cfg))
                continue
            rec = run(cfg)
            if rec["ok"] and (best is None or rec["score"] < best["score"]):
                best = rec
        for flag in FLAGS[regime]:
            if best is None or time.monotonic() > stop:
                break
            cand = ta.Config(**best["config"])._replace(**{flag: not best["config"][flag]})
            if cand not in tried:
                rec = run(cand)
                if rec["ok"] and rec["score"] < best["score"]:
                    best = rec
        out[regime] = {"rows": nq, "floor_us": {str(c): round(f, 2) for c, f in floors.items()}, "results": rows}
        out[regime] |= {"skipped": skipped, "best": best}
        if best is not None:
            cfg = ta.Config(**best["config"])
            out[regime]["tuning"] = f'"{regime}": ' + tuning_entry(cfg, nq, num_sms) + ","
    return out


def _cfg_str(cfg: dict) -> str:
    flags = "".join(f" {f}" for f in FLAG_NAMES if cfg[f])
    return (
        "r{block_r} s{block_s} x{num_splits} min{min_split_blocks} w{num_warps} st{num_stages} m{merge_elems}".format(
            **cfg
        )
        + flags
    )


def _rec_str(rec) -> str:
    if "error" in rec:
        return "FAILED " + rec["error"][:120]
    parts = [
        f"{rec[f'us_{ctx_tag(c)}']:.1f} us x{rec[f'x_{ctx_tag(c)}']:.2f}" for c in CONTEXTS if f"us_{ctx_tag(c)}" in rec
    ]
    kernel = rec.get("kernel")
    stats = f" ({kernel['regs']} regs, {kernel['spills']} spilled, {kernel['smem_KB']} KB)" if kernel else ""
    return " | ".join(parts) + (f" score {rec['score']:.2f}" if rec["ok"] else " WRONG") + stats


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("tree_attention_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=os.environ.get("OUT"), help="write attention_bench.json here")
    ap.add_argument("--old", default=None, help="a module file with an older tree_attention to time beside")
    ap.add_argument("--sweep", action="store_true", help="time the SWEEP launch shapes first, report the best")
    ap.add_argument("--regime", choices=("decode", "tree", "both"), default="both")
    ap.add_argument("--budget-s", type=float, default=65.0, help="the sweep stops this long after the start")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama8b", help="the model whose attention is timed")
    args = ap.parse_args(argv)
    set_shape(args.shape)
    old = load_module(args.old).tree_attention if args.old else None
    swept = None
    if args.sweep:
        device = torch.device("cuda")
        bw = hbm_GBps(device)["GBps"]
        regimes = ["decode", "tree"] if args.regime == "both" else [args.regime]
        # Leave ~8 s for the default measurement after the sweep (its kernels are compiled by then).
        swept = sweep(device, make_layers(device), bw, regimes, t0 + args.budget_s - 8)
        torch.cuda.empty_cache()
    res = measure_attention("cuda", old)
    if swept is not None:
        res["sweep"] = swept
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        suffix = "" if args.shape == "llama8b" else f"_{args.shape}"
        res["shape"] = {"name": args.shape, **SHAPES[args.shape]}
        path = os.path.join(args.results_dir, f"attention_bench{suffix}.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", path)
    hbm = res["hbm"]
    print(
        f"HBM {hbm['GBps']:.0f} GB/s (copy {hbm['copy_GBps']:.0f}, read {hbm['read_GBps']:.0f}); {LAYERS} layers,"
        f" capacity {CAPACITY} slots; {time.monotonic() - t0:.0f} s"
    )
    for regime in REGIME_ROWS:
        if regime not in (swept or {}):
            continue
        r = swept[regime]
        best = r["best"]
        tried = len(r["results"])
        if best is None:
            print(f"sweep {regime}: no shape passed ({tried} tried)")
            continue
        cut = len(r["skipped"])
        print(f"sweep {regime} best of {tried} ({cut} cut by the budget): {_cfg_str(best['config'])}")
        print(f"    {_rec_str(best)}")
        print("    TUNING", r["tuning"])
    head = f"{'rows':>5} {'ctx':>6} {'floor us':>9} {'new us':>8} {'x floor':>8} {'goal':>5}"
    print(head + (f" {'old us':>8} {'x floor':>8}" if old else ""))
    for r in res["shapes"]:
        line = (
            f"{r['rows']:>5} {r['context']:>6} {r['floor_us']:>9.1f} {r['new_us']:>8.1f} {r['new_over_floor']:>8.2f}"
            f" {GOAL.get(r['context'], 3.0):>5.1f}"
        )
        print(line + (f" {r['old_us']:>8.1f} {r['old_over_floor']:>8.2f}" if old else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
