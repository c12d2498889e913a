# The TMA verify GEMM (kernels/skinny_tma.py, issue 12/15), never run on a GPU before: no GGUF needed.
#   bash benchmarks/device/tma_check.sh kernel   # GPU tests (every verify row count of the 8B's projections) and
#                                                # benchmarks/skinny_tma_bench.py against cuBLAS and skinny_gemm
#   bash benchmarks/device/tma_check.sh rounds   # the rounds suite's 8B part with the kernel off, then on
#                                                # (SPECPILOT_TMA_GEMM, separate processes): verify64 / verify1,
#                                                # the chain and tree rounds
# If the bench's geomeans beat cuBLAS, set tma_wins from its per-M bests and commit the rounds figures.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the repo root: the device has no editable install
case "${1:?kernel or rounds}" in
kernel)
  python -m pytest -q tests/test_skinny_tma.py 2>&1 | tail -3
  timeout 300 python benchmarks/skinny_tma_bench.py --budget-s 220 --results-dir $OUT 2>&1 | grep -v -E "pdl\.py|return PDL|This call originates" | tail -45 ;;
rounds)
  for v in 0 1; do
    SPECPILOT_TMA_GEMM=$v timeout 280 python -m sglang_specpilot.cli bench rounds --parts llama8b \
      --results-dir $OUT/rounds_tma$v 2>&1 | grep -v -E "pdl\.py|return PDL|This call originates" | tail -14
  done ;;
esac
