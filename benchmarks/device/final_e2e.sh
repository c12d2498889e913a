# The e2e suite at batch 1 with the defaults (lifted 8B stand-in + EAGLE-3 drafter: AR, stock chains, trees;
# W12 skipped), in $OUT/e2e. Run right after final_check.sh, while /tmp/smol.gguf is still there.
set -u
timeout 230 python -m sglang_specpilot.cli bench e2e --model /tmp/smol.gguf --batches 1 --skip-w12 \
  --tune-budget-s 100 --deadline-s 200 --results-dir $OUT/e2e 2>&1 | grep -v Warn | tail -14
