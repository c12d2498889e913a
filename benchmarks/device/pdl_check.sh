# One device call (after the GGUF's three parts have come): an A/B of programmatic dependent launch
# (SPECPILOT_PDL=1 vs 0, separate processes) on the real SmolLM2's captured AR round (round_profile, a row
# parked at 300 cached tokens), summary in $OUT/pdl_ab.json; then the rounds suite's SmolLM2 part.
set -u
T=/tmp/pdl; mkdir -p $T
for v in 1 0; do
  SPECPILOT_PDL=$v python benchmarks/probes/round_profile.py --target smollm2 --model /tmp/smol.gguf --context 300 \
    --systems ar --out $T/pdl$v.json 2>&1 | tail -1
done
python - <<'PY'
import json, os
out = {"model": "SmolLM2-135M-Instruct (real weights)", "context": 300, "commit": os.environ.get("SPECPILOT_COMMIT")}
for v in ("1", "0"):
    r = json.load(open(f"/tmp/pdl/pdl{v}.json"))["systems"]["ar"]
    out[f"pdl{v}"] = {k: r[k] for k in ("round_ms", "round_ms_median", "kernels", "kernel_us", "span_us", "by_category_us")}
json.dump(out, open(os.path.join(os.environ["OUT"], "pdl_ab.json"), "w"), indent=1)
print("round ms: pdl on", round(out["pdl1"]["round_ms_median"], 4), "off", round(out["pdl0"]["round_ms_median"], 4))
PY
python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -2
