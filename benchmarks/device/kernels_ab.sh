# Two kernel questions in one call (no GGUF): the W12 tensor-core GEMM with and without pre-split activations
# (w12_xsplit.sh's suite run, without its pytest), then the TMA verify GEMM against cuBLAS (tma_check.sh
# kernel's bench, a shorter sweep). Each part checks its outputs against its reference before timing.
#   bash benchmarks/device/kernels_ab.sh
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the repo root: the device has no editable install
SPECPILOT_W12_X_SPLIT=0 timeout 250 python benchmarks/w12_gemm.py --models llama-3.1-8b --ms 16,32,64 --projections qkv,o,gate_up,down \
  --sweep-ms 16,32,64 --rotate-mb 400 --blocks 5 --inner 2 --no-cuda-kernel --results-dir $OUT/w12 2>&1 \
  | grep -v -E "pdl\.py|return PDL|This call originates" | tail -22
timeout 150 python benchmarks/skinny_tma_bench.py --budget-s 100 --results-dir $OUT/tma 2>&1 \
  | grep -v -E "pdl\.py|return PDL|This call originates" | tail -30
