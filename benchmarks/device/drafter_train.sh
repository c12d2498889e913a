# One device call after drafter_answers.sh (its files still in /tmp): the shipped EAGLE-3 drafter trained
# further on them (held-out split and its eval inside train-drafter), saved to /tmp/e3new and returned in
# 15 MB parts (a returned file holds at most 16 MiB): cat $OUT/e3new.part* > model.safetensors.
set -u
SECS=${SECS:-420}
timeout $((SECS + 130)) python -m sglang_specpilot.cli train-drafter --kind eagle3 --model /tmp/smol.gguf \
  --answers-in /tmp/ag_o.pt,/tmp/ag_c.pt,/tmp/as_c.pt --init sglang_specpilot/drafters/smollm2_eagle3 \
  --lr 2e-4 --train-seconds "$SECS" --out /tmp/e3new > "$OUT/train.log" 2>&1
grep -v Warn "$OUT/train.log" | grep -v "^step" | tail -4 | cut -c1-1500
grep "^step" "$OUT/train.log" | awk 'NR % 400 == 1' | cut -c1-200
cp /tmp/e3new/specpilot_drafter.json "$OUT/" && split -b 15000000 -d /tmp/e3new/model.safetensors "$OUT/e3new.part"
md5sum /tmp/e3new/model.safetensors
