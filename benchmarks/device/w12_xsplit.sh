# The W12 tensor-core GEMM's pre-split activation path (gemm_tc.split_x, X_SPLIT) against its default path,
# at the verify row counts, on the 8B's projections; no GGUF needed.
#   bash benchmarks/device/w12_xsplit.sh
# Every swept config runs both ways (":xs" labels), and the launcher's tile both ways (w12_xs0 / w12_xs1).
# If X_SPLIT wins, turn it on (gemm_tc.X_SPLIT_DEFAULT) from the per-M geomeans it prints.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the repo root: the device has no editable install
python -m pytest -q -m gpu tests/test_w12_tc.py 2>&1 | tail -2
SPECPILOT_W12_X_SPLIT=0 timeout 420 python benchmarks/w12_gemm.py --models llama-3.1-8b --ms 1,16,32,64 \
  --sweep-ms 16,32,64 --rotate-mb 400 --blocks 6 --inner 2 --no-cuda-kernel --results-dir $OUT/w12 2>&1 \
  | grep -v -E "pdl\.py|return PDL|This call originates" | tail -30
python - <<'PY'
import json, os, glob
for p in glob.glob(os.environ["OUT"] + "/w12/*.json"):
    d = json.load(open(p))
    m = d.get("metrics", {})
    print(p, {k: v for k, v in m.items() if "xsplit" in k or "geomean" in k})
PY
