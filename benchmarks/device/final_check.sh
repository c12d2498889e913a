# One device call (after the GGUF's three parts have come): the verify GEMM's spare-row fix (x rows m % M,
# kernels/skinny_gemm.py) checked and timed, an A/B of the tree attention entry for 64-dim heads, then the
# rounds figures with the winner. The e2e suite may follow in a second call (final_e2e.sh), budget allowing.
# 1. The verify GEMM's GPU tests (every verify row count 2..64 on SmolLM2's projections and epilogues).
# 2. SmolLM2's tree-32 round with TUNING["tree_d64"] as the tree entry (base) against 128-slot blocks
#    (b128), separate processes, alternated, two runs each, in $OUT/attention_d64_ab.json.
# 3. The rounds suite's real part in $OUT/rounds, with b128 set if it won by 2% or more.
set -u
timeout 90 python -m pytest -q tests/test_skinny_gemm.py 2>&1 | tail -2
B128="tree_d64=64,64,128,4,3,0.5,8,2"
timeout 230 python benchmarks/probes/round_ab.py --variant base:SPECPILOT_ATTENTION_TUNING= \
  --variant b128:SPECPILOT_ATTENTION_TUNING=$B128 --systems tree32d6 --timeout 90 \
  --out $OUT/attention_d64_ab.json -- --target smollm2 --model /tmp/smol.gguf --context 300 2>&1 | grep -v Warn | tail -5
WIN=$(python - <<'PY'
import json, os
m = json.load(open(os.path.join(os.environ["OUT"], "attention_d64_ab.json")))["median_round_ms"]
print("b128" if m["b128"]["tree32d6"] < 0.98 * m["base"]["tree32d6"] else "base")
PY
)
echo "winner: $WIN"
if [ "$WIN" = b128 ]; then export SPECPILOT_ATTENTION_TUNING=$B128; fi
timeout 140 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 \
  --results-dir $OUT/rounds 2>&1 | grep -v Warn | tail -4
