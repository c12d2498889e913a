# The tune suite (issue 17) in three device calls on one warm machine, after the GGUF's three parts:
#   bash benchmarks/device/tune_runs.sh A   # lifted 8B: cold (cost model) + manual      (call 3, with .carry/g3)
#   bash benchmarks/device/tune_runs.sh B   # lifted 8B: ablation; real SmolLM2: cold
#   bash benchmarks/device/tune_runs.sh C   # real SmolLM2: memory from the 8B's store (another model), manual
#   bash benchmarks/device/tune_runs.sh D   # real SmolLM2 alone (fresh folder): cold + manual, then the backend's
#                                           # per-engine generation summaries (rounds, ms a round, TTFT, cudaMallocs)
# Work folders live in /tmp (kept while the machine stays warm), so each call reads the earlier parts back;
# every call writes the suite's results file and a tarball of the work folders' records under $OUT.
set -u
stage=${1:?stage A, B, C or D}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H100*) manual=benchmarks/results/e2e_h100.json ;; *) manual=benchmarks/results/e2e_h200.json ;; esac
echo "gpu: $gpu; hand-picked from $manual"
common=(--model /tmp/smol.gguf --budget-minutes 4 --rounds 3 --candidates 6)
tune() { timeout 575 python -m sglang_specpilot.cli bench tune "$@" 2>&1 | grep -v -E "pdl\.py|return PDL|This call originates" | tail -30; }
case "$stage" in
A) tune "${common[@]}" --work /tmp/tw8 --parts cold,manual --manual-from "$manual" --deadline-s 430 \
     --results-dir $OUT/tune8 ;;
B) tune "${common[@]}" --work /tmp/tw8 --parts cold,manual,ablation --manual-from "$manual" --deadline-s 60 \
     --results-dir $OUT/tune8
   tune "${common[@]}" --budget-minutes 3 --target smollm2 --work /tmp/tws --parts cold --deadline-s 300 \
     --results-dir $OUT/tunes ;;
C) tune "${common[@]}" --budget-minutes 3 --target smollm2 --work /tmp/tws --parts cold,memory,manual \
     --memory-from /tmp/tw8/memory --manual 32,6,8 --deadline-s 400 --results-dir $OUT/tunes ;;
D) tune "${common[@]}" --budget-minutes 3 --target smollm2 --work /tmp/tws2 --parts cold,manual --manual 32,6,8 \
     --deadline-s 300 --results-dir $OUT/tunes2
   python3 - <<'PY'
import json, pathlib
for f in ("/tmp/tws2/cold/summary.json", "/tmp/tws2/manual.json"):
    p = pathlib.Path(f)
    if p.exists():
        print(f)
        for k, v in json.loads(p.read_text()).get("generations", {}).items():
            print(f"  {k[:60]:60s} {v}")
PY
   ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
# The runs' records (state, profile, summary, report, memory entries), without the large timing logs.
tar czf $OUT/tune_work_$stage.tgz --exclude='*.log' -C /tmp $(cd /tmp && ls -d tw8 tws tws2 2>/dev/null) 2>/dev/null
ls -la $OUT/*.tgz
