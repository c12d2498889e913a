# One device call (after the GGUF's three parts have come): the target's answers for the next EAGLE-3
# drafter, kept in /tmp for drafter_train.sh and copied to $OUT (each file under the 16 MiB a returned file
# may have): greedy answers to HumanEval 0-99 + the offline set (16,230 prompts) and to the chat set
# (drafters/chat_prompts.py, 8,694 prompts the shipped drafter never saw), sampled ones (T 0.8) to the chat set.
set -u
ans() {  # file, prompt sets, answer kind, seconds
  timeout "$4" python -m sglang_specpilot.cli train-drafter --kind eagle3 --model /tmp/smol.gguf --prompts "$2" \
    --answers "$3" --answers-out "/tmp/$1.pt" --answers-only 2>&1 | grep -v Warn | tail -2 | cut -c1-400
  cp "/tmp/$1.pt" "$OUT/" && ls -la "/tmp/$1.pt"
}
ans ag_o humaneval,offline greedy 230
ans ag_c chat greedy 140
ans as_c chat sampled 170
