# One device call (after the GGUF's three parts have come): the tree round's bookkeeping kernels
# (SPECPILOT_TREE_KERNELS=1: kernels/lattice_step.py, tree_build.py, tree_accept.py) on the H200.
# 0. Their GPU tests: the kernel cases natively, and a captured, compiled tree round with them equal to one without.
# 1. A/B of captured AR, chain (gamma 6) and tree (32, depth 6, top-k 8) rounds on the real SmolLM2, a row parked at 300 cached
#    tokens, separate processes, alternated, two runs each: SPECPILOT_TREE_KERNELS=1 against 0 (the default).
#    Summary in $OUT/tree_kernels_ab.json.
# 2. The rounds suite's real part with the kernels on, in $OUT/rounds (tokens/s, speedups, mismatches vs AR): the
#    figures to commit if the A/B says to make them the default.
set -u
python -m pytest -q tests/test_lattice_step.py tests/test_tree_build.py tests/test_tree_accept.py 2>&1 | tail -3
T=/tmp/tkab; mkdir -p $T
for rep in 1 2; do
  for v in 1 0; do
    SPECPILOT_TREE_KERNELS=$v timeout 240 python benchmarks/probes/round_profile.py --target smollm2 \
      --model /tmp/smol.gguf --context 300 --systems ar,chain6,tree32d6 --out $T/smol_${v}_r$rep.json 2>&1 | tail -1
  done
done
python - <<'PY'
import glob, json, os, statistics
runs = {}
for f in sorted(glob.glob("/tmp/tkab/smol_*.json")):
    v = os.path.basename(f).split("_")[1]
    for name, r in json.load(open(f))["systems"].items():
        runs.setdefault(v, {}).setdefault(name, []).append(
            {k: r[k] for k in ("round_ms_median", "kernels", "kernel_us", "by_category_us", "round_ms")})
out = {"suite": "tree_kernels_ab", "model": "SmolLM2-135M-Instruct (real weights)", "context": 300,
       "commit": os.environ.get("SPECPILOT_COMMIT"), "gpu": "NVIDIA H200", "runs": runs,
       "command": "bash benchmarks/device/tree_kernels_ab.sh"}
out["median_round_ms"] = {v: {n: statistics.median(x["round_ms_median"] for x in rs) for n, rs in s.items()}
                          for v, s in runs.items()}
out["kernels"] = {v: {n: rs[0]["kernels"] for n, rs in s.items()} for v, s in runs.items()}
json.dump(out, open(os.path.join(os.environ["OUT"], "tree_kernels_ab.json"), "w"), indent=1)
print(out["median_round_ms"], out["kernels"])
PY
SPECPILOT_TREE_KERNELS=1 timeout 330 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf \
  --gamma 6 --results-dir $OUT/rounds 2>&1 | tail -25
