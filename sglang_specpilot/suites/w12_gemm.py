"""W12 GEMM suite (one GPU): the exact-weight W12 GEMM and its 8-bit view against cuBLAS BF16.

Every projection of Llama-3.1-8B, Qwen3-8B and Llama-3.2-1B (qkv, o, gate_up, down, lm_head; shapes from
``models.presets``), M = 1 .. 64 activation rows, synthetic N(0, 0.02) BF16 weights with ~0.01% exact
zeros and ~0.01% outliers (1e3) so that escapes are exercised, encoded by ``w12.codec.encode``. Variants,
timed interleaved (``harness.timing.paired_timing``, ABC CBA blocks, CUDA events):

* ``cublas``: ``torch.matmul(x, W.t())`` in BF16 (cuBLAS);
* ``w12``: ``w12.kernels.w12_gemm`` (exact weights, decoded in registers);
* ``view8``: ``w12.kernels.w12_view8_gemm`` (hi plane only, the approximate pass).

Each variant is one CUDA graph that runs the GEMM once per weight copy; there are enough copies that a
replay reads more than twice the 60 MB L2 (``--rotate-mb``), so no call finds its weights in cache. Per-call
time = graph time / copies. Rows report time, speedup over cuBLAS with its confidence interval, and the
achieved bandwidth (weight bytes + x + y over time: 1.5 B/weight for W12, 1 for the view, 2 for BF16).
Before timing, each shape's output is checked against decode-then-matmul in fp32 at the stated tolerance
(``gemm_tolerance``); ``w12_gemm_outside_tolerance`` counts failures (must be 0).

The sweep (on by default for M in ``--sweep-ms``, 1 and 8/16/32/64: the verify sizes) also times, in the same
interleaved blocks, the tensor-core kernel (``gemm_tc``) at every tile shape of ``config.tc_candidates`` and
at three splits around ``config.tc_split_for``: each ``tc:<config>`` variant is checked against the
tolerance first, and the fastest per (shape, M bucket) is the row's ``w12_best`` (``speedup_best``) and an
entry of the written table ``tuned_tc`` (also ``tuned_<gpu>.json`` beside the results, in the format of
``w12/kernels/tuned/``: copy it there and the launchers use it). ``speedup`` stays the launcher's own
choice (formula or table), measured like any variant; ``speedup_best`` is a best-of-N, biased up by the
noise of the pick (the next run with the table measures it plainly).

``--tune`` (through ``benchmarks/w12_gemm.py``) instead times ``config.candidates`` per shape and M bucket
and writes the fastest to ``w12/kernels/tuned/<gpu>.json``, which the launchers then use.
"""

from __future__ import annotations

import argparse
import math
import time
import zlib

import torch

from ..harness.bench import register_suite
from ..models.presets import preset_config

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")
DEFAULT_MODELS = "llama-3.1-8b,qwen3-8b,llama-3.2-1b"
DEFAULT_MS = "1,2,4,8,16,32,64"
SHORT = {"llama-3.1-8b": "llama8b", "qwen3-8b": "qwen8b", "llama-3.2-1b": "llama1b"}
MAX_COPIES = 64
# Where _time_shape runs: always the GPU in the suite; the tests set "cpu" for a dry run of the bookkeeping
# (wall clock, no graphs, the reference GEMMs).
DEVICE = "cuda"


def projection_shapes(preset: str) -> dict[str, tuple[int, int]]:
    """(K, N) of every projection of a preset: y[M, N] = x[M, K] @ W[N, K]^T; qkv and gate_up fused."""
    cfg = preset_config(preset)
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {
        "qkv": (h, cfg.q_size + 2 * cfg.kv_size),
        "o": (cfg.q_size, h),
        "gate_up": (h, 2 * i),
        "down": (i, h),
        "lm_head": (h, cfg.vocab_size),
    }


def copies_for(bytes_per_copy: int, rotate_bytes: int) -> int:
    """Weight copies a graph cycles through so that one replay reads at least ``rotate_bytes``."""
    return max(1, min(MAX_COPIES, math.ceil(rotate_bytes / max(bytes_per_copy, 1))))


