# The measuring calls of 2026-12-07's fifth session (benchmarks/device/README.md):
#   bash benchmarks/device/overtake_check.sh tests   # no GGUF needed (~2.5 min): ride along with its first part
#   bash benchmarks/device/overtake_check.sh sweep   # with the GGUF's third part (~7 min)
# tests: the GPU tests of the overtaking prefill (e7973a7) and of the four untimed round-cost changes (the
# rope/cache-write and K/V commit kernels' files run whole: their kernel cases are not gpu-marked).
# sweep: N = 16 with AR, stock and the mechanisms (TTFT: the overtaking prefill's target; throughput: the
# round-cost changes); with SPECPILOT_OVERTAKE=0 where the overtaking tests failed.
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "${1:?stage tests or sweep}" in
tests)
  timeout ${TEST_S:-80} python -m pytest -q -x tests/test_rope_cache.py tests/test_kv_commit.py tests/test_fp8_drafter.py \
    2>&1 | tail -3
  timeout ${TEST_S:-110} python -m pytest -q -m gpu tests/test_overtake.py tests/test_packed_prefill.py 2>&1 \
    | grep -v -E "Warn|warn" | tail -12 | tee /tmp/overtake_test.txt ;;
sweep)
  grep -q " passed" /tmp/overtake_test.txt && ! grep -q -E "failed|error" /tmp/overtake_test.txt \
    || export SPECPILOT_OVERTAKE=0
  echo "SPECPILOT_OVERTAKE=${SPECPILOT_OVERTAKE:-1}"
  SWEEP_S=${SWEEP_S:-420} NS=${NS:-16} SYSTEMS=${SYSTEMS:-ar,stock,specpilot_batched} EXTRA=${EXTRA:-} \
    bash benchmarks/device/recheck.sh sweep
  for f in $OUT/sweep/batched*.json; do  # each steady request's TTFT in parts (admission wait, prefill, rest)
    ns=${NS:-16}; for n in ${ns//,/ }; do python benchmarks/probes/ttft_parts.py $f --n $n 2>&1 | tail -14; done
  done
  mkdir -p /tmp/grid && cp $OUT/sweep/batched*.json /tmp/grid/ && ls /tmp/grid ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
