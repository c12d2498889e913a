# The first measuring call of 2026-12-07's fifth session, after the GGUF (~9 min): the GPU tests of the
# overtaking prefill (e7973a7) and of the four untimed round-cost changes (the rope/cache-write and K/V commit
# kernels' files run whole: their kernel cases are not gpu-marked), then the N = 16 sweep with AR, stock and
# the mechanisms (TTFT: the overtaking prefill's target; throughput: the round-cost changes).
#   source benchmarks/device/env.sh; bash benchmarks/device/overtake_check.sh
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout ${TEST_S:-170} python -m pytest -q -x tests/test_rope_cache.py tests/test_kv_commit.py tests/test_fp8_drafter.py \
  2>&1 | tail -3
timeout ${TEST_S:-170} python -m pytest -q -m gpu tests/test_overtake.py tests/test_packed_prefill.py 2>&1 | tail -8 \
  | tee /tmp/overtake_test.txt
# A failed overtaking test: the sweep runs with it off, so the round-cost changes are still timed.
grep -q " passed" /tmp/overtake_test.txt && ! grep -q "failed" /tmp/overtake_test.txt || export SPECPILOT_OVERTAKE=0
echo "SPECPILOT_OVERTAKE=${SPECPILOT_OVERTAKE:-1}"
SWEEP_S=${SWEEP_S:-400} NS=${NS:-16} SYSTEMS=${SYSTEMS:-ar,stock,specpilot_batched} EXTRA=${EXTRA:-} \
  bash benchmarks/device/recheck.sh sweep
mkdir -p /tmp/grid && cp $OUT/sweep/batched*.json /tmp/grid/ && ls /tmp/grid
