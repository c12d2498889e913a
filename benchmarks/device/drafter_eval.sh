# One device call after drafter_train.sh (/tmp/e3new): the new drafter replaces the shipped one in the
# device's tree, then its replay tau on MT-Bench turn 1 (evaluation only) and held-out HumanEval/100-163,
# and the rounds suite's real part (engine tau and speedups on HumanEval/100-131).
set -u
cp /tmp/e3new/model.safetensors /tmp/e3new/specpilot_drafter.json sglang_specpilot/drafters/smollm2_eagle3/
for p in mtbench humaneval:100-163; do
  timeout 200 python -m sglang_specpilot.cli tau --model /tmp/smol.gguf --draft sglang_specpilot/drafters/smollm2_eagle3 \
    --prompts "$p" --new-tokens 128 --depth 6 --top-k 8 --budgets 32,64 2>&1 | grep -v Warn | tail -1 | tee "$OUT/tau_${p%%:*}.json"
done
timeout 170 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 \
  --results-dir $OUT/rounds 2>&1 | grep -v Warn | tail -4
