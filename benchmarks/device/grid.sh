# The issue-18 grid in one warm machine's calls, after the GGUF's (benchmarks/device/README.md):
#   bash benchmarks/device/grid.sh tests   # the shared-budget and prompt-admission GPU tests
#   bash benchmarks/device/grid.sh a       # N = 1, 16, 64: AR, stock, the mechanisms (kept in /tmp/grid)
#   bash benchmarks/device/grid.sh b       # N = 32, 2, 4, 8 (NS) resumed from a's file: one file, every N
#   bash benchmarks/device/grid.sh profile # where an admission's time goes at N = 16 (admit_profile)
# Each N's systems run side by side in one process; a and b load the model and warm up apart.
set -u
export PYTHONPATH=$PWD:/tmp/pp
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
git log --oneline -1 | cut -c1-60
case "${1:?stage tests, a, b or profile}" in
tests)
  timeout ${TEST_S:-300} python -m pytest -q -m gpu tests/test_chain_kinds.py tests/test_shared_budget.py \
    tests/test_prompt_admission.py 2>&1 | grep -v -E "Warn|warn" | tail -15 ;;
a)  # the chain kinds' GPU test first (tiny model, ~1 min): if it fails, the sweep runs without them
  timeout 150 python -m pytest -q -m gpu tests/test_chain_kinds.py 2>&1 | tail -4 | tee /tmp/chain_test.txt
  grep -q " passed" /tmp/chain_test.txt && ! grep -q "failed" /tmp/chain_test.txt || EXTRA="--chain-depths="
  SWEEP_S=${SWEEP_S:-560} NS=${NS:-1,16,64} SYSTEMS=${SYSTEMS:-ar,stock,specpilot_batched} EXTRA=${EXTRA:-} \
    bash benchmarks/device/recheck.sh sweep
  mkdir -p /tmp/grid && cp $OUT/sweep/batched*.json /tmp/grid/ && ls /tmp/grid ;;
b)
  prev=$(ls /tmp/grid/batched*.json | head -1)
  SWEEP_S=${SWEEP_S:-450} NS=${NS:-32,2,4,8} SYSTEMS=${SYSTEMS:-ar,stock,specpilot_batched} EXTRA="--resume $prev" \
    bash benchmarks/device/recheck.sh sweep ;;
profile)
  timeout ${PROFILE_S:-240} python benchmarks/probes/admit_profile.py -- --model /tmp/smol.gguf --concurrency 16 \
    2>&1 | grep -v -E "Warn|warn" | tail -40 ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