def short_name(preset: str) -> str:
    return SHORT.get(preset, preset.replace("-", "").replace(".", ""))


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list[dict]) -> dict[str, float]:
    """Metrics from the rows: speedup geomean per (model, M), min at M = 1, view8 and bandwidth summaries."""
    metrics: dict[str, float] = {}
    models = sorted({r["model"] for r in rows})
    for model in models:
        short = short_name(model)
        for M in sorted({r["M"] for r in rows if r["model"] == model}):
            sel = [r for r in rows if r["model"] == model and r["M"] == M]
            metrics[f"gemm_speedup_geomean_m{M}_{short}"] = round(geomean(r["speedup"] for r in sel), 4)
            if M in (1, 32):
                metrics[f"gemm_speedup_min_m{M}_{short}"] = round(min(r["speedup"] for r in sel), 4)
            if all("speedup_best" in r for r in sel):
                metrics[f"gemm_speedup_best_geomean_m{M}_{short}"] = round(geomean(r["speedup_best"] for r in sel), 4)
                metrics[f"gemm_speedup_best_min_m{M}_{short}"] = round(min(r["speedup_best"] for r in sel), 4)
            for r in sel:
                if "w12_TBps" in r:
                    metrics[f"achieved_TBps_{r['proj']}_m{M}_{short}"] = round(r["w12_TBps"], 3)
            if all("view8_speedup" in r for r in sel) and M in (1, 32):
                metrics[f"view8_speedup_geomean_m{M}_{short}"] = round(geomean(r["view8_speedup"] for r in sel), 4)
            if all("w12_cuda_speedup" in r for r in sel):
                metrics[f"gemm_speedup_cuda_kernel_geomean_m{M}_{short}"] = round(
                    geomean(r["w12_cuda_speedup"] for r in sel), 4
                )
            if sel and all("w12_xs1_speedup" in r for r in sel):
                for flag in (0, 1):
                    metrics[f"gemm_speedup_xsplit{flag}_geomean_m{M}_{short}"] = round(
                        geomean(r[f"w12_xs{flag}_speedup"] for r in sel), 4
                    )
            if all("w12_TBps" in r for r in sel) and M == 1:
                metrics[f"w12_TBps_geomean_m1_{short}"] = round(geomean(r["w12_TBps"] for r in sel), 3)
    return metrics


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma list of presets")
    p.add_argument("--ms", default=DEFAULT_MS, help="comma list of activation rows M")
    p.add_argument("--projections", default=",".join(PROJECTIONS))
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--inner", type=int, default=3, help="graph replays per sample (each replay: all copies)")
    p.add_argument("--rotate-mb", type=int, default=128, help="bytes one replay reads, past the 60 MB L2")
    p.add_argument("--no-view8", action="store_true", help="time only cublas and w12")
    p.add_argument("--no-cuda-kernel", action="store_true", help="skip the CUDA C++ kernel (mma.py) variant")
    p.add_argument("--no-sweep", dest="sweep", action="store_false", help="time no tensor-core config sweep")
    p.add_argument(
        "--sweep-ms",
        default="1,8,16,32,64",
        help="M at which the tensor-core configs are swept (M = 1: against the quad kernel)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-x-split-ab",
        dest="x_split_ab",
        action="store_false",
        help="time the tensor-core kernel only on its default activation path (not also with split_x)",
    )


