# One device call (after the GGUF's three parts have come): the fused decode kernels' GPU tests, then an
# A/B of the fused down projection (silu_mul prologue, residual epilogue) (SPECPILOT_FUSED_DECODE=1 vs 0, separate
# processes, alternated) on the lifted 8B stand-in and the real SmolLM2, AR rounds (round_profile), then the rounds suite on SmolLM2.
set -u
python -m pytest -q tests/test_gemv.py 2>&1 | tail -3
for rep in 1 2; do
  for f in 1 0; do
    SPECPILOT_FUSED_DECODE=$f python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --systems ar \
      --out $OUT/rp_lifted8b_f${f}_r$rep.json 2>&1 | tail -4
    SPECPILOT_FUSED_DECODE=$f python benchmarks/probes/round_profile.py --target smollm2 --model /tmp/smol.gguf \
      --context 300 --systems ar --out $OUT/rp_smollm2_f${f}_r$rep.json 2>&1 | tail -4
  done
done
python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -25
