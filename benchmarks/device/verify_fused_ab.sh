# One device call (after the GGUF's three parts have come): the fused verify layer (kernels/skinny_gemm.py's
# SwiGLU and residual epilogues, models/linear.py) on the real SmolLM2.
# 1. A/B of captured AR, chain (gamma 6) and tree (32, depth 6, top-k 8) rounds, a row parked at 300 cached
#    tokens, separate processes, alternated, two runs each: SPECPILOT_VERIFY_GEMM=0 (cuBLAS and the unfused
#    silu_mul and adds, as before) against the default. Summary in $OUT/verify_fused_ab.json.
# 2. The rounds suite's real part at the default (tokens/s, speedups, mismatches against AR) in $OUT/rounds.
# 0. The verify GEMM's GPU tests and its per-projection probe (benchmarks/probes/verify_layer_probe.py).
set -u
python -m pytest -q tests/test_skinny_gemm.py 2>&1 | tail -2
python benchmarks/probes/verify_layer_probe.py --out $OUT/verify_layer_probe.json 2>&1 | tail -8
T=/tmp/vab; mkdir -p $T
for rep in 1 2; do
  for v in auto 0; do
    SPECPILOT_VERIFY_GEMM=$v timeout 240 python benchmarks/probes/round_profile.py --target smollm2 \
      --model /tmp/smol.gguf --context 300 --systems ar,chain6,tree32d6 --out $T/smol_${v}_r$rep.json 2>&1 | tail -1
  done
done
python - <<'PY'
import glob, json, os, statistics
runs = {}
for f in sorted(glob.glob("/tmp/vab/smol_*.json")):
    v = os.path.basename(f).split("_")[1]
    for name, r in json.load(open(f))["systems"].items():
        runs.setdefault(v, {}).setdefault(name, []).append(
            {k: r[k] for k in ("round_ms_median", "kernels", "kernel_us", "by_category_us", "round_ms")})
out = {"model": "SmolLM2-135M-Instruct (real weights)", "context": 300, "commit": os.environ.get("SPECPILOT_COMMIT"),
       "runs": runs}
out["median_round_ms"] = {v: {n: statistics.median(x["round_ms_median"] for x in rs) for n, rs in s.items()}
                          for v, s in runs.items()}
out["kernels"] = {v: {n: rs[0]["kernels"] for n, rs in s.items()} for v, s in runs.items()}
json.dump(out, open(os.path.join(os.environ["OUT"], "verify_fused_ab.json"), "w"), indent=1)
print(out["median_round_ms"], out["kernels"])
PY
timeout 330 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -25
