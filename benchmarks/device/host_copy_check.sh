# 2026-12-07 (eighth session): the non-blocking host copies (engine/host_copy.py, 4a951ba), checked and A/B'd.
#   bash benchmarks/device/host_copy_check.sh tests   # no GGUF needed (~80 s): ride along with its first part
#   bash benchmarks/device/host_copy_check.sh ab      # with the GGUF's third part (~320 s)
# tests: the sync-debug-mode GPU test (a step and an overtaking admission wait on nothing but the round's
# event) and the overtaking prefill's GPU tests. ab: N = 16 with AR and the mechanisms, the copies
# non-blocking (the default) and then blocking (SPECPILOT_BLOCKING_COPIES=1, as before 4a951ba), each with
# the TTFT parts table; results under $OUT/<system>_<after|before>.
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "${1:?stage tests or ab}" in
tests)
  timeout ${TEST_S:-150} python -m pytest -q -m gpu tests/test_host_copy.py tests/test_overtake.py -k gpu 2>&1 \
    | grep -v -i warn | tail -12 ;;
ab)  # cheapest first, so a short call still answers: AR after / before, then the mechanisms after / before
  for run in ar:after ar:before specpilot_batched:after specpilot_batched:before; do
    sys=${run%%:*} side=${run##*:}
    if [ $side = before ]; then export SPECPILOT_BLOCKING_COPIES=1; else unset SPECPILOT_BLOCKING_COPIES; fi
    echo "== $sys $side (SPECPILOT_BLOCKING_COPIES=${SPECPILOT_BLOCKING_COPIES:-0})"
    SWEEP_S=${SWEEP_S:-200} NS=16 SYSTEMS=$sys bash benchmarks/device/recheck.sh sweep | grep -E "N=16|done:" | tail -3
    python benchmarks/probes/ttft_parts.py $OUT/sweep/batched*.json --n 16 2>&1 | tail -5
    mkdir -p $OUT/${sys}_$side && mv $OUT/sweep/* $OUT/${sys}_$side/ && rmdir $OUT/sweep
  done ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
