# The round-cost changes of 2026-12-07's fourth session, checked and timed in one call after the GGUF (~7 min):
# the rope/cache-write kernel (a block of heads a program), the K/V commit kernel and the FP8 drafter on the
# GPU against their references, the rope kernel alone (probes/rope_cache_probe.py), then the round profile at
# 16 rows with the drafter in bf16 and in FP8 (the batched engine's every round kind, AR and stock's chain).
# Compare with batched_h100.json's round_profile_b16 (937d7ec: (6, 8) tree 9.93 ms, chain3 7.76, AR 6.30).
#   source benchmarks/device/env.sh; bash benchmarks/device/round_cost_check.sh
set -u
export PYTHONPATH=$PWD:/tmp/pp
quiet() { grep -v -E "pdl\.py|return PDL|This call originates|[Ww]arn"; }
timeout 120 python -m pytest -q tests/test_rope_cache.py tests/test_kv_commit.py tests/test_fp8_drafter.py 2>&1 | tail -4
timeout 60 python benchmarks/probes/rope_cache_probe.py --out $OUT/rope_cache_probe.json 2>&1 | quiet | tail -40
for dw in bf16 fp8; do
  timeout ${PROFILE_S:-200} python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --batch 16 \
    --systems ar,chain3,batched --batched-args "--draft-weights $dw" --out $OUT/round_profile_b16_$dw.json 2>&1 \
    | quiet | tail -18
done
