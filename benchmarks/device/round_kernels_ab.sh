# One device call (after the GGUF's three parts have come): the round's small-op kernels (SPECPILOT_ROUND_KERNELS=1:
# kernels/lattice_step.py, tree_build.py, tree_accept.py; rms_norm.py for the drafter head's and the target's
# final norm and embed_rope.py for every forward's inputs, which AR runs too) on the H200.
# 0. Their GPU tests: the kernel cases natively, and a captured, compiled tree round with them equal to one without.
# 1. A/B of captured AR, chain (gamma 6) and tree (32, depth 6, top-k 8) rounds on the real SmolLM2, a row parked
#    at 300 cached tokens, separate processes, alternated, two runs each (benchmarks/probes/round_ab.py): the
#    kernels on against off (the default). Summary in $OUT/round_kernels_ab.json.
# 2. The rounds suite's real part with the kernels on, in $OUT/rounds (tokens/s, speedups, mismatches vs AR): the
#    figures to commit if the A/B says to make them the default.
set -u
python -m pytest -q tests/test_lattice_step.py tests/test_tree_build.py tests/test_tree_accept.py \
  tests/test_rms_norm_kernel.py tests/test_embed_rope.py 2>&1 | tail -3
python benchmarks/probes/round_ab.py --variant on:SPECPILOT_ROUND_KERNELS=1 --variant off:SPECPILOT_ROUND_KERNELS=0 \
  --systems ar,chain6,tree32d6 --out $OUT/round_kernels_ab.json -- --target smollm2 --model /tmp/smol.gguf --context 300
SPECPILOT_ROUND_KERNELS=1 timeout 330 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf \
  --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -25