def synthetic_weight(K: int, N: int, seed: int) -> torch.Tensor:
    """N(0, 0.02) BF16 [N, K] on the GPU with ~0.01% zeros and ~0.01% 1e3 outliers (escapes)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w = (torch.randn(N, K, generator=gen, device=DEVICE) * 0.02).to(torch.bfloat16)
    pick = torch.randint(0, N * K, (max(2, N * K // 5000),), generator=gen, device=DEVICE)
    flat = w.view(-1)
    flat[pick[0::2]] = 0.0
    flat[pick[1::2]] = 1e3
    return w


def _clone_w12(w):
    from w12.format import W12Tensor

    return W12Tensor(*(t.clone() for t in (w.hi, w.lo, w.base, w.esc_idx, w.esc_val)), w.shape)


def _over_copies(fn, x, copies, **kwargs):
    """One call of ``fn(x, copy, **kwargs)`` per weight copy: the body of one timed CUDA graph."""
    return lambda: [fn(x, c, **kwargs) for c in copies]


def _check(x, w, cuda_kernel: bool = False) -> dict:
    """Elements outside the stated tolerance for the exact and the view8 GEMM (0 and 0 expected)."""
    import functools

    from w12.kernels import gemm_tolerance, w12_gemm, w12_gemm_ref, w12_view8_gemm, w12_view8_gemm_ref

    out = {}
    cases = [("w12", w12_gemm, w12_gemm_ref, False), ("view8", w12_view8_gemm, w12_view8_gemm_ref, True)]
    if cuda_kernel:
        cases.append(("w12_cuda", functools.partial(w12_gemm, backend="cuda"), w12_gemm_ref, False))
    for name, fn, ref_fn, view8 in cases:
        ref = ref_fn(x, w, out_dtype=torch.float32)
        err = (fn(x, w).float() - ref).abs()
        tol = gemm_tolerance(x, w, ref, view8=view8)
        out[f"{name}_outside_tolerance"] = int((~(err <= tol)).sum())
        out[f"{name}_max_err_over_tol"] = float((err / tol).max())
    return out


def _time_shape(model: str, proj: str, K: int, N: int, Ms: list[int], args) -> list[dict]:
    """Rows of one projection at every M: cuBLAS, W12 and (unless --no-view8) the 8-bit view."""
    from w12.codec import encode
    from w12.kernels import escape_row_ptr, gemm_tc, kernel_for, w12_gemm, w12_view8_gemm

    from ..harness.graphs import graph_replay
    from ..harness.timing import paired_timing

    on_gpu = DEVICE == "cuda"
    replay = graph_replay if on_gpu else (lambda fn: fn)
    w_bf16 = synthetic_weight(K, N, args.seed + zlib.crc32(f"{model}.{proj}".encode()) % 1000)
    t0 = time.perf_counter()
    w = encode(w_bf16)
    if on_gpu:
        torch.cuda.synchronize()
    encode_s = time.perf_counter() - t0
    w12_bytes, view8_bytes, bf16_bytes = w.nbytes(), N * K + N, 2 * N * K
    copies = copies_for(w12_bytes if args.no_view8 else view8_bytes, args.rotate_mb << 20)
    w12s = [w] + [_clone_w12(w) for _ in range(copies - 1)]
    bf16s = [w_bf16] + [w_bf16.clone() for _ in range(copies - 1)]
    # The row pointer is the same for every copy (same escapes); one split-K counter buffer serves all calls
    # of a graph (they run one after another on one stream).
    row_ptr = escape_row_ptr(w)
    counters = torch.zeros(1024, dtype=torch.int32, device=DEVICE)
    from w12.kernels import mma

    cuda_kernel = on_gpu and not getattr(args, "no_cuda_kernel", False) and mma.supports(K) and mma.available(DEVICE)
    sweep_ms = {int(m) for m in args.sweep_ms.split(",")} if getattr(args, "sweep", False) else set()
    # Both exact kernels: M = 1 takes the quad kernel, the largest M the tensor-core one (kernel_for).
    checks = [_check(torch.randn(m, K, device=DEVICE).to(torch.bfloat16), w, cuda_kernel) for m in {1, max(Ms)}]
    check = {k: (max if "max_err" in k else sum)(c[k] for c in checks) for k in checks[0]}
    rows = []
    for M in Ms:
        x = torch.randn(M, K, device=DEVICE).to(torch.bfloat16)
        act = 2 * (M * K + M * N)
        variants = {
            "cublas": replay(_over_copies(lambda a, b: torch.matmul(a, b.t()), x, bf16s)),
            "w12": replay(_over_copies(w12_gemm, x, w12s, esc_row_ptr=row_ptr, counters=counters)),
        }
        if not args.no_view8:
            variants["view8"] = replay(_over_copies(w12_view8_gemm, x, w12s, counters=counters))
        if cuda_kernel:
            variants["w12_cuda"] = replay(
                _over_copies(w12_gemm, x, w12s, esc_row_ptr=row_ptr, counters=counters, backend="cuda")
            )
        # The tensor-core kernel's two activation paths, both at the launcher's tile (kernel_for: M >= 2): the
        # launcher's own path is the "w12" variant, the other one is timed beside it.
        both_x = M > 1 and gemm_tc.supports(K) and getattr(args, "x_split_ab", True)
        x_paths = {int(gemm_tc.X_SPLIT_DEFAULT): "w12", int(not gemm_tc.X_SPLIT_DEFAULT): "w12_other_x"}
        if both_x:
            variants["w12_other_x"] = replay(
                _over_copies(
                    w12_gemm, x, w12s, esc_row_ptr=row_ptr, counters=counters, x_split=not gemm_tc.X_SPLIT_DEFAULT
                )
            )
        swept, sweep_bad = {}, 0
        if M in sweep_ms:
            swept, sweep_bad = _sweep_variants(x, w, w12s, row_ptr, counters, replay, getattr(args, "x_split_ab", True))
            variants.update({name: fn for name, (fn, _) in swept.items()})
        times = paired_timing(variants, blocks=args.blocks, inner=args.inner, device=DEVICE)
        us = {name: times.median(name) / copies * 1e6 for name in variants}
        ci = times.ratio("cublas", "w12")
        row = {
            "case": f"{model}.{proj}.m{M}",
            "model": model,
            "proj": proj,
            "K": K,
            "N": N,
            "M": M,
            "weights": "synthetic",
            "copies": copies,
            "escape_rate": w.esc_idx.numel() / (N * K),
            "w12_bits_per_weight": 8 * w12_bytes / (N * K),
            "cublas_us": us["cublas"],
            "w12_us": us["w12"],
            "speedup": ci.ratio,
            "speedup_ci": ci.to_dict(),
            "cublas_TBps": (bf16_bytes + act) / us["cublas"] / 1e6,
            "w12_TBps": (w12_bytes + act) / us["w12"] / 1e6,
            "encode_s": encode_s,
            **check,
        }
        row["w12_kernel"] = kernel_for(M, K, N=N, device=x.device)
        if both_x:
            for flag, name in x_paths.items():
                row[f"w12_xs{flag}_us"] = us[name]
                row[f"w12_xs{flag}_speedup"] = times.ratio("cublas", name).ratio
            row["x_split_gain"] = times.ratio(x_paths[0], x_paths[1]).to_dict()
        line = f"{model:>13} {proj:>8} M={M:<3} cublas {us['cublas']:8.1f} us  w12 {us['w12']:8.1f} us"
        line += f" ({ci.ratio:.3f}x, {row['w12_TBps']:.2f} TB/s)"
        # The table's pick comes from the configs on the launcher's activation path (the one it will run).
        own = [name for name in swept if name.endswith(":xs") == gemm_tc.X_SPLIT_DEFAULT]
        if own:
            best = min(own, key=lambda name: us[name])
            row["best_any_x"] = min(swept, key=lambda name: us[name])
            cfg = swept[best][1]
            row["w12_best_us"] = us[best]
            row["speedup_best"] = times.ratio("cublas", best).ratio
            row["w12_best_TBps"] = (w12_bytes + act) / us[best] / 1e6
            row["best_config"] = cfg.to_dict()
            row["sweep"] = {name: round(us[name], 3) for name in swept}
            row["sweep_outside_tolerance"] = sweep_bad
            line += f"  best {us[best]:8.1f} us ({row['speedup_best']:.3f}x) {best}"
        if "view8" in us:
            row["view8_us"] = us["view8"]
            row["view8_speedup"] = times.ratio("cublas", "view8").ratio
            row["view8_TBps"] = (view8_bytes + act) / us["view8"] / 1e6
            line += f"  view8 {us['view8']:8.1f} us ({row['view8_speedup']:.3f}x)"
        if "w12_cuda" in us:
            row["w12_cuda_us"] = us["w12_cuda"]
            row["w12_cuda_speedup"] = times.ratio("cublas", "w12_cuda").ratio
            line += f"  cuda {us['w12_cuda']:8.1f} us ({row['w12_cuda_speedup']:.3f}x)"
        if both_x:
            line += f"  x_split {row['w12_xs0_speedup']:.3f}x -> {row['w12_xs1_speedup']:.3f}x"
        print(line, flush=True)
        rows.append(row)
    return rows


def sweep_configs(M: int, N: int, K: int, num_sms: int) -> list:
    """The tensor-core configs the sweep times at one shape: every ``tc_candidates(M)`` tile at its formula
    split (``tc_split_for``), half and twice that (each split >= 2 K-steps, split tiles within the
    counters), plus the formula's own config; de-duplicated."""
    from w12.kernels.config import COUNTER_SLOTS, MAX_SPLIT_K, default_tc_config, tc_candidates, tc_split_for

    out: list = []
    for cand in tc_candidates(M):
        s0 = tc_split_for(cand, M, N, K, num_sms)
        tiles = -(-N // cand.block_n) * -(-M // cand.block_m(M))
        steps = -(-K // cand.block_k)
        for s in (s0, max(1, s0 // 2), 2 * s0):
            if s > 1 and (s > MAX_SPLIT_K or steps < 2 * s or tiles > COUNTER_SLOTS):
                continue
            cfg = cand.with_split(s)
            if cfg not in out:
                out.append(cfg)
    formula = default_tc_config(M, N, K, num_sms)
    return out if formula in out else [formula, *out]


def tc_label(cfg) -> str:
    return f"tc:n{cfg.block_n}k{cfg.block_k}s{cfg.split_k}w{cfg.num_warps}st{cfg.num_stages}"


def _sweep_variants(x, w, w12s, row_ptr, counters, replay, x_split_ab: bool = True) -> tuple[dict, int]:
    """``{label: (timed fn, config)}`` of the sweep's configs that stay within tolerance at this x, and the
    number that did not (0 expected); with ``x_split_ab`` every config also with pre-split activations
    (``gemm_tc.split_x``, label suffix ":xs")."""
    from w12.kernels import gemm_tc, gemm_tolerance, w12_gemm, w12_gemm_ref

    (M, K), N = x.shape, w.shape[0]
    if not gemm_tc.supports(K):
        return {}, 0
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
    tol = gemm_tolerance(x, w, ref)
    out, bad = {}, 0
    flags = (False, True) if x_split_ab and M > 1 else (False,)
    for cfg in sweep_configs(M, N, K, num_sms):
        for flag in flags:
            label = tc_label(cfg) + (":xs" if flag else "")
            kw = dict(esc_row_ptr=row_ptr, counters=counters, tc_config=cfg, x_split=flag)
            try:
                y = w12_gemm(x, w, **kw)
            except Exception as exc:  # a config that does not fit here (shared memory, registers): not timed
                print(f"  {label} failed at M={M} N={N} K={K}: {repr(exc)[:200]}", flush=True)
                continue
            if not bool(((y.float() - ref).abs() <= tol).all()):
                bad += 1
                print(f"  {label} outside tolerance at M={M} N={N} K={K}: not timed", flush=True)
                continue
            out[label] = (replay(_over_copies(w12_gemm, x, w12s, **kw)), cfg)
    return out, bad


def chosen_table(rows: list[dict]) -> dict[str, dict]:
    """``{tc_table_key: config dict}``: the fastest swept config of every (shape, M bucket) row. Two Ms of one
    bucket (M = 2..8 share one): the config of the larger M (the bucket's worst case). M = 1 gets an entry
    (which sends M = 1 at that shape to the tensor-core kernel) only where the best swept config beat the
    launcher's quad kernel by more than 2%."""
    from w12.kernels.config import tc_table_key

    table: dict[str, tuple[int, dict]] = {}
    for r in rows:
        if r["M"] == 1 and r.get("w12_kernel") == "quad" and not r.get("speedup_best", 0) > 1.02 * r["speedup"]:
            continue
        if "best_config" in r:
            key = tc_table_key(r["M"], r["N"], r["K"])
            if key not in table or r["M"] > table[key][0]:
                table[key] = (r["M"], r["best_config"])
    return {k: cfg for k, (_, cfg) in sorted(table.items())}


def _cell(v: float | None, width: int) -> str:
    return f"{v:>{width}.3f}" if v is not None else " " * (width - 1) + "-"


def summary_table(metrics: dict, models: list[str], Ms: list[int]) -> str:
    """The short table printed last: per model and M, the launcher's speedup over cuBLAS (geomean, min over
    the projections) and the sweep's best, with the issue's geomean goals (llama8b)."""
    goals = {1: 1.30, 16: 1.20, 32: 1.20, 64: 1.10}
    lines = [f"{'model':>9} {'M':>3} {'geomean':>8} {'min':>7} {'best geo':>9} {'best min':>9} {'goal':>5}"]
    for model in models:
        short = short_name(model)
        for M in Ms:
            g = metrics.get(f"gemm_speedup_geomean_m{M}_{short}")
            if g is None:
                continue
            cells = [
                _cell(g, 8),
                _cell(metrics.get(f"gemm_speedup_min_m{M}_{short}"), 7),
                _cell(metrics.get(f"gemm_speedup_best_geomean_m{M}_{short}"), 9),
                _cell(metrics.get(f"gemm_speedup_best_min_m{M}_{short}"), 9),
                _cell(goals.get(M) if short == "llama8b" else None, 5),
            ]
            lines.append(f"{short:>9} {M:>3} " + " ".join(cells))
    return "\n".join(lines)


def _write_partial(args, rows: list[dict], elapsed_s: float) -> None:
    """The rows so far, their metrics and chosen table, rewritten after every shape to
    ``<results-dir>/w12_gemm_partial.json``: a run cut off by a time limit still leaves its measurements."""
    out_dir = getattr(args, "results_dir", None)
    if out_dir is None:
        return
    import json

    from ..harness.jsonable import to_jsonable

    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"elapsed_s": elapsed_s, "metrics": summarize(rows), "tuned_tc": chosen_table(rows), "rows": rows}
    (out_dir / "w12_gemm_partial.json").write_text(json.dumps(to_jsonable(record), indent=1) + "\n")


@register_suite("w12_gemm", add_args=_args)
def w12_gemm(args: argparse.Namespace) -> dict:
    """W12 exact GEMM and 8-bit view vs cuBLAS BF16 on Llama-3.1-8B / Qwen3-8B / Llama-3.2-1B projections."""
    if not torch.cuda.is_available():
        raise SystemExit("the w12_gemm suite needs a CUDA GPU")
    from ..harness.roofline import measure_peaks

    Ms = [int(m) for m in args.ms.split(",")]
    projections = args.projections.split(",")
    rows: list[dict] = []
    t0 = time.perf_counter()
    for model in args.models.split(","):
        for proj, (K, N) in projection_shapes(model).items():
            if proj in projections:
                rows += _time_shape(model, proj, K, N, Ms, args)
                torch.cuda.empty_cache()
                _write_partial(args, rows, time.perf_counter() - t0)
    metrics = summarize(rows)
    outside = sum(
        r["w12_outside_tolerance"] + r["view8_outside_tolerance"] + r.get("w12_cuda_outside_tolerance", 0) for r in rows
    )
    metrics["w12_gemm_outside_tolerance"] = outside
    metrics["w12_tc_sweep_outside_tolerance"] = sum(r.get("sweep_outside_tolerance", 0) for r in rows)
    out = {"metrics": metrics, "rows": rows, "peaks": measure_peaks().to_dict(), "weights": "synthetic"}
    tuned = chosen_table(rows)
    if tuned:
        import json

        from w12.kernels.config import gpu_file_slug

        name = torch.cuda.get_device_name()
        out["tuned_tc"] = tuned
        if args.results_dir is not None:
            args.results_dir.mkdir(parents=True, exist_ok=True)
            path = args.results_dir / f"tuned_{gpu_file_slug(name)}.json"
            path.write_text(json.dumps({"tuned_on": name, "tc": tuned}, indent=1) + "\n")
            print(f"tuned table ({len(tuned)} entries): {path}")
    out["summary_table"] = summary_table(metrics, args.models.split(","), Ms)
    return out


# ---------------------------------------------------------------------------------------------------------
# Offline tuning of the launch configs (benchmarks/w12_gemm.py --tune)
# ---------------------------------------------------------------------------------------------------------


def _trials(backend: str, M: int, N: int, K: int, num_sms: int) -> list[tuple]:
    """(config, launcher kwargs, log fields) for every launch the tuner times at this shape, de-duplicated by
    what actually launches (split-K is re-derived per shape)."""
    out, seen = [], set()
    if backend == "cuda":
        from w12.kernels.mma import MmaConfig, splits_for

        for cand in (MmaConfig(r, nw, sp) for r in (16, 32) for nw in (4, 8) for sp in (0, 1, 2, 4, 8)):
            eff = (cand.rows_per_warp, cand.warps, splits_for(M, N, K, cand, num_sms))
            if eff not in seen:
                seen.add(eff)
                out.append((cand, {"backend": "cuda", "mma_config": cand}, {"splits": eff[2]}))
        return out
    from w12.kernels.config import candidates, with_split

    for cand in candidates(M):
        for split in (None, 1):  # the heuristic's split, and none
            cfg = with_split(cand, M, N, K, split, num_sms)
            if cfg not in seen:
                seen.add(cfg)
                out.append((cfg, {"config": cfg}, {}))
    return out


def _fastest(fn, ref_fn, x, w, copies, view8: bool, trials, iters: int, log: list, extra: dict) -> tuple | None:
    """(fastest config, its us per call) among ``trials`` that stay within tolerance; every try is logged."""
    from w12.kernels import gemm_tolerance

    from ..harness.graphs import graph_replay
    from .common import cuda_times_ms, median

    (M, K), N = x.shape, w.shape[0]
    ref = ref_fn(x, w, out_dtype=torch.float32)
    tol = gemm_tolerance(x, w, ref, view8=view8)
    counters = torch.zeros(1024, dtype=torch.int32, device="cuda")
    timed: list[tuple] = []
    for cfg, kwargs, fields in trials:
        entry = {"K": K, "N": N, "M": M, "view8": view8, "config": cfg.to_dict(), **fields}
        try:
            if not bool(((fn(x, w, counters=counters, **kwargs).float() - ref).abs() <= tol).all()):
                log.append({**entry, "error": "outside tolerance"})
                continue
            replay = graph_replay(_over_copies(fn, x, copies, counters=counters, **kwargs))
            us = median(cuda_times_ms(replay, iters)) * 1e3 / len(copies)
        except Exception as exc:  # a config that does not fit here (shared memory, registers)
            log.append({**entry, "error": repr(exc)[:300]})
            continue
        log.append({**entry, "us": us, **extra})
        timed.append((cfg, us))
    return min(timed, key=lambda t: t[1]) if timed else None


def tune(
    models: list[str],
    Ms: list[int],
    *,
    backend: str = "triton",
    rotate_mb: int = 128,
    iters: int = 30,
    view8: bool = True,
) -> dict:
    """Time the launch configs of one backend per shape and M bucket, next to cuBLAS; the fastest go to
    ``w12/kernels/tuned/<gpu>.json``: section "configs" for Triton (``config.candidates``), "mma" for the CUDA
    kernel (``mma.MmaConfig`` shapes).

    Returns ``{section: {key: config}, "log": [every config tried, with its time or error]}``.
    """
    from w12.codec import encode
    from w12.kernels import w12_gemm, w12_gemm_ref, w12_view8_gemm, w12_view8_gemm_ref
    from w12.kernels.config import m_bucket, save_tuned, table_key

    from ..harness.graphs import graph_replay
    from .common import cuda_times_ms, median

    if backend not in ("triton", "cuda"):
        raise ValueError(f"backend={backend!r}: triton or cuda")
    section = "mma" if backend == "cuda" else "configs"
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    kinds = [(False, w12_gemm, w12_gemm_ref)] + ([(True, w12_view8_gemm, w12_view8_gemm_ref)] if view8 else [])
    best, log = {}, []
    for K, N in sorted({kn for m in models for kn in projection_shapes(m).values()}):
        w_bf16 = synthetic_weight(K, N, 0)
        w = encode(w_bf16)
        n_copies = copies_for(N * K * 3 // 2, rotate_mb << 20)
        copies = [w] + [_clone_w12(w) for _ in range(n_copies - 1)]
        bf16s = [w_bf16] + [w_bf16.clone() for _ in range(n_copies - 1)]
        for M in sorted({m_bucket(m) for m in Ms}):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            cub = graph_replay(_over_copies(lambda a, b: torch.matmul(a, b.t()), x, bf16s))
            cublas_us = median(cuda_times_ms(cub, iters)) * 1e3 / n_copies
            trials = _trials(backend, M, N, K, num_sms)
            for is_view8, fn, ref_fn in kinds:
                found = _fastest(fn, ref_fn, x, w, copies, is_view8, trials, iters, log, {"cublas_us": cublas_us})
                if found is not None:
                    cfg, us = found
                    best[table_key(M, N, K, is_view8)] = cfg
                    kind = "view8" if is_view8 else "exact"
                    print(
                        f"K={K:<6} N={N:<7} M={M:<3} {kind}: {us:8.1f} us  cublas {cublas_us:8.1f} us "
                        f"({cublas_us / us:.3f}x)  {cfg}",
                        flush=True,
                    )
        del copies, bf16s
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    print(save_tuned(name, best, extra={"tuned_on": name}, section=section))
    return {section: {k: c.to_dict() for k, c in best.items()}, "log": log}
