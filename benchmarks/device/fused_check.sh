# One device call (after the GGUF's three parts have come): the fused decode kernels on the real SmolLM2.
# 1. Tokens: greedy AR with every fusion off (SPECPILOT_FUSED_DECODE=0), then on, judged against the first by
#    token forcing (benchmarks/probes/ar_tokens.py).
# 2. A/B of the captured AR round (round_profile, a row parked at 300 cached tokens), separate processes,
#    alternated, two runs each: all on; all off; rope + cache kernel off (SPECPILOT_FUSED_ROPE=0); norm
#    prologues and o residual off (SPECPILOT_FUSED_NORM=0). Summary in $OUT/fused_ab.json (a call brings back
#    at most 8 files, so the per-run profiles stay in /tmp).
set -u
T=/tmp/ab; mkdir -p $T
SPECPILOT_FUSED_DECODE=0 python benchmarks/probes/ar_tokens.py --model /tmp/smol.gguf --out $OUT/tokens_off.json 2>&1 | tail -1
python benchmarks/probes/ar_tokens.py --model /tmp/smol.gguf --out $OUT/tokens_on.json --against $OUT/tokens_off.json 2>&1 | tail -2
for rep in 1 2; do
  for v in on off rope0 norm0; do
    case $v in
      on) E=SPECPILOT_FUSED_DECODE=1 ;; off) E=SPECPILOT_FUSED_DECODE=0 ;;
      rope0) E=SPECPILOT_FUSED_ROPE=0 ;; norm0) E=SPECPILOT_FUSED_NORM=0 ;;
    esac
    env $E python benchmarks/probes/round_profile.py --target smollm2 --model /tmp/smol.gguf --context 300 \
      --systems ar --out $T/smol_${v}_r$rep.json 2>&1 | tail -1
  done
done
python - <<'PY'
import glob, json, os, statistics
runs = {}
for f in sorted(glob.glob("/tmp/ab/smol_*.json")):
    v = os.path.basename(f).split("_")[1]
    r = json.load(open(f))["systems"]["ar"]
    runs.setdefault(v, []).append({k: r[k] for k in ("round_ms_median", "kernels", "kernel_us", "by_category_us")}
                                  | {"round_ms": r["round_ms"]})
out = {"model": "SmolLM2-135M-Instruct (real weights)", "context": 300, "commit": os.environ.get("SPECPILOT_COMMIT"),
       "runs": runs}
out["median_round_ms"] = {v: statistics.median(x["round_ms_median"] for x in rs) for v, rs in runs.items()}
out["kernels"] = {v: rs[0]["kernels"] for v, rs in runs.items()}
json.dump(out, open(os.path.join(os.environ["OUT"], "fused_ab.json"), "w"), indent=1)
print({v: round(m, 4) for v, m in out["median_round_ms"].items()}, out["kernels"])
PY
