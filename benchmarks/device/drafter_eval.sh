# One device call after drafter_train.sh (/tmp/e3new): the new drafter replaces the shipped one in the
# device's tree, then its replay tau on MT-Bench turn 1 (evaluation only) and held-out HumanEval/100-163,
# and the rounds suite's real part (engine tau and speedups on HumanEval/100-131). On the H100 (dbe3a40) the
# HumanEval replay took 132 s and MT-Bench's ran past 200 s, so MT-Bench gets 330 s, and --out keeps the
# prompts replayed so far if it is cut.
set -u
cp /tmp/e3new/model.safetensors /tmp/e3new/specpilot_drafter.json sglang_specpilot/drafters/smollm2_eagle3/
for p in mtbench:330 humaneval:100-163:170; do
  name=${p%:*}; timeout "${p##*:}" python -m sglang_specpilot.cli tau --model /tmp/smol.gguf --prompts "$name" \
    --draft sglang_specpilot/drafters/smollm2_eagle3 --new-tokens 128 --depth 6 --top-k 8 --budgets 32,64 \
    --out "$OUT/tau_${name%%:*}.json" 2>&1 | grep "^\[tau" | tail -1
done
timeout 170 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 \
  --results-dir $OUT/rounds 2>&1 | grep -v Warn | tail -4
