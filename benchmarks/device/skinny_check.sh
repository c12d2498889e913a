# The verify GEMM's fused prologues on the GPU (one call, no GGUF needed): its kernel tests and the GEMV's
# (PDL equals the plain launch, bit for bit), then the bench on SmolLM2's and Llama-3.2-1B's projections at
# a chain's 7 and 8 rows and a 32-node tree's 33, with a tile sweep on SmolLM2's shapes.
set -u
python -m pytest -q tests/test_skinny_gemm.py tests/test_gemv.py 2>&1 | tail -3
python benchmarks/skinny_gemm_bench.py --models smollm2,llama1b --rows 7,8,33 --sweep --sweep-models smollm2 \
  --budget-s 240 2>&1 | grep -v "^  sweep best" | tail -40
