# 2026-12-07 (eighth session): the non-blocking host copies (engine/host_copy.py, 4a951ba), checked and A/B'd.
#   bash benchmarks/device/host_copy_check.sh tests   # no GGUF needed (~80 s): ride along with its first part
#   bash benchmarks/device/host_copy_check.sh ab      # with the GGUF's third part (~320 s)
# tests: the sync-debug-mode GPU test (a step and an overtaking admission wait on nothing but the round's
# event) and the overtaking prefill's GPU tests. ab: N = 16 with AR and the mechanisms, the copies
# non-blocking (the default) and then blocking (SPECPILOT_BLOCKING_COPIES=1, as before 4a951ba), each with
# the TTFT parts table; results under $OUT/after and $OUT/before.
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "${1:?stage tests or ab}" in
tests)
  timeout ${TEST_S:-150} python -m pytest -q -m gpu tests/test_host_copy.py tests/test_overtake.py -k gpu 2>&1 \
    | grep -v -i warn | tail -12 ;;
ab)
  for side in after before; do
    [ $side = before ] && export SPECPILOT_BLOCKING_COPIES=1
    echo "== $side (SPECPILOT_BLOCKING_COPIES=${SPECPILOT_BLOCKING_COPIES:-0})"
    SWEEP_S=${SWEEP_S:-200} NS=16 SYSTEMS=${SYSTEMS:-ar,specpilot_batched} bash benchmarks/device/recheck.sh sweep \
      | grep -E "N=16|done:" | tail -4
    python benchmarks/probes/ttft_parts.py $OUT/sweep/batched*.json --n 16 2>&1 | tail -10
    mkdir -p $OUT/$side && mv $OUT/sweep/* $OUT/$side/ && rmdir $OUT/sweep
  done ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
