# One device call (after the GGUF's three parts have come; carry .carry/gptfast with the last part): what the
# round kernels' default does at the 8B's shapes, and where the verify GEMM loses at 33 rows.
# 1. The rounds suite's llama8b part (synthetic Llama-3.1-8B, Llama-3.2-1B-shaped drafter, the gpt-fast pair
#    in a subprocess) with the defaults, in $OUT/r8b.
# 2. benchmarks/probes/skinny_rows_probe.py: the verify GEMM at 32/33/48/64 rows and 33 padded to 64 against
#    cuBLAS on the 8B's projections, with errors in bf16 ulps against fp64, in $OUT/skinny_rows_probe.json.
# 3. One replay's kernels in order of SmolLM2's chain-6 and tree-32 rounds (round_profile.py, the real model
#    with the shipped drafter, 300 cached tokens), in $OUT/profile_smollm2.json.
set -u
timeout 260 python -m sglang_specpilot.cli bench rounds --parts llama8b --gptfast-dir .carry/gptfast \
  --results-dir $OUT/r8b 2>&1 | tail -12
timeout 120 python benchmarks/probes/skinny_rows_probe.py --out $OUT/skinny_rows_probe.json 2>&1 | tail -22
timeout 150 python benchmarks/probes/round_profile.py --target smollm2 --model /tmp/smol.gguf --context 300 \
  --systems chain6,tree32d6 --out $OUT/profile_smollm2.json 2>&1 | tail -6
