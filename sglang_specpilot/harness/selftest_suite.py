"""The ``selftest`` suite: two matmul variants timed paired; small enough to run on a CPU in CI."""

from __future__ import annotations

import argparse

import torch

from .bench import register_suite
from .graphs import graph_replay
from .noise import noise_from_ratio
from .roofline import gemm_floor, measure_peaks
from .timing import paired_timing


def _add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=128, help="square matmul side")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--copies", type=int, default=2, help="weight copies each variant rotates through")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


@register_suite("selftest", add_args=_add_args)
def selftest(args: argparse.Namespace) -> dict:
    """Paired timing of x @ W against (W^T @ x^T)^T, plus a stock-vs-stock noise run."""
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    n = args.size
    x = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    weights = [torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(args.copies)]
    mm = [lambda w=w: torch.mm(x, w) for w in weights]
    mm_t = [lambda w=w: torch.mm(w.t(), x.t()).t() for w in weights]
    if on_gpu:
        mm, mm_t = [graph_replay(f) for f in mm], [graph_replay(f) for f in mm_t]
    # "mm_again" is the same stock variant timed a second time in the same blocks: the noise floor.
    times = paired_timing({"mm": mm, "mm_t": mm_t, "mm_again": mm}, blocks=args.blocks, device=device)
    ratio = times.ratio("mm", "mm_t")
    noise = noise_from_ratio(times.ratio("mm", "mm_again"))
    peaks = measure_peaks(device) if on_gpu else measure_peaks(device, gemv_shape=(512, 4096), gemm_size=256)
    floor = gemm_floor(n, n, n, peaks, weight_bytes=dtype.itemsize, act_bytes=dtype.itemsize)
    return {
        "peaks": peaks.to_dict(),
        "metrics": {
            "speedup_mm_t_over_mm": ratio.ratio,
            "speedup_ci_low": ratio.low,
            "speedup_ci_high": ratio.high,
            "noise_stock_vs_stock": noise,
            "mm_median_us": times.median("mm") * 1e6,
            "mm_t_median_us": times.median("mm_t") * 1e6,
            "mm_fraction_of_floor": floor.time_s / times.median("mm"),
        },
        "rows": [{"case": f"{r['variant']}.n{n}", "dtype": str(dtype), **r} for r in times.rows()],
    }
