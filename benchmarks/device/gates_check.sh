# The measuring calls of 2026-12-07's sixth session (benchmarks/device/README.md): the round gates that let an
# overtaking prefill run alone (kernels/hold_gate.py).
#   bash benchmarks/device/gates_check.sh tests   # no GGUF needed (~1.5 min): ride along with its first part
#   bash benchmarks/device/gates_check.sh ab      # with the GGUF's third part (~4 min)
# ab: N = 16 with AR and the mechanisms (SYSTEMS), gates on (the default), then the same with
# SPECPILOT_ROUND_GATES=0 (overtaking without gates: 4103eb1's behaviour) in a second process.
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "${1:?stage tests or ab}" in
tests)
  timeout ${TEST_S:-150} python -m pytest -q -s -m gpu tests/test_hold_gate.py tests/test_overtake.py \
    tests/test_packed_prefill.py 2>&1 | grep -E "went on|passed|failed|rror|assert" | tail -12 | tee /tmp/gates_test.txt ;;
ab)
  grep -q " passed" /tmp/gates_test.txt && ! grep -q -E "failed|error" /tmp/gates_test.txt \
    || { echo "the gate tests failed: no A/B"; exit 3; }
  for gates in 1 0; do
    SPECPILOT_ROUND_GATES=$gates SWEEP_S=${SWEEP_S:-200} NS=${NS:-16} SYSTEMS=${SYSTEMS:-ar,specpilot_batched} \
      EXTRA=${EXTRA:-} bash benchmarks/device/recheck.sh sweep
    mkdir -p $OUT/gates$gates && mv $OUT/sweep/* $OUT/gates$gates/
  done ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
