# One device call (after the GGUF's three parts have come): the verify GEMM's spare-row fix (x rows m % M,
kernels/skinny_gemm.py) checked and timed, then the figures that depend on it.
# 1. The verify GEMM's GPU tests (every verify row count 2..64 on SmolLM2's projections and epilogues) and the
#    captured tree round with the round kernels on and off.
# 2. benchmarks/probes/skinny_rows_probe.py again: M = 33 should now time as 33 rows zero-padded to 64.
# 3. The rounds suite's real part (SmolLM2 AR, lookup, chain 6, tree 32) in $OUT/rounds.
# 4. The e2e suite at batch 1 (lifted 8B stand-in + EAGLE-3 drafter: AR, stock chain, trees) in $OUT/e2e.
set -u
timeout 120 python -m pytest -q tests/test_skinny_gemm.py tests/test_tree_build.py 2>&1 | tail -2
timeout 100 python benchmarks/probes/skinny_rows_probe.py --out $OUT/skinny_rows_probe.json 2>&1 | grep "M=" | cut -c1-62
timeout 150 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 \
  --results-dir $OUT/rounds 2>&1 | grep -i "speedup\|tok/s\|rounds_h200" | tail -8
timeout 220 python -m sglang_specpilot.cli bench e2e --model /tmp/smol.gguf --batches 1 --skip-w12 \
  --tune-budget-s 100 --deadline-s 200 --results-dir $OUT/e2e 2>&1 | tail -14
