# One device call (after the GGUF's three parts have come): the fused verify layer (kernels/skinny_gemm.py's
# SwiGLU and residual epilogues, models/linear.py) on the real SmolLM2.
# 1. A/B of captured AR, chain (gamma 6) and tree (32, depth 6, top-k 8) rounds, a row parked at 300 cached
#    tokens, separate processes, alternated, two runs each (benchmarks/probes/round_ab.py):
#    SPECPILOT_VERIFY_GEMM=0 (cuBLAS and the unfused silu_mul and adds, as before) against the default. Summary in $OUT/verify_fused_ab.json.
# 2. The rounds suite's real part at the default (tokens/s, speedups, mismatches against AR) in $OUT/rounds.
# 0. The verify GEMM's GPU tests and its per-projection probe (benchmarks/probes/verify_layer_probe.py).
set -u
python -m pytest -q tests/test_skinny_gemm.py 2>&1 | tail -2
python benchmarks/probes/verify_layer_probe.py --out $OUT/verify_layer_probe.json 2>&1 | tail -8
python benchmarks/probes/round_ab.py --variant auto:SPECPILOT_VERIFY_GEMM=auto --variant 0:SPECPILOT_VERIFY_GEMM=0 \
  --systems ar,chain6,tree32d6 --out $OUT/verify_fused_ab.json -- --target smollm2 --model /tmp/smol.gguf --context 300
timeout 330 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -25
