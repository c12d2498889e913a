"""W12 GEMM on the GPU: the ``w12_gemm`` suite (W12 exact GEMM and 8-bit view vs cuBLAS BF16), or the
offline config tuner.

    python benchmarks/w12_gemm.py [suite options]      # -> benchmarks/results/w12_gemm_<gpu>.json
    python benchmarks/w12_gemm.py --tune [--backend cuda|triton] [--models ..] [--ms ..]
        # -> w12/kernels/tuned/<gpu>.json

The suite is ``sglang_specpilot.suites.w12_gemm`` (also ``specpilot bench w12_gemm`` once registered);
suite options: --models, --ms, --projections, --blocks, --inner, --rotate-mb, --no-view8, --no-cuda-kernel,
--no-sweep, --sweep-ms, --seed, --results-dir. The suite sweeps the tensor-core kernel's configs at the
verify sizes (M 8/16/32/64) in the same interleaved blocks and writes the fastest per shape as
``tuned_<gpu>.json`` beside its results (copy it to ``w12/kernels/tuned/`` for the launchers to use); it
prints a short summary table last.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from sglang_specpilot.harness.bench import run_suite
from sglang_specpilot.suites import w12_gemm as suite


def main(argv: list[str]) -> int:
    if "--tune" in argv:
        p = argparse.ArgumentParser(prog="w12_gemm.py --tune")
        p.add_argument("--tune", action="store_true")
        p.add_argument("--models", default=suite.DEFAULT_MODELS)
        p.add_argument("--ms", default=suite.DEFAULT_MS)
        p.add_argument("--iters", type=int, default=30)
        p.add_argument("--no-view8", action="store_true")
        p.add_argument("--log", default=None, help="also write the tuner's log (every config tried) as JSON")
        p.add_argument("--backend", choices=("triton", "cuda"), default="triton", help="which kernel to tune")
        a = p.parse_args(argv)
        Ms = [int(m) for m in a.ms.split(",")]
        out = suite.tune(a.models.split(","), Ms, backend=a.backend, iters=a.iters, view8=not a.no_view8)
        if a.log:
            with open(a.log, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    path = run_suite("w12_gemm", argv, command=shlex.join(["python", "benchmarks/w12_gemm.py", *argv]))
    print(path)
    table = json.loads(path.read_text()).get("summary_table")
    if table:
        print("\nW12 exact GEMM over cuBLAS BF16 (speedup; best = the sweep's fastest tensor-core config):")
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
