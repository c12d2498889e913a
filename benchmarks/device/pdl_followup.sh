# The checks this session's PDL and fused kernels still owe (run after the GGUF's three parts have come):
# the co-located (two-stream) and tree-engine GPU tests with PDL on (the default), then an A/B of PDL on the
# lifted 8B stand-in's AR, chain and tree rounds (SPECPILOT_PDL=1 vs 0, separate processes), summary in
# $OUT/pdl_lifted8b_ab.json.
set -u
python -m pytest -q -m gpu tests/test_colocate_gpu.py tests/test_tree_engine.py 2>&1 | tail -3
T=/tmp/pdl8b; mkdir -p $T
for v in 1 0; do
  SPECPILOT_PDL=$v python benchmarks/probes/round_profile.py --model /tmp/smol.gguf --systems ar,chain5,tree32d6 \
    --out $T/pdl$v.json 2>&1 | tail -4
done
python - <<'PY'
import json, os
out = {"model": "SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)", "commit": os.environ.get("SPECPILOT_COMMIT")}
for v in ("1", "0"):
    systems = json.load(open(f"/tmp/pdl8b/pdl{v}.json"))["systems"]
    out[f"pdl{v}"] = {n: {k: r[k] for k in ("round_ms", "round_ms_median", "kernels", "span_us")} for n, r in systems.items()}
json.dump(out, open(os.path.join(os.environ["OUT"], "pdl_lifted8b_ab.json"), "w"), indent=1)
print({n: round(out["pdl1"][n]["round_ms_median"] / out["pdl0"][n]["round_ms_median"], 3) for n in out["pdl1"]})
PY
